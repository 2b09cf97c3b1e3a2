"""dtlaunch as a user installs it: ``python -m build``'s wheel in a fresh venv.

:func:`build_wheel_venv` copies the package sources out of the working tree, runs
``python -m build`` on the copy (the sdist, then the wheel built from that sdist, each in
an isolated build env as a user's build does; that needs only setuptools from the
package index), and installs the wheel, plain and without extras (so without torch),
into a fresh venv. tests/test_wheel.py checks what the wheel installed (the entry point,
the man pages); tests/test_no_torch.py runs jobs with it.

The venv is made ``--without-pip`` and filled by this venv's pip (``pip --python``):
``ensurepip`` and the older pip it bundles cost about 6 s and twice the CPU of the
install itself, and the venv needs no pip of its own.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, fields
from pathlib import Path

from tests.jobs import REPO

# Installed as a .pth hook in the fresh venv: when DTLAUNCH_TEST_PROBE_DIR is set, every
# Python process of a job records its modules, and every attempt to import torch or
# tensorflow (even one a try/except would hide), in <dir>/<pid>.json at exit. Used by
# tests/test_no_torch.py; without the variable it does nothing.
PROBE_ENV = "DTLAUNCH_TEST_PROBE_DIR"
_PROBE = """\
import atexit
import json
import os
import sys

_DIR = os.environ.get("DTLAUNCH_TEST_PROBE_DIR")


class _Recorder:
    def __init__(self):
        self.attempted = []

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("torch", "tensorflow"):
            self.attempted.append(name)
        return None


def _dump(recorder):
    dtlaunch = sys.modules.get("dtlaunch")
    record = {
        "argv": sys.argv,
        "orig_argv": getattr(sys, "orig_argv", []),
        "modules": sorted(sys.modules),
        "attempted": recorder.attempted,
        "dtlaunch_file": getattr(dtlaunch, "__file__", None),
    }
    with open(os.path.join(_DIR, f"{os.getpid()}.json"), "w") as f:
        json.dump(record, f)


if _DIR:
    _recorder = _Recorder()
    sys.meta_path.insert(0, _recorder)
    atexit.register(_dump, _recorder)
"""


@dataclass(frozen=True)
class WheelVenv:
    """A fresh venv with dtlaunch installed from ``wheel`` (built from ``sdist``)."""

    root: Path
    site_packages: Path
    wheel: Path
    sdist: Path

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    @property
    def dtlaunch(self) -> Path:
        return self.root / "bin" / "dtlaunch"

    @property
    def man(self) -> Path:
        """Where the wheel's man pages land: ``<venv>/share/man``."""
        return self.root / "share" / "man"

    def encode(self) -> dict[str, str]:
        """As JSON, for the other test worker (see tests/once.py)."""
        return {f.name: str(getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def decode(cls, data: dict[str, str]) -> WheelVenv:
        return cls(**{f.name: Path(data[f.name]) for f in fields(cls)})


def copy_sources(dest: Path) -> Path:
    """What the build reads of the repository (the package, the man pages, the project
    files), so that building writes no build/ or egg-info into the working tree (and
    picks up no stale build/lib files)."""
    dest.mkdir()
    for name in ("pyproject.toml", "README.md", "setup.py", "setup.cfg", "MANIFEST.in"):
        if (REPO / name).exists():
            shutil.copy2(REPO / name, dest / name)
    for path in REPO.glob("LICEN[CS]E*"):
        shutil.copy2(path, dest / path.name)
    ignore = shutil.ignore_patterns("__pycache__")
    for tree in ("dtlaunch", "man"):
        shutil.copytree(REPO / tree, dest / tree, ignore=ignore)
    return dest


def clean_env(**extra: str) -> dict[str, str]:
    """The caller's environment without anything that points at the dev venv or a job."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("DTLAUNCH_") and k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")
    }
    env.update(PYTHONUNBUFFERED="1", COLUMNS="200", **extra)
    return env


def _run(argv: list[str], what: str, timeout: float) -> None:
    result = subprocess.run(
        argv, env=clean_env(), capture_output=True, text=True, timeout=timeout, check=False
    )
    assert result.returncode == 0, f"{what} failed:\n{result.stdout}\n{result.stderr}"


def _only(folder: Path, pattern: str) -> Path:
    found = sorted(folder.glob(pattern))
    assert len(found) == 1, (pattern, sorted(p.name for p in folder.iterdir()))
    return found[0]


def build_wheel_venv(base: Path) -> WheelVenv:
    """Build the sdist and wheel from a copy of the sources under ``base`` and install the
    wheel into the fresh venv ``base/venv``."""
    started = time.monotonic()
    src, dist, root = copy_sources(base / "src"), base / "dist", base / "venv"
    _run([sys.executable, "-m", "build", "--outdir", str(dist), str(src)], "python -m build", 300)
    wheel = _only(dist, "*.whl")
    sdist = _only(dist, "*.tar.gz")
    built = time.monotonic()
    _run([sys.executable, "-m", "venv", "--without-pip", str(root)], "python -m venv", 120)
    # --no-compile: byte-compiling every dependency costs more than the jobs need.
    pip = [sys.executable, "-m", "pip", "--python", str(root / "bin" / "python")]
    _run([*pip, "install", "-q", "--no-compile", str(wheel)], "pip install (the wheel)", 540)
    site_packages = Path(
        subprocess.check_output(
            [
                str(root / "bin" / "python"),
                "-c",
                "import sysconfig; print(sysconfig.get_path('purelib'))",
            ],
            text=True,
        ).strip()
    )
    (site_packages / "_dtlaunch_import_probe.py").write_text(_PROBE)
    (site_packages / "_dtlaunch_import_probe.pth").write_text("import _dtlaunch_import_probe\n")
    done = time.monotonic()
    print(
        f"wheel venv: built the sdist and wheel in {built - started:.1f}s, "
        f"installed in {done - built:.1f}s ({done - started:.1f}s)"
    )
    return WheelVenv(root=root, site_packages=site_packages, wheel=wheel, sdist=sdist)

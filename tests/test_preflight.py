"""`dtlaunch check` pre-flight against the real sshd of the `sshd` fixture."""

from __future__ import annotations

import asyncio
import io
import os
import socket
import subprocess
import sys

import psutil
import pytest
from rich.console import Console

import dtlaunch
from dtlaunch.agent.limits import LimitEnforcer
from dtlaunch.errors import ConfigError
from dtlaunch.hostfile import HostSpec
from dtlaunch.preflight import (
    CHECKS,
    OK,
    SKIPPED,
    UNVERIFIED,
    HostCheck,
    check_hosts,
    render_checks,
)
from tests.sshd import _keygen

pytestmark = pytest.mark.integration

VERSION = dtlaunch.__version__


def host(address="127.0.0.1", **kwargs):
    return HostSpec(label=kwargs.pop("label", address), hostname=address, **kwargs)


def check(hosts, opts, workdir, **kwargs):
    kwargs.setdefault("python", sys.executable)
    kwargs.setdefault("expected_version", VERSION)
    return asyncio.run(check_hosts(hosts, opts, workdir=str(workdir), **kwargs))


def closed_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def assert_failed_at(result: HostCheck, stage: str) -> str:
    """The result failed at `stage`: earlier stages ok, later ones skipped; returns its cell."""
    assert not result.ok
    assert result.fix
    at = CHECKS.index(stage)
    assert all(result.items[name] == OK for name in CHECKS[:at]), result.items
    assert all(result.items[name] == SKIPPED for name in CHECKS[at + 1 :]), result.items
    assert result.items[stage] not in (OK, SKIPPED)
    return result.items[stage]


def test_good_hosts_pass_every_check(sshd, tmp_path):
    hosts = [host(a) for a in sshd.addresses]
    results = check(hosts, sshd.options(), tmp_path, ports_needed=3)
    assert [r.host for r in results] == sshd.addresses
    # The limits column says how the agent there would enforce limits (this machine's own).
    support = LimitEnforcer.detect(dry_run=True).support
    limits = (
        support.memory
        if support.memory == support.cpu
        else f"mem {support.memory}, cpu {support.cpu}"
    )
    cgroups = support.memory.startswith("cgroup") and support.cpu.startswith("cgroup")
    # The capacity column: this machine's CPUs and memory (all "hosts" are this one).
    gib = psutil.virtual_memory().total / (1 << 30)
    capacity = f"{len(os.sched_getaffinity(0))} cpu, {gib:.1f}G"
    for result in results:
        assert result == HostCheck(
            host=result.host,
            ok=True,
            items={**dict.fromkeys(CHECKS, OK), "capacity": capacity, "limits": limits},
            fix="" if cgroups else f"limits: {support.detail}",
            version=VERSION,
        )


def test_a_host_declaring_more_memory_or_cpus_than_it_has_fails_its_capacity_check(sshd, tmp_path):
    a, b, c = sshd.addresses
    declared = [host(a, memory_bytes=1 << 50), host(b, cpus=4096.0), host(c, cpus=1.0)]
    over_mem, over_cpus, fine = check(declared, sshd.options(), tmp_path)
    assert assert_failed_at(over_mem, "capacity").startswith("declares more: mem=1024.0 TiB")
    assert "lower cpus=/mem= on that line" in over_mem.fix
    assert assert_failed_at(over_cpus, "capacity").startswith("declares more: cpus=4096 but")
    assert fine.ok and fine.items["capacity"].endswith("G")


def test_wrong_port_fails_ssh_and_leaves_other_hosts_alone(sshd, tmp_path):
    port = closed_port()
    bad, good = check(
        [host("127.0.0.2", port=port, label="bad"), host("127.0.0.3")], sshd.options(), tmp_path
    )
    assert assert_failed_at(bad, "ssh") == f"refused (port {port})"
    assert f"port {port}" in bad.fix
    assert good.ok


def test_unknown_host_key_fails_the_host_key_check(sshd, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    config = sshd.write_client_config(tmp_path / "cfg", known_hosts=empty)
    [result] = check([host("127.0.0.2")], sshd.options(config_paths=(config,)), tmp_path)
    assert assert_failed_at(result, "host key") == "unknown (not in known_hosts)"
    assert f"ssh-keyscan -p {sshd.port} 127.0.0.2 >> {empty}" in result.fix


def test_changed_host_key_fails_and_opt_out_passes_with_warning_cell(sshd, tmp_path):
    _keygen(tmp_path / "impostor", "impostor")
    kind, blob = (tmp_path / "impostor.pub").read_text().split()[:2]
    changed = tmp_path / "known_hosts"
    changed.write_text(f"[127.0.0.1]:{sshd.port} {kind} {blob}\n")
    [result] = check([host()], sshd.options(known_hosts=changed), tmp_path)
    assert assert_failed_at(result, "host key").startswith("CHANGED")
    assert "ssh-keygen -f" in result.fix
    [unverified] = check(
        [host()], sshd.options(known_hosts=changed, verify_host_keys=False), tmp_path
    )
    assert unverified.ok
    assert unverified.items["host key"] == UNVERIFIED


def test_unauthorized_key_fails_ssh_with_user_and_fix(sshd, tmp_path):
    _keygen(tmp_path / "stranger", "stranger")
    config = sshd.write_client_config(tmp_path / "cfg", identity_file=tmp_path / "stranger")
    [result] = check([host("127.0.0.3")], sshd.options(config_paths=(config,)), tmp_path)
    assert result.items["host key"] == OK  # verified during key exchange, before auth
    assert result.items["ssh"] == "auth failed (user root)"
    assert all(result.items[name] == SKIPPED for name in CHECKS[2:])
    assert f"ssh-copy-id -p {sshd.port} root@127.0.0.3" in result.fix


def test_bad_user_from_hostfile_fails_ssh(sshd, tmp_path):
    [result] = check([host(user="dtlaunch-nobody")], sshd.options(), tmp_path)
    assert result.items["ssh"] == "auth failed (user dtlaunch-nobody)"


def test_missing_python_fails_the_python_check(sshd, tmp_path):
    missing = str(tmp_path / "no" / "python3")
    [result] = check([host()], sshd.options(), tmp_path, python=missing)
    assert assert_failed_at(result, "python") == f"not found: {missing}"
    assert "--python" in result.fix


def test_python_without_dtlaunch_fails_the_dtlaunch_check(sshd, tmp_path):
    venv = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    [result] = check([host()], sshd.options(), tmp_path, python=str(venv / "bin" / "python"))
    assert assert_failed_at(result, "dtlaunch").startswith("not importable (ModuleNotFoundError")
    assert f"pip install dtlaunch=={VERSION}" in result.fix


def test_version_mismatch_fails_the_dtlaunch_check(sshd, tmp_path):
    [result] = check([host()], sshd.options(), tmp_path, expected_version="9.9.9")
    assert assert_failed_at(result, "dtlaunch") == f"version {VERSION} != 9.9.9 here"
    assert "pip install dtlaunch==9.9.9" in result.fix
    assert result.version == VERSION


def test_missing_workdir_fails_the_workdir_check(sshd, tmp_path):
    missing = tmp_path / "not-there"
    [result] = check([host("127.0.0.2")], sshd.options(), missing)
    assert assert_failed_at(result, "workdir") == f"missing: {missing}"
    assert f"mkdir -p {missing}" in result.fix


def test_file_as_workdir_is_not_a_directory(sshd, tmp_path):
    afile = tmp_path / "file"
    afile.write_text("")
    [result] = check([host()], sshd.options(), afile)
    assert assert_failed_at(result, "workdir") == f"not a directory: {afile}"


def test_check_budget_bounds_a_silent_host(sshd, tmp_path):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)  # TCP connects, SSH never answers
        port = listener.getsockname()[1]
        [result] = check([host(port=port)], sshd.options(), tmp_path, timeout=0.5)
    assert assert_failed_at(result, "ssh") == "timed out after 0.5 s"


def test_arguments_are_validated(sshd, tmp_path):
    with pytest.raises(ConfigError, match="ports_needed"):
        check([host()], sshd.options(), tmp_path, ports_needed=-1)
    with pytest.raises(ConfigError, match="--python is empty"):
        check([host()], sshd.options(), tmp_path, python=" ")


def test_render_checks_shows_one_row_per_host_with_status_and_fix():
    good = HostCheck(host="n1", ok=True, items=dict.fromkeys(CHECKS, OK), fix="", version="1")
    items = dict.fromkeys(CHECKS, SKIPPED) | {"ssh": "refused (port 2222)"}
    bad = HostCheck(host="n2", ok=False, items=items, fix="start sshd on n2", version="")
    out = io.StringIO()
    Console(file=out, width=220, color_system=None).print(render_checks([good, bad]))
    text = out.getvalue()
    assert "1 of 2 hosts OK" in text
    header = next(line for line in text.splitlines() if "host key" in line)
    assert [name in header for name in ("host", *CHECKS, "status", "fix")] == [True] * 11
    row1 = next(line for line in text.splitlines() if " n1 " in line)
    row2 = next(line for line in text.splitlines() if " n2 " in line)
    assert row1.count("ok") == len(CHECKS)
    assert "OK" in row1
    assert "refused (port 2222)" in row2
    assert "FAIL" in row2
    assert "start sshd on n2" in row2
    assert row2.count("skipped") == len(CHECKS) - 1


def test_render_checks_at_80_columns_gives_each_host_an_entry_with_its_fix_readable():
    """In a narrow terminal the fix is not folded into a strip of a few letters."""
    items = dict.fromkeys(CHECKS, SKIPPED) | {"ssh": "refused (port 2222)"}
    fix = (
        "check that sshd runs on n2 and listens on port 2222 (set the port as host:PORT "
        "in the hostfile or Port in ~/.ssh/config)"
    )
    bad = HostCheck(host="n2", ok=False, items=items, fix=fix, version="")
    out = io.StringIO()
    Console(file=out, width=80, color_system=None).print(render_checks([bad]))
    lines = out.getvalue().splitlines()
    assert all(len(line) <= 80 for line in lines), lines
    assert lines[1].startswith("n2: ssh refused (port 2222), host key skipped")
    assert "status FAIL" in out.getvalue()
    assert any(
        line.startswith("  check that sshd runs on n2 and listens on port 2222") for line in lines
    )

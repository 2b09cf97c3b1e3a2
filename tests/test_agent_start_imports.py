"""What an agent's start imports: every host of a launch pays for it, and on
many loopback hosts sharing two cores the launch waits for the sum (issue 18)."""

from __future__ import annotations

import subprocess
import sys

from dtlaunch.supervisor.launcher import _PROBE_MARK, _PROBE_THEN_AGENT

# Modules an agent never uses at start: ssl (asyncio offers TLS transports; the
# agent speaks CURVE), hmac and hashlib (the ROUTER's ZAP check, the
# supervisor's), shutil with bz2 and lzma (a PATH lookup, a stall's py-spy).
KEPT_OUT = ("ssl", "hmac", "hashlib", "shutil", "bz2", "lzma", "uuid")


def test_the_agent_s_process_loads_its_modules_without_the_ones_it_does_not_need(tmp_path):
    # The probe itself, as sshd runs it; an empty stdin (no bootstrap line) ends
    # it after the agent's imports, and the appended line says what was loaded.
    code = _PROBE_THEN_AGENT + (
        f"print('LOADED', sorted(m for m in {KEPT_OUT!r} if sys.modules.get(m)))\n"
        "print('AGENT', 'dtlaunch.agent.agent' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)],
        input="", capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    lines = out.stdout.splitlines()
    assert lines[0].startswith(_PROBE_MARK) and '"workdir_ok": true' in lines[0], out.stdout
    assert lines[1:] == ["LOADED []", "AGENT True"], out.stdout + out.stderr

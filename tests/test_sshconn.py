"""dtlaunch.sshconn against the real OpenSSH sshd of the `sshd` fixture."""

from __future__ import annotations

import asyncio
import logging
import socket
import subprocess
import sys

import pytest

from dtlaunch.errors import ConfigError, SshError
from dtlaunch.hostfile import HostSpec
from dtlaunch.sshconn import (
    ENV_SSH_CONFIG,
    ENV_SSH_KNOWN_HOSTS,
    SshConnectError,
    SshFailure,
    SshOptions,
    connect,
    remote_command,
    run_remote,
    ssh_options_from_env,
)
from tests.sshd import _keygen

pytestmark = pytest.mark.integration


def host(address="127.0.0.1", **kwargs):
    return HostSpec(label=kwargs.pop("label", address), hostname=address, **kwargs)


def run_on(spec, opts, argv, **kwargs):
    async def main():
        async with await connect(spec, opts) as conn:
            return await run_remote(conn, argv, timeout=kwargs.pop("timeout", 10.0), **kwargs)

    return asyncio.run(main())


def connect_error(spec, opts) -> SshConnectError:
    async def main():
        conn = await connect(spec, opts)
        conn.close()
        await conn.wait_closed()

    with pytest.raises(SshConnectError) as info:
        asyncio.run(main())
    return info.value


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_fixture_serves_all_three_addresses_through_its_ssh_config(sshd):
    assert sshd.addresses == ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
    for address in sshd.addresses:
        status, out, err = run_on(host(address), sshd.options(), ["echo", "hi there", "$HOME;"])
        assert (status, out, err) == (0, "hi there $HOME;\n", "")


def test_fixture_config_works_for_the_openssh_client_too(sshd):
    done = subprocess.run(
        ["ssh", "-F", str(sshd.ssh_config), "127.0.0.2", "id", "-un"],
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    assert (done.returncode, done.stdout) == (0, "root\n"), done.stderr


def test_remote_python_is_the_venv_interpreter(sshd):
    status, out, _ = run_on(
        host("127.0.0.3"),
        sshd.options(),
        [sys.executable, "-c", "import dtlaunch, sys; print(dtlaunch.__version__, sys.prefix)"],
    )
    assert status == 0
    assert out.split()[0] == __import__("dtlaunch").__version__
    assert out.split()[1] == sys.prefix


def test_run_remote_returns_status_stderr_and_feeds_input(sshd):
    code = "import sys; print(sys.stdin.read().upper()); sys.stderr.write('e'); sys.exit(3)"
    status, out, err = run_on(
        host(), sshd.options(), [sys.executable, "-c", code], input="abc 'q' $x"
    )
    assert (status, out, err) == (3, "ABC 'Q' $X\n", "e")


def test_run_remote_without_input_gives_eof(sshd):
    # `cat` would hang if stdin were left open.
    assert run_on(host(), sshd.options(), ["cat"], timeout=5) == (0, "", "")


def test_run_remote_reports_signals_as_negative_status(sshd):
    status, _, _ = run_on(host(), sshd.options(), ["sh", "-c", "kill -TERM $$"])
    assert status == -15


def test_run_remote_timeout_raises_ssh_error(sshd):
    # Writes until its output pipe closes (SIGPIPE), so it cannot outlive the test for long:
    # sshd refuses signal requests in root sessions, and these tests log in as root.
    ticker = "import time\nfor _ in range(200): print('.', flush=True); time.sleep(0.05)"
    with pytest.raises(SshError, match=r"did not finish within 0.5 s"):
        run_on(host(), sshd.options(), [sys.executable, "-c", ticker], timeout=0.5)


def test_remote_command_quotes_every_argument():
    assert remote_command(["echo", "a b", "$(x)"]) == "echo 'a b' '$(x)'"
    with pytest.raises(ValueError, match="empty"):
        remote_command([])


def test_hostfile_port_wins_over_ssh_config(sshd, tmp_path):
    config = sshd.write_client_config(tmp_path / "cfg", port=closed_port())
    opts = sshd.options(config_paths=(config,))
    assert connect_error(host(), opts).kind is SshFailure.REFUSED
    assert run_on(host(port=sshd.port), opts, ["true"])[0] == 0


def test_wrong_port_is_refused_with_port_fix(sshd):
    port = closed_port()
    err = connect_error(host(port=port), sshd.options())
    assert err.kind is SshFailure.REFUSED
    assert "refused" in err.problem
    assert f"port {port}" in err.fix
    assert str(err).startswith("127.0.0.1: connection refused by root@127.0.0.1:")


def test_silent_port_times_out(sshd):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)  # the kernel completes the TCP handshake; no SSH banner ever comes
        port = listener.getsockname()[1]
        err = connect_error(host(port=port), sshd.options(connect_timeout=0.5))
    assert err.kind is SshFailure.TIMEOUT
    assert "within 0.5 s" in err.problem


def test_non_ssh_server_is_a_protocol_error(sshd):
    async def main():
        async def answer(reader, writer):
            writer.write(b"HTTP/1.1 400 Bad Request\r\n\r\n")
            await writer.drain()
            writer.close()
            await writer.wait_closed()

        server = await asyncio.start_server(answer, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            with pytest.raises(SshConnectError) as info:
                await connect(host(port=port), sshd.options())
        finally:
            server.close()
            await server.wait_closed()
        return info.value

    err = asyncio.run(main())
    assert err.kind in (SshFailure.PROTOCOL, SshFailure.DISCONNECTED)
    assert "SSH" in err.problem


def test_unknown_host_key_is_refused_with_keyscan_fix(sshd, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    opts = sshd.options(
        config_paths=(sshd.write_client_config(tmp_path / "cfg", known_hosts=empty),)
    )
    err = connect_error(host("127.0.0.2"), opts)
    assert err.kind is SshFailure.HOST_KEY_UNKNOWN
    assert "not known" in err.problem
    assert f"ssh-keyscan -p {sshd.port} 127.0.0.2 >> {empty}" in err.fix


def test_missing_known_hosts_file_means_unknown_not_unverified(sshd, tmp_path):
    missing = tmp_path / "nope" / "known_hosts"
    opts = sshd.options(
        config_paths=(sshd.write_client_config(tmp_path / "c", known_hosts=missing),)
    )
    err = connect_error(host(), opts)
    assert err.kind is SshFailure.HOST_KEY_UNKNOWN
    assert f">> {missing}" in err.fix


def test_known_hosts_none_in_config_does_not_disable_verification(sshd, tmp_path):
    config = tmp_path / "cfg"
    config.write_text(
        sshd.ssh_config.read_text().replace(
            f"UserKnownHostsFile {sshd.known_hosts}", "UserKnownHostsFile none"
        )
    )
    assert "UserKnownHostsFile none" in config.read_text()
    err = connect_error(host(), sshd.options(config_paths=(config,)))
    assert err.kind is SshFailure.HOST_KEY_UNKNOWN


def changed_known_hosts(sshd, tmp_path):
    _keygen(tmp_path / "other_host_key", "impostor")
    other = (tmp_path / "other_host_key.pub").read_text().split()
    path = tmp_path / "known_hosts_changed"
    path.write_text("".join(f"[{a}]:{sshd.port} {other[0]} {other[1]}\n" for a in sshd.addresses))
    return path


def test_changed_host_key_is_refused_when_verifying(sshd, tmp_path):
    changed = changed_known_hosts(sshd, tmp_path)
    err = connect_error(host(), sshd.options(known_hosts=changed))
    assert err.kind is SshFailure.HOST_KEY_CHANGED
    assert "does NOT match" in err.problem
    assert f"ssh-keygen -f {changed} -R '[127.0.0.1]:{sshd.port}'" in err.fix


def test_options_known_hosts_overrides_the_config(sshd, tmp_path):
    # The config's known_hosts is right; the explicit one is wrong and must be the one used.
    changed = changed_known_hosts(sshd, tmp_path)
    assert connect_error(host(), sshd.options(known_hosts=changed)).kind.is_host_key
    good = sshd.options(
        known_hosts=sshd.known_hosts,
        config_paths=(sshd.write_client_config(tmp_path / "cfg", known_hosts=changed),),
    )
    assert run_on(host(), good, ["true"])[0] == 0


def test_opt_out_connects_to_changed_key_with_loud_warning(sshd, tmp_path, caplog):
    changed = changed_known_hosts(sshd, tmp_path)
    opts = sshd.options(known_hosts=changed, verify_host_keys=False)
    with caplog.at_level(logging.WARNING, logger="dtlaunch.sshconn"):
        assert run_on(host(), opts, ["true"])[0] == 0
    warnings = [r for r in caplog.records if r.name == "dtlaunch.sshconn"]
    assert warnings
    assert warnings[0].levelno == logging.WARNING
    assert "HOST KEY VERIFICATION IS OFF" in warnings[0].getMessage()


def test_unauthorized_key_fails_authentication_with_fix(sshd, tmp_path):
    _keygen(tmp_path / "stranger", "stranger")
    config = sshd.write_client_config(tmp_path / "cfg", identity_file=tmp_path / "stranger")
    err = connect_error(host("127.0.0.3"), sshd.options(config_paths=(config,)))
    assert err.kind is SshFailure.AUTH
    assert "authentication failed for user 'root'" in err.problem
    assert str(tmp_path / "stranger") in err.problem
    assert f"ssh-copy-id -p {sshd.port} root@127.0.0.3" in err.fix


def test_hostfile_user_wins_over_ssh_config(sshd):
    err = connect_error(host(user="dtlaunch-no-such-user"), sshd.options())
    assert err.kind is SshFailure.AUTH
    assert "user 'dtlaunch-no-such-user'" in err.problem


def test_missing_config_file_is_a_config_error(sshd, tmp_path):
    err = connect_error(host(), SshOptions(config_paths=(tmp_path / "nope",)))
    assert err.kind is SshFailure.CONFIG
    assert str(tmp_path / "nope") in err.problem


def test_dns_failure_is_classified():
    # Unit level on purpose: a real lookup would query the machine's DNS server.
    from dtlaunch.sshconn import _Target, _transport_error

    target = _Target(label="n1", hostname="n1.example", port=22, user="u", identities=())
    err = _transport_error(target, SshOptions(), socket.gaierror(-2, "Name or service not known"))
    assert err.kind is SshFailure.DNS
    assert "cannot resolve host name 'n1.example'" in err.problem


def test_ssh_options_from_env(tmp_path):
    a, b, kh = tmp_path / "a", tmp_path / "b", tmp_path / "kh"
    for path in (a, b, kh):
        path.write_text("")
    opts = ssh_options_from_env(
        {ENV_SSH_CONFIG: f"{a}:{b}", ENV_SSH_KNOWN_HOSTS: str(kh)}, verify_host_keys=False
    )
    assert opts == SshOptions(config_paths=(a, b), known_hosts=kh, verify_host_keys=False)
    assert ssh_options_from_env({}) == SshOptions()
    with pytest.raises(ConfigError, match=r"DTLAUNCH_SSH_CONFIG names .*nope"):
        ssh_options_from_env({ENV_SSH_CONFIG: str(tmp_path / "nope")})
    with pytest.raises(ConfigError, match="timeout"):
        SshOptions(connect_timeout=0)


def test_missing_identity_file_is_a_client_key_error(sshd, tmp_path):
    missing = tmp_path / "no_such_key"
    config = sshd.write_client_config(tmp_path / "cfg", identity_file=missing)
    err = connect_error(host(), sshd.options(config_paths=(config,)))
    assert err.kind is SshFailure.CLIENT_KEY
    assert f"{missing}, named by the ssh config" in err.problem
    assert f"ssh-keygen -f {missing}" in err.fix


def test_default_known_hosts_is_the_users(sshd, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    config = tmp_path / "cfg"
    config.write_text(
        sshd.ssh_config.read_text().replace(f"UserKnownHostsFile {sshd.known_hosts}\n", "")
    )
    assert "UserKnownHostsFile" not in config.read_text()
    opts = sshd.options(config_paths=(config,))
    err = connect_error(host(), opts)
    assert err.kind is SshFailure.HOST_KEY_UNKNOWN
    assert f">> {tmp_path}/.ssh/known_hosts`" in err.fix
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "known_hosts").write_text(sshd.host_key_line("127.0.0.1") + "\n")
    assert run_on(host(), opts, ["true"])[0] == 0

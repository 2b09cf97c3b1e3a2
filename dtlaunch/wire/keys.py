"""Per-run CURVE keys and their files.

Every run makes two keypairs: the supervisor's ROUTER (``server``) and one shared
by every peer of the run (``client``: agents, workers, servers, control clients).
The ROUTER accepts only that client public key, so a peer of another run, or
anyone without the run's key directory, cannot connect.

Files use the ZeroMQ certificate format (``zmq.auth.load_certificate`` reads
them), mode 0600 in a 0700 directory:

* supervisor, ``runs/<id>/keys/``: ``server.key_secret``, ``client.key_secret``
* a peer's host (``write_peer_keys``): ``client.key_secret`` and ``server.key``
  (the server's public key only)

Secrets are never logged, never shown by ``repr`` and never passed in argv.
"""

from __future__ import annotations

import contextlib
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

import zmq

from dtlaunch.errors import KeyFileError

__all__ = [
    "KeyPair",
    "PeerKeys",
    "RunKeys",
    "create_run_keys",
    "discard_run_keys",
    "load_peer_keys",
    "load_run_keys",
    "run_keys_exist",
    "write_peer_keys",
]

SERVER_SECRET_FILE = "server.key_secret"
CLIENT_SECRET_FILE = "client.key_secret"
SERVER_PUBLIC_FILE = "server.key"

_Z85_KEY_LEN = 40
_Z85_ALPHABET = frozenset(
    b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
)
_SECRET_BANNER = (
    "#   ZeroMQ CURVE **Secret** Certificate, written by dtlaunch\n"
    "#   DO NOT PROVIDE THIS FILE TO OTHER USERS nor change its permissions.\n\n"
)
_PUBLIC_BANNER = "#   ZeroMQ CURVE Public Certificate, written by dtlaunch\n\n"


@dataclass(frozen=True, slots=True)
class KeyPair:
    """A CURVE keypair, both keys Z85-encoded (40 bytes each)."""

    public: bytes
    secret: bytes = field(repr=False)

    def __post_init__(self) -> None:
        _check_z85("public key", self.public)
        _check_z85("secret key", self.secret)
        try:
            derived = zmq.curve_public(self.secret)
        except zmq.ZMQError:  # 40 Z85 characters can still overflow a 32-bit group
            raise KeyFileError(
                "CURVE secret key is not valid Z85; recreate the run's keys"
            ) from None
        if derived != self.public:
            raise KeyFileError(
                "the CURVE public key does not belong to the secret key; "
                "the key material was mixed up between runs: recreate or recopy it"
            )

    @classmethod
    def generate(cls) -> KeyPair:
        public, secret = zmq.curve_keypair()
        return cls(public=public, secret=secret)


@dataclass(frozen=True, slots=True)
class PeerKeys:
    """What a DEALER peer needs: the server's public key and the run's client pair."""

    server_public: bytes
    client: KeyPair

    def __post_init__(self) -> None:
        _check_z85("server public key", self.server_public)


@dataclass(frozen=True, slots=True)
class RunKeys:
    """All keys of one run, as the supervisor holds them."""

    server: KeyPair
    client: KeyPair

    def peer(self) -> PeerKeys:
        return PeerKeys(server_public=self.server.public, client=self.client)


# ------------------------------------------------------------------ run keys


def create_run_keys(keys_dir: Path) -> RunKeys:
    """Make a run's keys in ``keys_dir`` (created 0700; files 0600).

    Raises:
        KeyFileError: keys already exist there (they are never overwritten), or
            the directory cannot be made private.
    """
    _make_private_dir(keys_dir)
    existing = [
        keys_dir / name
        for name in (SERVER_SECRET_FILE, CLIENT_SECRET_FILE)
        if (keys_dir / name).exists()
    ]
    if existing:
        raise KeyFileError(
            f"{existing[0]} already exists; a run's keys are never overwritten. "
            "Load them with load_run_keys (dtlaunch run --resume), or use a new run directory"
        )
    keys = RunKeys(server=KeyPair.generate(), client=KeyPair.generate())
    _write_new(keys_dir / SERVER_SECRET_FILE, _cert_text(keys.server.public, keys.server.secret))
    _write_new(keys_dir / CLIENT_SECRET_FILE, _cert_text(keys.client.public, keys.client.secret))
    return keys


def run_keys_exist(keys_dir: Path) -> bool:
    """Whether ``create_run_keys`` wrote any key file in ``keys_dir``."""
    return any((keys_dir / name).exists() for name in (SERVER_SECRET_FILE, CLIENT_SECRET_FILE))


def discard_run_keys(keys_dir: Path) -> None:
    """Remove the key files ``create_run_keys`` writes, whole or not.

    Only for keys that were never handed out: a supervisor killed while writing
    them, before it bound its endpoint or started any agent.
    """
    for name in (SERVER_SECRET_FILE, CLIENT_SECRET_FILE):
        (keys_dir / name).unlink(missing_ok=True)


def load_run_keys(keys_dir: Path) -> RunKeys:
    """Read the keys ``create_run_keys`` wrote.

    Raises:
        KeyFileError: a file is missing, malformed, or readable by group/others.
    """
    return RunKeys(
        server=_load_pair(keys_dir / SERVER_SECRET_FILE),
        client=_load_pair(keys_dir / CLIENT_SECRET_FILE),
    )


# ----------------------------------------------------------------- peer keys


def write_peer_keys(keys_dir: Path, keys: PeerKeys) -> None:
    """Store what a peer needs on its host: client pair + server public key.

    Replaces earlier files atomically (an agent restarted for the same run
    rewrites the same keys), so readers never see a half-written file.

    Raises:
        KeyFileError: the directory cannot be made private or written.
    """
    _make_private_dir(keys_dir)
    _replace(keys_dir / CLIENT_SECRET_FILE, _cert_text(keys.client.public, keys.client.secret))
    _replace(keys_dir / SERVER_PUBLIC_FILE, _cert_text(keys.server_public, None))


def load_peer_keys(keys_dir: Path) -> PeerKeys:
    """Read the keys ``write_peer_keys`` wrote.

    Raises:
        KeyFileError: a file is missing, malformed, or readable by group/others.
    """
    server_public, _ = _read_cert(keys_dir / SERVER_PUBLIC_FILE, need_secret=False)
    return PeerKeys(server_public=server_public, client=_load_pair(keys_dir / CLIENT_SECRET_FILE))


# ------------------------------------------------------------------- helpers


def _check_z85(what: str, key: object) -> None:
    if type(key) is not bytes:
        raise KeyFileError(f"CURVE {what} must be Z85 bytes, got {type(key).__name__}")
    if len(key) != _Z85_KEY_LEN or not set(key) <= _Z85_ALPHABET:
        # Never echo the value: it may be a secret.
        raise KeyFileError(
            f"CURVE {what} is malformed (expected {_Z85_KEY_LEN} Z85 characters, "
            f"got {len(key)} bytes); recreate the run's keys"
        )


def _cert_text(public: bytes, secret: bytes | None) -> bytes:
    lines = [_SECRET_BANNER if secret else _PUBLIC_BANNER, "metadata\n", "curve\n"]
    lines.append(f'    public-key = "{public.decode("ascii")}"\n')
    if secret is not None:
        lines.append(f'    secret-key = "{secret.decode("ascii")}"\n')
    return "".join(lines).encode("ascii")


def _load_pair(path: Path) -> KeyPair:
    public, secret = _read_cert(path, need_secret=True)
    assert secret is not None
    try:
        return KeyPair(public=public, secret=secret)
    except KeyFileError as exc:
        raise KeyFileError(f"{path}: {exc}") from None


def _read_cert(path: Path, *, need_secret: bool) -> tuple[bytes, bytes | None]:
    """Parse a ZeroMQ certificate after checking it is private."""
    try:
        st = path.stat()
    except FileNotFoundError:
        raise KeyFileError(
            f"{path} is missing; the run's keys are incomplete. Recreate the run "
            "(its keys directory is made by create_run_keys) or recopy the keys"
        ) from None
    except OSError as exc:
        raise KeyFileError(f"cannot read {path}: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise KeyFileError(f"{path} is not a regular file")
    if st.st_mode & 0o077:
        raise KeyFileError(
            f"{path} is accessible by group or others (mode {stat.S_IMODE(st.st_mode):04o}); "
            f"CURVE keys must be private. Fix: chmod 600 {path}"
        )
    try:
        text = path.read_bytes()
    except OSError as exc:
        raise KeyFileError(f"cannot read {path}: {exc.strerror}") from None
    values: dict[bytes, bytes] = {}
    for raw in text.splitlines():
        line = raw.strip()
        for name in (b"public-key", b"secret-key"):
            if line.startswith(name) and b"=" in line:
                values[name] = line.split(b"=", 1)[1].strip(b" \t'\"")
    public = values.get(b"public-key")
    secret = values.get(b"secret-key")
    if public is None or (need_secret and secret is None):
        missing = "public-key" if public is None else "secret-key"
        raise KeyFileError(f"{path} is malformed: no {missing} line; recreate the run's keys")
    try:
        _check_z85("public key", public)
        if secret is not None:
            _check_z85("secret key", secret)
    except KeyFileError as exc:
        raise KeyFileError(f"{path}: {exc}") from None
    return public, secret


def _make_private_dir(path: Path) -> None:
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(path, 0o700)  # mkdir's mode is masked by umask; an existing dir keeps its own
    except OSError as exc:
        raise KeyFileError(
            f"cannot make the private key directory {path}: {exc.strerror}"
        ) from None


def _write_new(path: Path, data: bytes) -> None:
    """Create ``path`` 0600 from the start (no window where it is readable by others)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        raise KeyFileError(f"{path} already exists; a run's keys are never overwritten") from None
    except OSError as exc:
        raise KeyFileError(f"cannot create {path}: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        with contextlib.suppress(OSError):
            path.unlink()
        raise KeyFileError(f"cannot write {path}: {exc.strerror}") from None


def _replace(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    _write_new(tmp, data)
    try:
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise KeyFileError(f"cannot write {path}: {exc.strerror}") from None

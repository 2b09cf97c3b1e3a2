"""Every error dtlaunch raises on purpose, in one tree.

::

    DtlaunchError                 base; str() is a message for a person, with the fix
    ├── ConfigError               bad option, bad env var, bad job spec
    │   └── HostfileError         bad hostfile text; carries every problem found
    ├── WireError                 a frame that is not a valid message (dropped, logged)
    ├── KeyFileError              CURVE key files missing or with unsafe permissions
    ├── SshError                  a host cannot be reached, authenticated or verified
    │   └── SshConnectError       the same, saying which kind it was (``kind``: SshFailure)
    ├── HostCheckError            a ``dtlaunch check`` stage failed on a host (caught there)
    ├── LaunchError               an agent or process could not be started
    ├── JobFailed                 ``dtlaunch.launch``: the job ended failed (its ``summary``)
    ├── RunDirError               a run directory is missing, locked or malformed
    │   └── LockHeldError         another process holds a lock file (``holder``)
    ├── WalError                  the data-sharding write-ahead log cannot be used
    │   ├── WalCorruptError       damaged before its tail; names file, byte and the repair
    │   ├── WalTailLostError      its newest records are gone (a segment or every file)
    │   ├── WalVersionError       written in a format version this release does not read
    │   └── WalFsyncError         a write or fsync failed; the log accepts nothing more
    ├── DdsStateError             a shard-queue record or snapshot disagrees with the data set
    ├── PsError                   a parameter server refused a request or did not answer
    │   ├── ServerRestarted       a server restarted where the caller cannot resync
    │   └── PlacementChanged      blocks asked for were reassigned: follow the job's newer map
    └── InfeasibleError           batch balancing has no solution (also a ValueError)

Raises sites document which of these they raise under ``Raises:``. Each class is
also importable from the module that raises it (``dtlaunch.sshconn.SshConnectError``,
``dtlaunch.supervisor.wal.WalCorruptError``, ``dtlaunch.ps.PsError``, ...).

This module imports nothing of dtlaunch, not even lazily, and only the standard
library, so every layer, the pure ``dtlaunch.solvers`` included, may use it. What a
message needs from a layer above (the WAL's format version, a run directory) its
raiser passes in.
"""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pathlib import Path

__all__ = [
    "ConfigError",
    "DdsStateError",
    "DtlaunchError",
    "HostCheckError",
    "HostfileError",
    "InfeasibleError",
    "JobFailed",
    "KeyFileError",
    "LaunchError",
    "LockHeldError",
    "PlacementChanged",
    "PsError",
    "RunDirError",
    "ServerRestarted",
    "SshConnectError",
    "SshError",
    "SshFailure",
    "WalCorruptError",
    "WalError",
    "WalFsyncError",
    "WalTailLostError",
    "WalVersionError",
    "WireError",
]


class DtlaunchError(Exception):
    """Base class; ``str(err)`` is shown to the user as is."""


# ---------------------------------------------------------------- configuration


class ConfigError(DtlaunchError):
    """An option, environment variable or job file is invalid."""


class HostfileError(ConfigError):
    """A hostfile (or inline ``-H`` list) has one or more bad entries.

    ``problems`` holds one ``file:line:col: message`` string per problem, all of
    them, so a user fixes the file in one go.
    """

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


# ---------------------------------------------------------------- wire and keys


class WireError(DtlaunchError):
    """A received frame is not a valid message of this protocol."""


class KeyFileError(DtlaunchError):
    """CURVE key material is missing, malformed or readable by others."""


# ---------------------------------------------------------------- hosts


class SshError(DtlaunchError):
    """SSH connection, authentication or host-key verification failed."""

    def __init__(self, host: str, problem: str, fix: str) -> None:
        self.host = host
        self.problem = problem
        self.fix = fix
        super().__init__(f"{host}: {problem}. Fix: {fix}")


class SshFailure(StrEnum):
    """What went wrong while connecting; one value per distinct fix."""

    CONFIG = "ssh config"
    CLIENT_KEY = "client key"
    DNS = "dns"
    REFUSED = "refused"
    UNREACHABLE = "unreachable"
    TIMEOUT = "timeout"
    PROTOCOL = "protocol"
    HOST_KEY_UNKNOWN = "host key unknown"
    HOST_KEY_CHANGED = "host key changed"
    HOST_KEY_REVOKED = "host key revoked"
    AUTH = "auth"
    DISCONNECTED = "disconnected"

    @property
    def is_host_key(self) -> bool:
        return self in _HOST_KEY_FAILURES


_HOST_KEY_FAILURES = frozenset(
    {SshFailure.HOST_KEY_UNKNOWN, SshFailure.HOST_KEY_CHANGED, SshFailure.HOST_KEY_REVOKED}
)


class SshConnectError(SshError):
    """An :class:`SshError` that also says which kind of failure it was.

    Raised by :mod:`dtlaunch.sshconn` (which also exports :class:`SshFailure`).
    """

    def __init__(
        self,
        host: str,
        problem: str,
        fix: str,
        *,
        kind: SshFailure,
        user: str | None = None,
        port: int | None = None,
    ) -> None:
        self.kind = kind
        self.user = user  # the login user and port really used, when known
        self.port = port
        super().__init__(host, problem, fix)


class HostCheckError(DtlaunchError):
    """One stage of a host's pre-flight check failed (:mod:`dtlaunch.preflight`).

    Raised and caught inside the check of one host: ``problem`` goes in the failed
    column of the check table, ``fix`` under it.
    """

    def __init__(self, problem: str, fix: str) -> None:
        super().__init__(problem)
        self.problem = problem
        self.fix = fix


class LaunchError(DtlaunchError):
    """An agent or a training process could not be started."""


class JobFailed(DtlaunchError):
    """``dtlaunch.launch``'s job ended without succeeding.

    ``summary`` is the run's ``summary.json`` (its ``failures`` put the root cause
    first), ``run_dir`` where the logs and events are; the message names the root
    cause the way ``dtlaunch run``'s failure table does.
    """

    def __init__(self, message: str, summary: dict[str, Any], run_dir: Path) -> None:
        super().__init__(message)
        self.summary = summary
        self.run_dir = run_dir


# ---------------------------------------------------------------- run directory and WAL


class RunDirError(DtlaunchError):
    """A run directory is missing, locked by another supervisor, or malformed."""


class LockHeldError(RunDirError):
    """Raised by ``FileLayer.lock`` when another process holds the lock.

    ``holder`` is the owner text that process wrote in the lock file; the WAL turns
    this into a :class:`RunDirError` that says what to do.
    """

    def __init__(self, holder: str) -> None:
        self.holder = holder
        super().__init__(holder)


class WalError(DtlaunchError):
    """The write-ahead log of the data-sharding service cannot be read or written."""


class WalCorruptError(WalError):
    """The log is damaged before its tail; it is refused rather than half-read.

    ``run_dir`` is what the user passes to ``dtlaunch wal repair`` (the raiser knows
    the layout: ``dtlaunch.supervisor.wal.format.run_dir_of``).
    """

    def __init__(self, file: Path, offset: int, problem: str, *, run_dir: Path) -> None:
        self.file = file
        self.offset = offset
        self.problem = problem
        super().__init__(
            f"WAL file {file} is damaged at byte {offset}: {problem}. The log cannot be "
            f"trusted past that point, so it was not loaded. Run `dtlaunch wal repair "
            f"{run_dir}` to cut the log there (everything removed is kept "
            f"in a repair-* folder next to it), then resume."
        )


class WalTailLostError(WalError):
    """The log ends before a seq it once held (its high-water mark says so).

    Its newest segment, or every file, is gone: resuming would take the queue
    back to an older state, so it is refused until the files come back or
    ``dtlaunch wal repair`` accepts the loss.
    """

    def __init__(self, directory: Path, last_seq: int, reached: int, *, run_dir: Path) -> None:
        self.directory = directory
        self.last_seq = last_seq
        self.reached = reached
        gone = (
            "every record is gone (the directory is empty or missing)"
            if last_seq == 0
            else f"it ends at seq {last_seq}: its newest segment is missing"
        )
        super().__init__(
            f"the WAL in {directory} once held seq {reached}, but {gone}. Resuming would "
            f"take the shard queue back to that older state, and shards finished since "
            f"would be trained again. Put the missing files back if you have them; or run "
            f"`dtlaunch wal repair {run_dir}` to accept the loss, then resume."
        )


class WalVersionError(WalError):
    """A WAL file has a format version this dtlaunch does not read.

    ``supported`` is the one it reads (``dtlaunch.supervisor.wal.format.FORMAT_VERSION``).
    """

    def __init__(self, file: Path, version: int, *, supported: int) -> None:
        self.file = file
        self.version = version
        self.supported = supported
        super().__init__(
            f"{file} has WAL format version {version}, but this dtlaunch reads only "
            f"version {supported}: it was written by another dtlaunch release (or its "
            f"header is damaged). Resume it with the dtlaunch release that wrote it, or "
            f"start the job in a new --run-dir."
        )


class WalFsyncError(WalError):
    """Writing or fsyncing the WAL failed; the log accepts nothing more."""


class DdsStateError(DtlaunchError):
    """A shard-queue record or snapshot is malformed, or disagrees with the queue.

    Raised while recovering: the write-ahead log or snapshot belongs to another
    data set (different size, shard size, epochs or seed) or is corrupt.
    """


# ---------------------------------------------------------------- parameter servers


class PsError(DtlaunchError):
    """A parameter server refused a request or did not answer in time."""


class ServerRestarted(PsError):
    """A server answered from a new process where the caller cannot resync."""

    def __init__(self, server: int, incarnation: int) -> None:
        super().__init__(f"parameter server {server} restarted (incarnation {incarnation})")
        self.server = server
        self.incarnation = incarnation


class PlacementChanged(PsError):
    """Servers answered that blocks asked of them were reassigned (PSLD §5.2): the
    job's placement map ``version`` puts them elsewhere. ``servers`` (indices) are
    the servers that said so; the others' answers were taken as usual.
    ``dtlaunch.ps.Client`` follows the job's map and sends its requests again."""

    def __init__(self, version: int, servers: list[int]) -> None:
        super().__init__(
            f"parameter servers {servers} no longer hold blocks asked of them: they were "
            f"reassigned in placement map version {version}; follow the job's map from that "
            "version on"
        )
        self.version = version
        self.servers = servers


# ---------------------------------------------------------------- solvers


class InfeasibleError(DtlaunchError, ValueError):
    """A solver's problem (batch balancing, AntDT-DD, PSLD) has no solution or its
    inputs are invalid.

    Also a ``ValueError``, as it always was, for callers that catch that.
    """

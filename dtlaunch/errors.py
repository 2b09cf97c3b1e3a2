"""Every error dtlaunch raises on purpose, in one tree.

::

    DtlaunchError                 base; str() is a message for a person, with the fix
    ├── ConfigError               bad option, bad env var, bad job spec
    │   └── HostfileError         bad hostfile text; carries every problem found
    ├── WireError                 a frame that is not a valid message (dropped, logged)
    ├── KeyFileError              CURVE key files missing or with unsafe permissions
    ├── SshError                  a host cannot be reached, authenticated or verified
    ├── LaunchError               an agent or process could not be started
    └── RunDirError               a run directory is missing, locked or malformed

Raises sites document which of these they raise under ``Raises:``.
"""

from __future__ import annotations


class DtlaunchError(Exception):
    """Base class; ``str(err)`` is shown to the user as is."""


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


class WireError(DtlaunchError):
    """A received frame is not a valid message of this protocol."""


class KeyFileError(DtlaunchError):
    """CURVE key material is missing, malformed or readable by others."""


class SshError(DtlaunchError):
    """SSH connection, authentication or host-key verification failed."""

    def __init__(self, host: str, problem: str, fix: str) -> None:
        self.host = host
        self.problem = problem
        self.fix = fix
        super().__init__(f"{host}: {problem}. Fix: {fix}")


class LaunchError(DtlaunchError):
    """An agent or a training process could not be started."""


class RunDirError(DtlaunchError):
    """A run directory is missing, locked by another supervisor, or malformed."""

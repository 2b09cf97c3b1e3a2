"""The file operations the WAL uses, behind a small protocol a test can fake.

Keeping the WAL's I/O to this short list is what lets the crash test model a power
cut after any single operation: which bytes are durable (``fsync``), which names are
durable (``fsync_dir``), and what a torn write leaves behind.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import Protocol

from dtlaunch.errors import LockHeldError as LockHeldError  # defined with every error
from dtlaunch.errors import WalFsyncError as WalFsyncError

FileHandle = int


class FileLayer(Protocol):
    """Everything the WAL does to files. Paths are absolute or relative to the cwd."""

    def make_dir(self, path: Path) -> bool:
        """Create ``path`` (and parents) if missing; True when it was created."""
        ...

    def list_dir(self, path: Path) -> list[str]:
        """Names in ``path``."""
        ...

    def read(self, path: Path) -> bytes:
        """The whole file."""
        ...

    def size(self, path: Path) -> int: ...

    def create(self, path: Path) -> FileHandle:
        """An empty file at ``path`` (replacing any), open for appending."""
        ...

    def open_append(self, path: Path) -> FileHandle: ...

    def write(self, handle: FileHandle, data: bytes) -> None:
        """Append all of ``data``; not durable until :meth:`fsync`."""
        ...

    def truncate(self, handle: FileHandle, size: int) -> None: ...

    def fsync(self, handle: FileHandle) -> None:
        """Make the file's data durable. An OSError here is fatal to the WAL."""
        ...

    def close(self, handle: FileHandle) -> None: ...

    def fsync_dir(self, path: Path) -> None:
        """Make creations, renames and removals in directory ``path`` durable."""
        ...

    def rename(self, src: Path, dst: Path) -> None:
        """Atomically replace ``dst`` with ``src``."""
        ...

    def remove(self, path: Path) -> None: ...

    def lock(self, path: Path, owner: str) -> FileHandle:
        """Take an exclusive lock that dies with this process; write ``owner`` in the file.

        Raises:
            LockHeldError: another process holds it; carries the owner text it wrote.
        """
        ...

    def unlock(self, handle: FileHandle) -> None: ...


class RealFiles:
    """:class:`FileLayer` on the real file system with plain ``os`` calls."""

    def make_dir(self, path: Path) -> bool:
        if path.is_dir():
            return False
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        return True

    def list_dir(self, path: Path) -> list[str]:
        return os.listdir(path)

    def read(self, path: Path) -> bytes:
        with path.open("rb") as handle:
            return handle.read()

    def size(self, path: Path) -> int:
        return os.stat(path).st_size

    def create(self, path: Path) -> FileHandle:
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_CLOEXEC
        return os.open(path, flags, 0o600)

    def open_append(self, path: Path) -> FileHandle:
        return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)

    def write(self, handle: FileHandle, data: bytes) -> None:
        view = memoryview(data)
        while view:
            written = os.write(handle, view)
            view = view[written:]

    def truncate(self, handle: FileHandle, size: int) -> None:
        os.ftruncate(handle, size)

    def fsync(self, handle: FileHandle) -> None:
        os.fsync(handle)

    def close(self, handle: FileHandle) -> None:
        os.close(handle)

    def fsync_dir(self, path: Path) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def rename(self, src: Path, dst: Path) -> None:
        os.replace(src, dst)

    def remove(self, path: Path) -> None:
        os.unlink(path)

    def lock(self, path: Path, owner: str) -> FileHandle:
        # flock belongs to the open file description: it is freed when the process
        # dies, even by SIGKILL, and O_CLOEXEC keeps exec'd children from holding it.
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 256, 0).decode("utf-8", "replace").strip()
            os.close(fd)
            raise LockHeldError(holder or "a process that has not written its pid yet") from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, owner.encode() + b"\n", 0)
        return fd

    def unlock(self, handle: FileHandle) -> None:
        try:
            fcntl.flock(handle, fcntl.LOCK_UN)
        finally:
            os.close(handle)

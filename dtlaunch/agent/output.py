"""Pumps one child's stdout or stderr pipe into size- and line-bounded chunks."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable

CHUNK_BYTES = 32 * 1024
PARTIAL_LINE_FLUSH_S = 0.1
STDERR_TAIL_LINES = 40
TAIL_LINE_CHARS = 2000  # keeps an Exited message small whatever the child printed
_READ_BYTES = 64 * 1024

ChunkCallback = Callable[[bytes], Awaitable[None]]


def split_chunk(buf: bytearray, *, final: bool) -> bytes | None:
    """Take the next chunk off ``buf``: up to CHUNK_BYTES, ending at a newline if it can.

    A trailing partial line is only taken when ``final`` (time to flush) or when it
    alone fills a chunk.
    """
    if not buf:
        return None
    window = bytes(buf[:CHUNK_BYTES])
    cut = window.rfind(b"\n")
    if cut >= 0:
        end = cut + 1
    elif len(buf) >= CHUNK_BYTES or final:
        end = len(window)
    else:
        return None
    chunk = bytes(buf[:end])
    del buf[:end]
    return chunk


class LineTail:
    """The last lines of a byte stream, decoded leniently."""

    def __init__(self, max_lines: int = STDERR_TAIL_LINES) -> None:
        self._lines: collections.deque[str] = collections.deque(maxlen=max_lines)
        self._partial = b""

    def feed(self, data: bytes) -> None:
        pieces = (self._partial + data).split(b"\n")
        self._partial = pieces.pop()[:TAIL_LINE_CHARS]
        for piece in pieces[-(self._lines.maxlen or 0) :]:
            line = piece[:TAIL_LINE_CHARS].decode("utf-8", "replace").rstrip("\r")
            self._lines.append(line)

    def lines(self) -> list[str]:
        tail = list(self._lines)
        if self._partial:
            tail.append(self._partial.decode("utf-8", "replace"))
        return tail[-(self._lines.maxlen or 0) :]


async def pump(reader: asyncio.StreamReader, emit: ChunkCallback) -> None:
    """Read ``reader`` to EOF, calling ``emit`` with each chunk.

    Whole lines go out as soon as they arrive; a partial line waits at most
    PARTIAL_LINE_FLUSH_S for its end (so progress bars and prompts still show).
    """
    loop = asyncio.get_running_loop()
    buf = bytearray()
    partial_since: float | None = None
    eof = False
    while not eof:
        timeout = None
        if partial_since is not None:
            timeout = max(0.0, partial_since + PARTIAL_LINE_FLUSH_S - loop.time())
        try:
            # Cancelling a pending StreamReader.read loses no data, so the timeout is safe.
            data = await asyncio.wait_for(reader.read(_READ_BYTES), timeout)
        except TimeoutError:
            data = None
        if data == b"":
            eof = True
        elif data:
            buf += data
        flush_partial = eof or data is None
        while (chunk := split_chunk(buf, final=flush_partial)) is not None:
            await emit(chunk)
        if not buf:
            partial_since = None
        elif partial_since is None:
            partial_since = loop.time()

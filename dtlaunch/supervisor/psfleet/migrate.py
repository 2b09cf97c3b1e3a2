"""A whole server's live move (KILL_RESTART of a server, AntDT §VI-A with PSLD
§5.2's versioned migration), the part that talks to the two servers; blocking,
so the fleet runs it on a thread of its own (``fleet``).

The new process answers once it listens; the straggler exports every block with
its optimizer state at its next step boundary and from then on sends each
client that asks it to the new server (``moved_to``); the new server imports
them at that version, with the membership and BACKUP's b, before any push
counts. Training waits only from that boundary to the import.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from dtlaunch.ps.control import ServerControl
from dtlaunch.wire.keys import PeerKeys

__all__ = ["MOVE_TIMEOUT_S", "START_TIMEOUT_S", "Migrated", "migrate"]

START_TIMEOUT_S = 180.0  # a new server process: Python and torch on a busy host
MOVE_TIMEOUT_S = 600.0  # the straggler's next step boundary (as long as a BSP pull waits)


@dataclass(frozen=True, slots=True)
class Migrated:
    version: int  # the blocks' version at the move (the step boundary)
    pause_s: float  # from that boundary to the import: what the workers waited
    members: list[int]  # the workers a step waits for, handed over


def migrate(
    old_endpoint: str, new_endpoint: str, keys: PeerKeys, stop: threading.Event
) -> Migrated:
    """Move every block of the server at ``old_endpoint`` to the one at
    ``new_endpoint`` (see the module doc); ``stop`` gives the waits up.

    Raises:
        PsError: a server refused, or did not answer in time.
    """
    with (
        ServerControl(new_endpoint, keys, timeout=START_TIMEOUT_S, stop=stop) as new,
        ServerControl(old_endpoint, keys, timeout=MOVE_TIMEOUT_S, stop=stop) as old,
    ):
        new.stats()  # answers once the new process listens
        blocks = old.stats().blocks
        exported = old.export(blocks, remove=True, moved_to=new_endpoint)
        boundary = time.monotonic()
        # Membership and b travel with the blocks: set before any push counts.
        new.import_blocks(exported, with_members=True)
        return Migrated(
            version=exported.message.version,
            pause_s=time.monotonic() - boundary,
            members=exported.message.workers,
        )

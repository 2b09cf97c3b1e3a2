"""``python -m dtlaunch.ps``: one parameter-server process.

Configuration comes from the environment the agent gives every process
(``DTLAUNCH_KEYS``, ``DTLAUNCH_RANK``, ``DMLC_NUM_WORKER``) plus ``DTLAUNCH_PS_*``
variables; a command-line option overrides its variable::

    --keys DIR               DTLAUNCH_KEYS              the run's peer key folder (required)
    --rank N                 DTLAUNCH_RANK / DMLC_SERVER_ID / RANK
    --bind tcp://ADDR:PORT   DTLAUNCH_PS_BIND           default tcp://127.0.0.1:0
    --mode bsp|asp           DTLAUNCH_PS_MODE           default bsp
    --backup B               DTLAUNCH_PS_BACKUP         BACKUP_WORKERS b, default 0
    --workers 0,1,2          DTLAUNCH_PS_WORKERS        default 0..DMLC_NUM_WORKER-1
    --snapshot FILE          DTLAUNCH_PS_SNAPSHOT       blocks + optimizer state
    --snapshot-interval S    DTLAUNCH_PS_SNAPSHOT_INTERVAL  0: on request/shutdown only
    --restore FILE           DTLAUNCH_PS_RESTORE        start from a snapshot
    --endpoint-file FILE     DTLAUNCH_PS_ENDPOINT_FILE  the bound endpoint is written here

SIGTERM and SIGINT stop it after a final snapshot (when one is configured).
Exit codes: 0 stopped, 2 bad configuration.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Mapping, Sequence
from types import FrameType

from dtlaunch.errors import DtlaunchError
from dtlaunch.proctitle import name_this_process
from dtlaunch.ps.config import server_config
from dtlaunch.ps.server import PsServer
from dtlaunch.wire.keys import load_peer_keys

logger = logging.getLogger("dtlaunch.ps")


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dtlaunch.ps",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    for flag in (
        "--keys",
        "--rank",
        "--bind",
        "--mode",
        "--backup",
        "--workers",
        "--snapshot",
        "--snapshot-interval",
        "--restore",
        "--endpoint-file",
    ):
        parser.add_argument(flag)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s ps %(levelname)s %(name)s: %(message)s",
    )
    try:
        config, keys_dir = server_config(vars(args), os.environ if env is None else env)
        server = PsServer(config, load_peer_keys(keys_dir))
    except DtlaunchError as exc:
        print(f"dtlaunch.ps: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    server.serve(stop)
    return 0


if __name__ == "__main__":
    name_this_process(
        "server",
        os.environ.get("DTLAUNCH_RUN_ID", "?"),
        os.environ.get("DTLAUNCH_RANK", os.environ.get("DMLC_SERVER_ID", "")),
    )
    sys.exit(main())

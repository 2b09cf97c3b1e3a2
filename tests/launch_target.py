"""A function for ``dtlaunch.launch`` to run in every worker (tests/test_launch.py):
it must live at the top level of a module the workers can import."""

from __future__ import annotations

import json
import os
from pathlib import Path


def write_rank(out_dir: str, tag: dict[str, int]) -> None:
    """Leave ``<rank>.json`` with the arguments the worker was called with."""
    rank = os.environ["RANK"]
    Path(out_dir, f"{rank}.json").write_text(
        json.dumps({"rank": int(rank), "world": int(os.environ["WORLD_SIZE"]), "tag": tag})
    )

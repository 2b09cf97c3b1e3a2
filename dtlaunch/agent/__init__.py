"""The per-host agent: ``python -m dtlaunch.agent`` (see ``agent.run_agent``)."""

from __future__ import annotations

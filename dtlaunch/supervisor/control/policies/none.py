"""``none``: never acts (plain BSP/ASP); decisions are still logged as NONE."""

from __future__ import annotations

from dtlaunch.supervisor.control.actions import Action, NoAction
from dtlaunch.supervisor.control.monitor import MonitorSnapshot
from dtlaunch.supervisor.control.policies.base import ParamReader, read_windows, window_inputs


class NonePolicy:
    """Always ``NoAction``. Accepts ``l_trans``/``l_per``/``lambda`` for the Monitor."""

    name = "none"

    def __init__(self, params: dict[str, str] | None = None) -> None:
        reader = ParamReader(self.name, params or {})
        self.l_trans, self.l_per, self.lam = read_windows(reader)
        reader.finish()

    def decide(self, snap: MonitorSnapshot) -> list[Action]:
        return [NoAction(reason="policy none never acts", inputs=window_inputs(snap, self.lam))]

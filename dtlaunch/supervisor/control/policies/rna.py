"""``rna``: RNA's randomized non-blocking allreduce (RNA §3).

With ``--policy rna`` the workers train through ``dtlaunch.rna.Trainer``: their
gradients are averaged in rounds that start when the first of ``probes`` random
workers has one ready, and every worker joins each round with what it has,
without blocking its training. The rounds run in the supervisor's round
coordinator (``dtlaunch.supervisor.rna``) and in each worker's communication
thread; this policy holds their parameters and takes no Controller action.

Parameters:

- ``probes`` (2): workers probed per round (§3.2: the power of two choices;
  more probes cost messages and stopped paying in §8.4).
- ``staleness`` (8): a gradient computed on a model more than this many rounds
  older than the round that would use it is dropped (§3.3's bounded staleness).
- ``group_timeout`` (60 s): how long a group may take to form, and how long one
  collective may block before the group is formed again without the silent member.
- ``momentum`` (``auto``): ``auto`` fades an SGD momentum out in each round as
  its gradients' mean staleness nears one round, keeping the step ``lr / (1 -
  momentum)`` (``solvers.rna.momentum_for_staleness``; not in the paper: with
  momentum 0.9 and gradients 1-3 rounds old the model oscillated late in
  training and ended 3-4 accuracy points below BSP's); ``keep`` applies the
  optimizer's momentum as it is, as the paper does. What ``auto`` gives up is
  heavy-ball's speed-up where gradients are exact: a noise-free least-squares
  regression converges faster with ``keep``.
"""

from __future__ import annotations

from dtlaunch.solvers.rna import MOMENTUM_MODES
from dtlaunch.supervisor.control.actions import Action, NoAction
from dtlaunch.supervisor.control.monitor import MonitorSnapshot
from dtlaunch.supervisor.control.policies.base import ParamReader, read_windows

__all__ = ["RnaPolicy"]

DEFAULT_PROBES = 2
DEFAULT_STALENESS = 8
DEFAULT_GROUP_TIMEOUT_S = 60.0


class RnaPolicy:
    """See the module docstring."""

    def __init__(self, raw: dict[str, str] | None = None) -> None:
        params = ParamReader("rna", raw or {})
        self.name = "rna"
        self.l_trans, self.l_per, self.lam = read_windows(params)
        self.probes = params.integer("probes", DEFAULT_PROBES, low=1)
        self.staleness = params.integer("staleness", DEFAULT_STALENESS, low=0)
        self.group_timeout_s = params.number("group_timeout", DEFAULT_GROUP_TIMEOUT_S, low=1.0)
        self.momentum = params.choice("momentum", "auto", MOMENTUM_MODES)
        params.finish()

    def worker_env(self) -> dict[str, str]:
        """What every worker's ``dtlaunch.rna.Trainer`` reads (``DTLAUNCH_RNA``)."""
        return {"DTLAUNCH_RNA": f"staleness={self.staleness},momentum={self.momentum}"}

    def decide(self, snap: MonitorSnapshot) -> list[Action]:
        return [NoAction(reason="rna: the round coordinator averages without a barrier")]

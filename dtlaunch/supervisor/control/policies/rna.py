"""``rna``: RNA's randomized non-blocking allreduce (RNA §3) and its hierarchical
groups (§4).

With ``--policy rna`` the workers train through ``dtlaunch.rna.Trainer``: their
gradients are averaged in rounds that start when the first of ``probes`` random
workers has one ready, and every worker joins each round with what it has,
without blocking its training. The rounds run in the supervisor's round
coordinator (``dtlaunch.supervisor.rna``) and in each worker's communication
thread; this policy holds their parameters and decides the groups.

Hierarchical RNA (§4) needs a parameter server between the groups: run the job
with ``--servers 1`` (the built-in server holds the groups' shared model,
asynchronously). Then, from the workers' mean iteration times over the long
window, the policy splits them as the paper does (``solvers.rna.split_groups``:
while ``zeta``, slowest minus fastest, exceeds ``split`` times the mean ``v``,
the faster and the slower halves become groups of their own, recursively).
Each group runs RNA inside; every ``exchange_every`` of its rounds its
initiator exchanges the group's model with the server. A new partition is
asked for (``RNA_GROUPS``) only when the same one came out of
``confirm`` decisions in a row, and at most once every ``regroup_s`` seconds:
regrouping re-forms gloo groups (no process restarts), which is cheap but not
free.

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
- ``average`` (0.9): the model a worker ends with is an exponential moving
  average of the global model over its updates, this weight on the older ones
  (0.9: about the last ten), not the last update's model (0). Not in the
  paper: without a barrier the last rounds' gradient noise lands in the final
  model unsmoothed (its loss jumped +-0.05 from one round to the next late in
  training, BSP's +-0.015), and the final accuracy varied by 2 points between
  runs of the benchmark's mixed scenario, 0.8 points below BSP's on average.
  Every worker ends on the same average (it travels with the group's state).
  Under hierarchical RNA, once groups exchanged with the server, every worker
  ends on the server's final model instead.
- ``hierarchical`` (``auto``): ``auto`` splits the workers into groups when
  their iteration times call for it and the job has a parameter server;
  ``off`` keeps one group (the servers, if any, are then unused by RNA).
- ``split`` (1.0): split a group while ``zeta > split * v`` (the paper's rule
  is 1: the slowest worker takes twice the mean's time more than the fastest;
  lower values split milder spreads).
- ``min_group`` (2): no group smaller than this.
- ``exchange_every`` (1): a group's rounds between its exchanges with the
  parameter server. The paper exchanges every round; on the benchmark's
  mixed scenario every round ended 0.3 accuracy points above BSP and every
  fourth 0.56 below (one run each), at the same speed (an exchange of its
  small model took 2.5 ms).
- ``confirm`` (2), ``regroup_s`` (60 s): see above.
"""

from __future__ import annotations

from dtlaunch.errors import ConfigError
from dtlaunch.solvers.rna import MOMENTUM_MODES, split_groups
from dtlaunch.supervisor.control.actions import Action, NoAction, RnaGroups
from dtlaunch.supervisor.control.monitor import MonitorSnapshot
from dtlaunch.supervisor.control.policies.base import ParamReader, read_windows

__all__ = ["RnaPolicy"]

DEFAULT_PROBES = 2
DEFAULT_STALENESS = 8
DEFAULT_GROUP_TIMEOUT_S = 60.0
DEFAULT_AVERAGE = 0.9
HIERARCHICAL_MODES = ("auto", "off")
MIN_REPORTS = 5  # a worker's long window must hold this many steps to be grouped


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
        self.average = params.number("average", DEFAULT_AVERAGE, low=0.0)
        if self.average >= 1:
            raise ConfigError(
                f"policy rna: average must be a number in [0, 1), got {self.average:g} "
                "(0.9 averages about the last ten updates; 0 keeps the last model)"
            )
        self.hierarchical = params.choice("hierarchical", "auto", HIERARCHICAL_MODES) == "auto"
        self.split = params.number("split", 1.0, low=0.0, low_open=True)
        self.min_group = params.integer("min_group", 2, low=1)
        self.exchange_every = params.integer("exchange_every", 1, low=1)
        self.confirm = params.integer("confirm", 2, low=1)
        self.regroup_s = params.number("regroup_s", 60.0, low=0.0)
        params.finish()
        self.groups: list[list[int]] | None = None  # the partition asked for last
        self._groups_before: list[list[int]] | None = None  # in force before that ask
        self._candidate: list[list[int]] | None = None
        self._seen = 0  # decisions in a row that gave the candidate
        self._regrouped_at = float("-inf")

    def groups_refused(self) -> None:
        """The round service could not change the groups now (they were forming,
        or the data is ending): the ones before stay in force, and the next
        decisions may ask again."""
        self.groups, self._regrouped_at = self._groups_before, float("-inf")

    def worker_env(self) -> dict[str, str]:
        """What every worker's ``dtlaunch.rna.Trainer`` reads (``DTLAUNCH_RNA``)."""
        return {
            "DTLAUNCH_RNA": (
                f"staleness={self.staleness},momentum={self.momentum},average={self.average:g}"
            )
        }

    def decide(self, snap: MonitorSnapshot) -> list[Action]:
        quiet = "rna: the round coordinator averages without a barrier"
        if not self.hierarchical:
            return [NoAction(reason=quiet)]
        if snap.resources is not None and not snap.resources.servers:
            return [
                NoAction(
                    reason=f"{quiet}; one group: hierarchical groups exchange through a "
                    "parameter server and this job runs none (--servers 1)"
                )
            ]
        ranks = sorted(set(snap.workers) | set(snap.devices))
        times = {
            r: snap.worker_long[r].mean_bpt
            for r in ranks
            if r in snap.worker_long and snap.worker_long[r].reports >= MIN_REPORTS
        }
        if not ranks or len(times) < len(ranks):
            return [NoAction(reason=f"{quiet}; waiting for every worker's iteration times")]
        groups = [
            list(g) for g in split_groups(times, min_size=self.min_group, threshold=self.split)
        ]
        mean = sum(times.values()) / len(times)
        inputs = {
            "iteration_s": {r: round(t, 6) for r, t in times.items()},
            "zeta_s": round(max(times.values()) - min(times.values()), 6),
            "v_s": round(mean, 6),
            "split": self.split,
            "groups": groups,
        }
        current = self.groups if self.groups is not None else [ranks]
        if sorted(groups) == sorted(current):
            self._candidate, self._seen = None, 0
            return [NoAction(reason=f"rna: groups {current} stay", inputs=inputs)]
        if groups == self._candidate:
            self._seen += 1
        else:
            self._candidate, self._seen = groups, 1
        if self._seen < self.confirm:
            return [
                NoAction(
                    reason=f"rna: groups {groups} seen {self._seen} of {self.confirm} times",
                    inputs=inputs,
                )
            ]
        if snap.now - self._regrouped_at < self.regroup_s:
            return [
                NoAction(
                    reason=f"rna: groups {groups} wait; the last regroup was "
                    f"{snap.now - self._regrouped_at:.0f} s ago (regroup_s {self.regroup_s:g})",
                    inputs=inputs,
                )
            ]
        self._groups_before = self.groups
        self.groups, self._candidate, self._seen = groups, None, 0
        self._regrouped_at = snap.now
        zeta, v = inputs["zeta_s"], inputs["v_s"]
        return [
            RnaGroups(
                groups=groups,
                reason=(
                    f"rna: iteration times spread {zeta:.3f} s against a mean of {v:.3f} s "
                    f"(split above {self.split:g} x the mean): {len(groups)} group(s) "
                    f"{groups}, exchanging through the parameter server"
                ),
                inputs=inputs,
            )
        ]

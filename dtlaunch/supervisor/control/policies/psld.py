"""``psld``: PSLD's parameter-server load distribution (Chen et al., SoCC '20, §4).

Every interval, from the workers' recent exchanges with each server (the
Monitor's ``server_profile``: bytes and the server's service time per worker
step), the policy fits each server's ``Pred(s) = alpha * s + beta`` (§4.1,
``solvers.psld.fit_server``) and compares the servers' speeds at one common
size, the model's bytes over the number of servers. When the spread
``(best - worst) / worst`` exceeds ``threshold`` (1 in the paper), it forms the
superior set (Alg. 1) and places every block ε-greedily over it (Alg. 2-3),
then asks for the blocks to move (``REASSIGN_BLOCKS``), carried out live by
``psfleet.reassign`` at a step boundary.

Guards the paper leaves implicit, because a reassignment costs a pause:

* the speed spread says a straggler exists, not that the current map is bad:
  after a good reassignment the slow server is still slow per byte. So a new map
  is asked for only when its predicted step (the slowest server's predicted time)
  beats the map in force by more than ``margin`` (5 % by default);
* a new map must also repay its pause over the steps left in the data set:
  ``(step now - step new) x remaining_steps`` must exceed the last
  reassignment's measured pause (before one was measured,
  ``PRIOR_REASSIGN_COST_S``: 0.5 s, the most a pause may take for a 100 MB
  model on loopback; measured pauses are about 0.1 s). Near the end of
  the data a move gains nothing, and a worker whose data ended first has
  left and would not follow it. Unknown remaining steps (no data set) skip
  this guard: the job may run indefinitely;
* after each reassignment the policy waits ``settle`` seconds, so that the fits
  see the servers under their new loads before the next decision (otherwise a
  decision would rest on samples of the old loads alone);
* Alg. 1 keeps only the servers whose 90 % interval overlaps the best's. Over
  hundreds of samples the intervals narrow until a server 1 % slower (or one
  that merely holds fewer bytes: with one load per server the fit goes through
  the origin, and a fixed latency spread over fewer bytes looks slower per
  byte) is "confidently" slower and gets nothing from Alg. 2. So each interval
  is at least ``tolerance`` (10 %) of its mean wide on each side: differences
  of a few percent are a shared machine's noise, not a straggler.

A server that holds no block and has no sample in the long window (left out by
an earlier reassignment, or new) gets the others' mean fit as its prior (§5.1)
and counts as a changed server set, PSLD's other trigger: it is tried again,
and measured, when a map with it predicts a shorter step.

Blocks are placed largest first (Alg. 3 places them "in order"; largest first
lets the small ones even out the loads at the end). ``seed`` fixes the
exploration's coin, so ``replay --policy psld:...`` re-decides the same.
``assign=proportional`` is PSLD's strawman instead (§7.1): bytes in proportion
to each server's speed, every server used, no exploration. Parameters: ``eps
threshold theta0 theta1 margin tolerance settle min_samples seed assign``
besides the common ``l_trans l_per lambda``.
"""

from __future__ import annotations

import dataclasses
import math
import random
from typing import Any

from dtlaunch.errors import ConfigError, InfeasibleError
from dtlaunch.solvers.proportional import assign_proportional
from dtlaunch.solvers.psld import (
    CONFIDENCE_Z,
    EPSILON,
    TRIGGER_THRESHOLD,
    ServerFit,
    assign_blocks,
    fit_server,
    predicted_makespan,
    should_reassign,
    speed_variation,
    superior_servers,
)
from dtlaunch.supervisor.control.actions import Action, NoAction, ReassignBlocks
from dtlaunch.supervisor.control.monitor import MonitorSnapshot, PsLayout
from dtlaunch.supervisor.control.policies.base import ParamReader, read_windows

__all__ = ["PsldPolicy"]

DEFAULT_MARGIN = 0.05
DEFAULT_TOLERANCE = 0.1
DEFAULT_SETTLE_S = 10.0
DEFAULT_MIN_SAMPLES = 8
# A reassignment's pause before one was measured: the bound PSLD's live
# reassignment is held to (measured here: p50 ~0.11 s, max ~0.15 s).
PRIOR_REASSIGN_COST_S = 0.5


class PsldPolicy:
    """See the module docstring."""

    def __init__(self, raw: dict[str, str]) -> None:
        params = ParamReader("psld", raw)
        self.name = "psld"
        self.l_trans, self.l_per, self.lam = read_windows(params)
        self.epsilon = params.number("eps", EPSILON, low=0.0)
        if self.epsilon > 1:
            raise ConfigError(
                f"policy psld: eps must be a probability in [0, 1], got {self.epsilon}"
            )
        self.threshold = params.number("threshold", TRIGGER_THRESHOLD, low=0.0)
        self.theta0 = params.number("theta0", 1.0, low=0.0, low_open=True)
        self.theta1 = params.number("theta1", 1.0, low=0.0)
        self.margin = params.number("margin", DEFAULT_MARGIN, low=0.0)
        self.tolerance = params.number("tolerance", DEFAULT_TOLERANCE, low=0.0)
        self.settle_s = params.number("settle", DEFAULT_SETTLE_S, low=0.0)
        self.min_samples = params.integer("min_samples", DEFAULT_MIN_SAMPLES, low=2)
        self.seed = params.integer("seed", 0, low=0)
        self.assign = params.choice("assign", "psld", ("psld", "proportional"))
        params.finish()
        self._rng = random.Random(self.seed)
        self._settled_at = -math.inf  # no reassignment yet
        self._last_version = -1

    def decide(self, snap: MonitorSnapshot) -> list[Action]:
        layout = snap.ps_layout
        if layout is None:
            return [NoAction(reason="no parameter-server placement map yet")]
        if layout.version != self._last_version:
            if self._last_version >= 0:  # a reassignment completed: let the fits see it
                self._settled_at = snap.now + self.settle_s
            self._last_version = layout.version
        if snap.reassign_pending:
            return [NoAction(reason="a reassignment is being carried out")]
        if snap.now < self._settled_at:
            return [
                NoAction(
                    reason=f"settling after map version {layout.version} until "
                    f"{self._settled_at:.1f} s"
                )
            ]
        fitted = self._fits(snap, layout)
        if isinstance(fitted, str):
            return [NoAction(reason=fitted)]
        return [self._plan(snap, layout, *fitted)]

    # -------------------------------------------------------------- planning

    def _fits(
        self, snap: MonitorSnapshot, layout: PsLayout
    ) -> tuple[list[ServerFit], list[int]] | str:
        """Each server's fit and the servers that got a prior, or why not yet.

        A server that holds no block and has no recent sample (it was left out
        longer than the long window ago, or it is new) gets the others' mean fit
        as its prior (§5.1): it is tried again, and measured, if it pays.
        """
        held = layout.bytes_per_server()
        fits: dict[int, ServerFit] = {}
        unknown: list[int] = []
        for server in range(layout.servers):
            profile = snap.server_profile.get(server)
            if profile is None and held[server] == 0:
                unknown.append(server)
                continue
            if profile is None or len(profile.nbytes) < self.min_samples:
                have = 0 if profile is None else len(profile.nbytes)
                return f"server {server} has {have} of {self.min_samples} profile samples"
            # A step's exchange moves the blocks both ways (pull and push): a
            # sample's bytes are twice the bytes the server holds, the unit of
            # the block sizes the plan places.
            try:
                fits[server] = fit_server([b / 2 for b in profile.nbytes], list(profile.seconds))
            except InfeasibleError as err:
                return f"server {server}'s profile cannot be fitted yet: {err}"
        if not fits:
            return "no server has profile samples yet"
        prior = ServerFit(
            alpha=sum(f.alpha for f in fits.values()) / len(fits),
            beta=sum(f.beta for f in fits.values()) / len(fits),
        )
        return [fits.get(server, prior) for server in range(layout.servers)], unknown

    def _plan(
        self, snap: MonitorSnapshot, layout: PsLayout, fits: list[ServerFit], priors: list[int]
    ) -> Action:
        sizes = layout.block_bytes
        model_bytes = float(sum(sizes))
        probe = model_bytes / layout.servers
        speeds = [f.speed(probe) if probe > 0 else math.inf for f in fits]
        variation = speed_variation(speeds)
        inputs: dict[str, Any] = {
            "now": snap.now,
            "map_version": layout.version,
            "fits": {
                j: {"alpha": f.alpha, "beta": f.beta, "n": f.n, "sem": _finite(f.sem(probe))}
                for j, f in enumerate(fits)
            },
            "speeds": {j: _finite(s) for j, s in enumerate(speeds)},
            "variation": _finite(variation),
            "threshold": self.threshold,
            "bytes_per_server": layout.bytes_per_server(),
            "priors": priors,
        }
        # A server back in play (a prior) changes the server set, as one added does.
        if not should_reassign(speeds, threshold=self.threshold, server_set_changed=bool(priors)):
            return NoAction(
                reason=f"server speeds vary by {variation:.2f} <= threshold {self.threshold:g}",
                inputs=inputs,
            )
        if self.assign == "proportional":
            owner = list(assign_proportional(sizes, [v if v < math.inf else 0.0 for v in speeds]))
        else:
            owner = self._greedy(sizes, fits, probe, model_bytes, inputs)
        now_span = predicted_makespan(sizes, layout.owner, fits)
        new_span = predicted_makespan(sizes, owner, fits)
        moved = {
            i: [layout.owner[i], owner[i]] for i in range(len(sizes)) if owner[i] != layout.owner[i]
        }
        inputs.update(
            assign=self.assign,
            moved=moved,
            makespan_current_s=now_span,
            makespan_new_s=new_span,
            margin=self.margin,
        )
        if not moved or not new_span < now_span * (1.0 - self.margin):
            return NoAction(
                reason=f"speeds vary by {variation:.2f}, but the best map found predicts "
                f"{new_span:.4g} s per step against {now_span:.4g} s now "
                f"(margin {self.margin:.0%})",
                inputs=inputs,
            )
        cost_s = snap.reassign_cost_s
        cost_s = PRIOR_REASSIGN_COST_S if cost_s is None else cost_s
        left = snap.remaining_steps
        gain_s = (now_span - new_span) * left if left is not None else math.inf
        inputs.update(remaining_steps=left, gain_s=_finite(gain_s), reassign_cost_s=cost_s)
        if gain_s <= cost_s:
            return NoAction(
                reason=f"a new map would save {now_span - new_span:.4g} s a step, "
                f"{gain_s:.3g} s over the {left} steps left: not more than a "
                f"reassignment's pause ({cost_s:.3g} s)",
                inputs=inputs,
            )
        slowest = min(range(len(speeds)), key=lambda j: speeds[j])
        why = (
            f"server speeds vary by {variation:.2f} > {self.threshold:g} (slowest: server "
            f"{slowest})"
            if variation > self.threshold
            else f"server {', '.join(map(str, priors))} holds no block and has no recent "
            "sample: tried again with the others' mean speed"
        )
        return ReassignBlocks(
            owner=owner,
            from_version=layout.version,
            reason=f"{why}; moving {len(moved)} blocks: predicted step {now_span:.4g} s -> "
            f"{new_span:.4g} s",
            inputs=inputs,
        )

    def _greedy(
        self,
        sizes: tuple[int, ...],
        fits: list[ServerFit],
        probe: float,
        model_bytes: float,
        inputs: dict[str, Any],
    ) -> list[int]:
        """Alg. 1's superior set, then Alg. 2-3 over it, largest block first."""
        superior = superior_servers(
            [_noise_floor(f, probe, self.tolerance) for f in fits], model_bytes
        )
        order = sorted(range(len(sizes)), key=lambda i: (-sizes[i], i))
        assignment = assign_blocks(
            [sizes[i] for i in order],
            fits,
            superior.servers,
            rng=self._rng,
            epsilon=self.epsilon,
            theta0=self.theta0,
            theta1=self.theta1,
        )
        owner = [0] * len(sizes)
        for position, block in enumerate(order):
            owner[block] = assignment.servers[position]
        inputs.update(
            superior=list(superior.servers),
            superior_lower=[_finite(x) for x in superior.lower],
            superior_upper=[_finite(x) for x in superior.upper],
            scale_out=superior.scale_out,
            epsilon=self.epsilon,
            explored=len(assignment.explored),
        )
        return owner


def _noise_floor(fit: ServerFit, size: float, tolerance: float) -> ServerFit:
    """``fit`` with its interval at ``size`` at least ``tolerance`` of its mean
    wide on each side (see the module docstring)."""
    half = tolerance * fit.mean(size) / CONFIDENCE_Z
    return dataclasses.replace(fit, var_center=fit.var_center + half * half)


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None

"""``nd``: AntDT-ND (§VI-A), for non-dedicated (shared, contended) clusters.

Every interval, from one ``MonitorSnapshot``:

1. Persistent stragglers (long window ``l_per``). A worker is one when its
   equal-share BPT (see ``monitor``) is ``>= lambda x`` the *reference*: with
   ``reference=fast`` (the default) the mean of the fastest quarter of the
   workers in the window (``monitor.fast_reference``), with ``reference=mean``
   the mean over all of them as in the paper, which the stragglers themselves
   inflate (half the workers 2x slow are only 1.33x the mean). A server is one
   when its *step time* is ``>= lambda x`` the mean over servers: its mean update
   time plus the workers' mean exchange time with it (``server_comm_long``), so
   that a server on a slow link, or one too busy to serve its pulls, counts as
   much as one slow to apply updates (its update time alone hid a 10x slower
   server whose link was slow too: a 30 ms update, a 0.9 s exchange). Only nodes
   whose long window is *full* count: at least ``min_reports`` reports, the
   oldest at least ``fill x l_per`` seconds before now, so a node that just
   (re)joined is never judged on a few steps. (How far back the reports reach,
   not newest minus oldest: reports arrive batched, so the newest is up to a
   batch old, and a window of a few seconds would otherwise stay "not full" for
   as long as the batches' phase says.) A persistent straggler is killed and
   restarted (``KillRestart``) only when replacing it would save at least
   ``min_saving`` (5 %) of the workers' step time per step (a server 1.6x slower
   than another at a millisecond of update time is noise), the cluster is not
   busy, and it pays. "Not busy" (AntDT: the job's pending time is acceptable)
   is, on a fixed set of hosts, a *free spare host*: one marked ``spare`` in the
   hostfile with a slot free. Restarting on the straggler's own host does not
   escape contention on that host, so it is done only with ``in_place=1`` (for
   slowness that lives in the process itself). It pays when

       gain = (T_slow - T_ref) x remaining_steps  >  restart_cost_s

   where ``T`` is the long-window equal-share BPT (workers) or update time
   (servers) per step and ``T_ref`` the reference (servers: their mean): in BSP
   every step waits for the slowest node, so replacing it by a healthy one saves
   ``T_slow - T_ref`` per remaining step.
   ``remaining_steps`` and the measured ``restart_cost_s`` come with the snapshot;
   with ``remaining_steps`` unknown nothing is killed (the cautious choice), and
   without a measured cost the ``restart_cost`` parameter stands in.
   At most one KILL_RESTART per decision (the largest gain), none while the
   snapshot says a restart is pending, and none for ``cooldown`` seconds after
   the previous one.

   *Slowness balancing cannot hide* is acted on without waiting for the long
   window: a worker whose short window holds a fitted step line (two batch
   sizes, i.e. after an ADJUST_BS), that is a straggler there, and whose
   fastest possible step (the line at ``min_batch``) still exceeds the
   reference step by more than ``margin`` keeps every BSP step long whatever
   its batch, as a fixed per-step cost does (contention, a slow local disk).
   It is a candidate at once, with the conservative gain ``(T_floor - T_ref)
   x remaining_steps``.

   *A slow host*: when every worker on a host with two or more is slow
   (``>= lambda x`` the reference in its long window, full or not) and one of
   them is a candidate, the host is the straggler. Every one of its workers
   that is a candidate worth its restart is named in the same decision (one
   KILL_RESTART each, to the spare hosts): in an allreduce job they move in one
   regroup, their replacements prewarmed on the spare slots together. Those
   left (no room, not yet a candidate) follow later: the cooldown does not hold
   back the rest of that host's workers while any of them is still slow.
2. Transient stragglers (short window ``l_trans``): ADJUST_BS (eq. 3, via the
   shared ``Balancer``) whenever the optimal batch split beats the current one's
   makespan by more than ``margin``. Workers whose short-window equal-share BPT
   is ``>= lambda x`` the mean are named as the transient stragglers in the
   reason. ADJUST_BS is cheap, so nd does not wait for a worker to cross lambda
   to balance: two workers 1.3x slower than the rest cost a BSP step as much as
   one 1.5x slower, and never cross lambda = 1.5 (the mean includes them). No
   ADJUST_BS in a decision that kills a worker: the restarted worker's sizes
   are planned once it reports again.
3. Otherwise ``NoAction`` with the reasons.

With ``reference=mean`` the mean includes the straggler itself, as in the
paper; so with two workers and ``lambda = 1.5`` one must be 3x slower than the
other to count (with ``fast``: 1.5x).

Parameters: ``lambda l_trans l_per margin min_batch apply_after tolerance noise
min_reports fill cooldown restart_cost in_place min_saving reference``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from dtlaunch.errors import ConfigError
from dtlaunch.supervisor.control.actions import Action, AdjustBatchSize, KillRestart, NoAction
from dtlaunch.supervisor.control.monitor import MonitorSnapshot, WindowStats
from dtlaunch.supervisor.control.policies.base import (
    ParamReader,
    read_balancer,
    read_windows,
    window_inputs,
)

DEFAULT_MIN_REPORTS = 5
DEFAULT_FILL = 0.8  # reports are batched, so a full window spans a bit less than l_per
DEFAULT_RESTART_COST_S = 60.0  # until the caller has measured a real restart
DEFAULT_MIN_SAVING = 0.05  # of a step: a smaller saving is not worth a restart
REFERENCES = ("fast", "mean")  # a straggler's yardstick (module doc)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Candidate:
    role: str
    rank: int
    ratio: float
    t_slow: float
    t_mean: float  # the reference step it is compared to
    gain_s: float
    fixed: bool = False  # found by its line: slowness balancing cannot hide
    host: str = ""  # the host it runs on, when known


class NdPolicy:
    """AntDT-ND; see module doc."""

    name = "nd"

    def __init__(self, params: dict[str, str] | None = None) -> None:
        reader = ParamReader(self.name, params or {})
        self.l_trans, self.l_per, self.lam = read_windows(reader)
        self.balancer = read_balancer(reader)
        self.min_reports = reader.integer("min_reports", DEFAULT_MIN_REPORTS, low=1)
        self.fill = reader.number("fill", DEFAULT_FILL, low=0.0)
        if self.fill > 1.0:
            raise ConfigError(f"policy nd: fill must be in [0, 1], got {self.fill:g}")
        self.cooldown = reader.number("cooldown", self.l_per, low=0.0)
        self.restart_cost = reader.number("restart_cost", DEFAULT_RESTART_COST_S, low=0.0)
        self.in_place = reader.integer("in_place", 0, low=0) > 0
        self.min_saving = reader.number("min_saving", DEFAULT_MIN_SAVING, low=0.0)
        self.reference = reader.choice("reference", "fast", REFERENCES)
        reader.finish()
        self._next_kill_at = float("-inf")
        self._moving_host = ""  # a slow host whose workers are being moved off
        self._yardstick = "the fastest quarter" if self.reference == "fast" else "the mean"

    def _reference(self, snap: MonitorSnapshot, *, short: bool) -> float | None:
        """The workers' reference equal-share BPT in the short or long window."""
        if self.reference == "mean":
            return snap.mean_bpt_eq_short if short else snap.mean_bpt_eq_long
        return snap.ref_bpt_eq_short if short else snap.ref_bpt_eq_long

    def decide(self, snap: MonitorSnapshot) -> list[Action]:
        inputs = window_inputs(snap, self.lam)
        notes: list[str] = []
        actions: list[Action] = []
        kills = self._persistent(snap, inputs, notes)
        actions.extend(kills)
        if not any(kill.role == "worker" for kill in kills):
            plan = self._transient(snap, inputs, notes)
            if plan is not None:
                actions.append(plan)
        if not actions:
            actions.append(
                NoAction(
                    reason="; ".join(notes) or "no straggler",
                    inputs={**inputs, "notes": notes},
                )
            )
        return actions

    # ------------------------------------------------------------ persistent

    def _full(self, st: WindowStats, now: float) -> bool:
        return st.reports >= self.min_reports and now - st.first_s >= self.fill * self.l_per

    def _slow_nodes(
        self,
        role: str,
        window: dict[int, WindowStats],
        reference: float | None,
        remaining: int,
        notes: list[str],
        step_s: float | None,
        now: float,
        yardstick: str,
    ) -> list[_Candidate]:
        if reference is None or len(window) < 2:
            return []
        found: list[_Candidate] = []
        for rank, st in sorted(window.items()):
            ratio = st.mean_bpt_eq / reference
            if ratio < self.lam:
                continue
            if not self._full(st, now):
                notes.append(
                    f"{role} {rank} is {ratio:.2f}x {yardstick} but its long window is not full "
                    f"({st.reports} reports over the last {now - st.first_s:.1f} s, need "
                    f"{self.min_reports} over {self.fill * self.l_per:.1f} s)"
                )
                continue
            saving = st.mean_bpt_eq - reference  # per step, once a healthy node replaces it
            if step_s is None or saving < self.min_saving * step_s:
                # 1.6x of a millisecond of server update time is noise beside a
                # step of 300 ms: not worth a process, a spare host and a move.
                notes.append(
                    f"{role} {rank} is {ratio:.2f}x {yardstick}, but replacing it would save "
                    f"{saving * 1000:.1f} ms of a {1000 * (step_s or 0):.0f} ms step "
                    f"(min_saving {self.min_saving:g})"
                )
                continue
            gain = saving * remaining
            found.append(
                _Candidate(
                    role=role,
                    rank=rank,
                    ratio=ratio,
                    t_slow=st.mean_bpt_eq,
                    t_mean=reference,
                    gain_s=gain,
                )
            )
        return found

    def _fixed_slowness(
        self, snap: MonitorSnapshot, ref: float | None, remaining: int, notes: list[str]
    ) -> list[_Candidate]:
        """Workers whose fitted line says no batch split can hide their slowness."""
        if ref is None or len(snap.worker_short) < 2:
            return []
        found: list[_Candidate] = []
        for rank, st in sorted(snap.worker_short.items()):
            ratio = st.mean_bpt_eq / ref
            if ratio < self.lam or st.line != "fit" or st.reports < self.min_reports:
                continue
            if st.fixed_s is None or st.per_sample_s is None:
                continue  # (a fitted line has both)
            floor = st.fixed_s + st.per_sample_s * self.balancer.min_batch
            if floor <= (1.0 + self.balancer.margin) * ref:
                continue  # a smaller batch brings it down to the others' step
            notes.append(
                f"worker {rank} takes {floor * 1000:.0f} ms a step even at batch "
                f"{self.balancer.min_batch} ({st.fixed_s * 1000:.0f} ms fixed), "
                f"{ref * 1000:.0f} ms is {self._yardstick}'s step: ADJUST_BS cannot hide it"
            )
            found.append(
                _Candidate(
                    role="worker",
                    rank=rank,
                    ratio=ratio,
                    t_slow=floor,
                    t_mean=ref,
                    gain_s=(floor - ref) * remaining,
                    fixed=True,
                )
            )
        return found

    def _worker_candidates(
        self, snap: MonitorSnapshot, remaining: int, notes: list[str], step_s: float | None
    ) -> list[_Candidate]:
        """Persistent and fixed-slowness workers (one entry each, the larger gain),
        each with the host it runs on."""
        persistent = self._slow_nodes(
            "worker", snap.worker_long, self._reference(snap, short=False), remaining,
            notes, step_s, snap.now, self._yardstick,
        )  # fmt: skip
        fixed = self._fixed_slowness(snap, self._reference(snap, short=True), remaining, notes)
        best: dict[int, _Candidate] = {}
        for c in persistent + fixed:
            if c.rank not in best or c.gain_s > best[c.rank].gain_s:
                best[c.rank] = c
        hosts = {r: d.host for r, d in snap.devices.items()}
        return [replace(c, host=hosts.get(c.rank, "")) for _, c in sorted(best.items())]

    def _slow_workers_by_host(self, snap: MonitorSnapshot) -> dict[str, tuple[int, int]]:
        """host -> (workers placed there, how many of them are >= lambda x the
        reference in their long window): the evidence that a host is slow, full
        window or not (a candidate must still qualify on its own to be moved)."""
        ref = self._reference(snap, short=False)
        out: dict[str, tuple[int, int]] = {}
        for rank, device in snap.devices.items():
            st = snap.worker_long.get(rank)
            slow = ref is not None and st is not None and st.mean_bpt_eq >= self.lam * ref
            placed, slow_count = out.get(device.host, (0, 0))
            out[device.host] = (placed + 1, slow_count + int(slow))
        return out

    def _slow_host(self, snap: MonitorSnapshot, workers: list[_Candidate]) -> str:
        """The host to move off: the one being moved off while any worker left
        there is still slow, else a host with two or more workers, all of them
        slow, one of them a candidate."""
        by_host = self._slow_workers_by_host(snap)
        if self._moving_host and by_host.get(self._moving_host, (0, 0))[1] > 0:
            return self._moving_host
        self._moving_host = ""  # moved off, or no longer slow
        candidates_on = {c.host for c in workers}
        for host, (placed, slow) in sorted(by_host.items()):
            if placed >= 2 and slow == placed and host in candidates_on:
                return host
        return ""

    def _persistent(
        self, snap: MonitorSnapshot, inputs: dict[str, Any], notes: list[str]
    ) -> list[KillRestart]:
        remaining = snap.remaining_steps if snap.remaining_steps is not None else 0
        step_s = snap.mean_bpt_long  # the workers' step: what a saving is measured against
        workers = self._worker_candidates(snap, remaining, notes, step_s)
        servers = self._server_steps(snap)
        server_ref = (
            sum(st.mean_bpt_eq for st in servers.values()) / len(servers) if servers else None
        )
        found = workers + self._slow_nodes(
            "server", servers, server_ref, remaining, notes, step_s, snap.now, "the mean",
        )  # fmt: skip
        slow_host = self._slow_host(snap, workers)
        if not found:
            return []
        names = ", ".join(f"{c.role} {c.rank} ({c.ratio:.2f}x)" for c in found)
        if slow_host:
            names += f"; every worker on host {slow_host} is slow"
        if snap.restart_pending:
            notes.append(f"persistent straggler {names}; a restart is still settling")
            return []
        on_slow_host = [c for c in workers if slow_host and c.host == slow_host]
        if snap.now < self._next_kill_at and not (on_slow_host and self._moving_host):
            notes.append(
                f"persistent straggler {names}; KILL_RESTART cooldown until "
                f"t={self._next_kill_at:.0f} s"
            )
            return []
        if snap.remaining_steps is None:
            notes.append(f"persistent straggler {names}; remaining steps unknown, not killing")
            return []
        target = snap.spare_hosts[0] if snap.spare_hosts else None
        if target is None and not self.in_place:
            notes.append(
                f"persistent straggler {names}; no free spare host (the cluster is busy), "
                "not killing (in_place=1 restarts on the same host)"
            )
            return []
        # A slow host's workers go first: moving some of them leaves the host slow.
        worth = [c for c in on_slow_host or found if c.gain_s > self._cost(snap, c.role)]
        if not worth:
            best = max(on_slow_host or found, key=lambda c: c.gain_s)
            notes.append(
                f"persistent straggler {names}; gain {best.gain_s:.1f} s over "
                f"{snap.remaining_steps} steps does not exceed restart cost "
                f"{self._cost(snap, best.role):.1f} s"
            )
            return []
        best = max(worth, key=lambda c: c.gain_s)
        self._next_kill_at = snap.now + self.cooldown
        self._moving_host = slow_host if best.host == slow_host else ""
        # A slow host's workers go together (one regroup); any other straggler alone.
        chosen = [best]
        if self._moving_host:
            mates = self._host_mates(snap, slow_host, worth)
            chosen = sorted(worth + mates, key=lambda c: -c.gain_s)
        return [self._kill(snap, c, target, slow_host, inputs, found=found) for c in chosen]

    @staticmethod
    def _server_steps(snap: MonitorSnapshot) -> dict[int, WindowStats]:
        """Each server's long window with its step time as the one to judge: the
        mean update time plus the workers' mean exchange time with it (module doc)."""
        return {
            rank: replace(st, mean_bpt_eq=st.mean_bpt + snap.server_comm_long.get(rank, 0.0))
            for rank, st in snap.server_long.items()
        }

    def _host_mates(
        self, snap: MonitorSnapshot, host: str, named: list[_Candidate]
    ) -> list[_Candidate]:
        """The other workers on slow ``host``: every one of them is slow (that is
        what made the host the straggler) though its own window may not be full
        yet, and they move with the named ones, in the same regroup."""
        ref = self._reference(snap, short=False)
        remaining = snap.remaining_steps or 0
        taken = {c.rank for c in named}
        mates: list[_Candidate] = []
        for rank, device in sorted(snap.devices.items()):
            st = snap.worker_long.get(rank)
            if device.host != host or rank in taken or st is None or not ref:
                continue
            mates.append(
                _Candidate(
                    role="worker",
                    rank=rank,
                    ratio=st.mean_bpt_eq / ref,
                    t_slow=st.mean_bpt_eq,
                    t_mean=ref,
                    gain_s=max(0.0, st.mean_bpt_eq - ref) * remaining,
                    host=host,
                )
            )
        return mates

    def _kill(
        self,
        snap: MonitorSnapshot,
        best: _Candidate,
        target: str | None,
        slow_host: str,
        inputs: dict[str, Any],
        *,
        found: list[_Candidate],
    ) -> KillRestart:
        """The KILL_RESTART of candidate ``best`` (``found``: every candidate), with
        the reason and inputs."""
        cost = self._cost(snap, best.role)
        if best.fixed:
            why = (
                f"{best.role} {best.rank} takes {best.t_slow * 1000:.0f} ms a step even at "
                f"batch {self.balancer.min_batch}, {best.ratio:.2f}x {self._yardstick} "
                f"(lambda {self.lam:g}): no batch split hides it"
            )
        else:
            yardstick = "the mean" if best.role == "server" else self._yardstick
            why = (
                f"{best.role} {best.rank} is {best.ratio:.2f}x {yardstick} over "
                f"{self.l_per:.0f} s (lambda {self.lam:g})"
            )
        if self._moving_host:
            why = f"slow host {slow_host}: {why}"
        return KillRestart(
            role=best.role,
            rank=best.rank,
            target_host=target,
            reason=(
                f"persistent straggler: {why}; gain {best.gain_s:.1f} s > "
                f"restart cost {cost:.1f} s; restart on "
                + (f"spare host {target}" if target else "the same host")
            ),
            inputs={
                **inputs,
                "t_slow_s": best.t_slow,
                "t_mean_s": best.t_mean,
                "reference": self.reference,
                "ratio": best.ratio,
                "remaining_steps": snap.remaining_steps,
                "gain_s": best.gain_s,
                "restart_cost_s": cost,
                "spare_hosts": list(snap.spare_hosts),
                "candidates": [f"{c.role}:{c.rank}" for c in found],
                "fixed_slowness": best.fixed,
                **({"slow_host": slow_host} if slow_host else {}),
            },
        )

    def _cost(self, snap: MonitorSnapshot, role: str) -> float:
        """What a KILL_RESTART of a ``role`` costs: measured when one was done,
        else the ``restart_cost`` parameter."""
        measured = snap.server_restart_cost_s if role == "server" else snap.restart_cost_s
        return measured if measured is not None else self.restart_cost

    # ------------------------------------------------------------- transient

    def _transient(
        self, snap: MonitorSnapshot, inputs: dict[str, Any], notes: list[str]
    ) -> AdjustBatchSize | None:
        mean = self._reference(snap, short=True)
        slow: list[int] = []
        if mean is not None and len(snap.worker_short) >= 2:
            slow = [
                r
                for r, st in sorted(snap.worker_short.items())
                if st.mean_bpt_eq >= self.lam * mean
            ]
        if slow:
            reason = f"transient straggler worker {', '.join(map(str, slow))} (lambda {self.lam:g})"
        else:
            reason = f"worker throughput changed (none >= lambda {self.lam:g} x {self._yardstick})"
        plan = self.balancer.propose(
            snap, reason=reason, inputs={**inputs, "transient": slow, "notes": list(notes)}
        )
        if isinstance(plan, str):
            notes.append(f"{reason}: {plan}" if slow else plan)
            return None
        return plan

"""RNA, randomized non-blocking AllReduce, the pure core (Yang, Rang and Cheng,
"Mitigating Stragglers in the Decentralized Training on Heterogeneous Clusters",
Middleware '20, §3.2-§4).

Pure functions of their arguments: no I/O, no logging, no global state, no
randomness. Times are seconds (any one unit works; nothing here converts).

§3.3 local reduction with bounded staleness
-------------------------------------------
A worker that was not ready for a round keeps its gradients and reduces them
locally before the next round it joins. For worker ``i`` at round ``k``,

    g' = sum_t [t - (k - tau) + 1] g_t  /  sum_t [t - (k - tau) + 1]

where ``t`` is the model version (global rounds applied) a pending gradient was
computed at and ``tau`` the largest gap ``k - t`` among the pending gradients: a
gradient's weight grows linearly with its version, the stalest gets 1.
Gradients with ``k - t`` beyond the bound are dropped first (bounded staleness,
[25]; the notation table's eta), so ``tau`` is taken over the kept ones:
:func:`staleness_weights` returns the normalised coefficients, one per pending
gradient (0.0 for a dropped one).

§3.3 learning rate
------------------
Alg. 2 averages the round's gradients over the contributors,
``W = 1 / sum_i w_{k,i}``, and by the linear scaling rule [21] uses ``gamma_k =
sum_i w_{k,i} * gamma``, ``gamma`` the rate of one worker. dtlaunch's configured
learning rate is the one for all ``world`` workers contributing (what BSP uses),
so ``gamma = configured / world`` and :func:`lr_factor` is ``contributors /
world``: 1 for a full round, smaller when fewer gradients were averaged.

Momentum under staleness (not in the paper)
-------------------------------------------
A stale gradient already lags the model the way momentum's running sum does
(Mitliagkas et al., "Asynchrony begets momentum", 2016: asynchrony acts as an
implicit momentum). Heavy momentum on top of gradients 1-3 rounds old (RNA's
rounds here run at about one per iteration) made the model oscillate late in
training and end several accuracy points below BSP's after the same data.
:func:`momentum_for_staleness` fades an SGD momentum ``mu`` out as the round's
mean staleness ``tau`` goes from 0 to 1, ``mu' = mu * max(0, 1 - tau)``, and
keeps the step of the configured optimizer, ``lr / (1 - mu)``, by scaling the
rate by ``(1 - mu') / (1 - mu)``: fresh gradients get the optimizer as
configured, gradients a round or more old plain SGD at the same step.
Measured (``benchmarks/rna.py``, 8 workers, momentum 0.9, scenarios a, b, c
in two runs): test accuracy after one epoch 75.2-76.2 % against BSP's 75.9 %,
where keeping the momentum gave 65.3-73.2 %; lightening it by the
implicit-momentum estimate ``tau / (tau + 1)`` alone, at the same step,
74.7-75.7 %. Not corrected: a momentum with dampening (the step formula
differs) or of 1 or more (no finite step to keep).

The final model's moving average (not in the paper)
----------------------------------------------------
A worker ends on an exponential moving average of the global model over its
updates, ``a_k = d_k a_(k-1) + (1 - d_k) x_k``. A constant ``d_k = average``
started at the initial model keeps ``average^k`` of it after ``k`` updates: 3 %
after 34 updates at 0.9, and more of the early models, so a short job ended
on a model well behind its last one. :func:`average_decay` warms the decay up
as TensorFlow's ``ExponentialMovingAverage(num_updates=...)`` does, ``d_k =
min(average, (1 + k) / (10 + k))`` for the ``k``-th update (from 0): the first
updates replace most of the average, and from the 81st on (at 0.9) it is the
configured one, so long runs are unchanged.

§4 hierarchical grouping
------------------------
``zeta`` = slowest minus fastest iteration time, ``v`` = the mean iteration time.
If ``zeta > v`` (``zeta > threshold * v`` in general) the workers are split
into the faster (time ``<= v``) and the slower (time ``> v``) ones, and each
subset is split again the same way until ``zeta <= v`` inside every group
(:func:`split_groups`). Each group then runs
RNA inside and exchanges with a parameter server between groups.

§3.2 power-of-d-choices probe (Fig. 10, §8.4)
---------------------------------------------
The scheduler probes ``d`` random workers and the first to be ready starts the
round. If the time until a probed worker is ready is iid with CDF ``F``, the
response ``min`` of ``d`` such times has CDF ``1 - (1 - F(t))^d``, so its
``q``-quantile is ``F^-1(1 - (1 - q)^(1/d))``:
:func:`probe_response_quantile` evaluates it on an empirical ``F``. It leaves out
the cost of sending the probes, which §8.4 names as the reason more than two
probes stop helping; add it to the answer.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Mapping, Sequence

import numpy as np

from dtlaunch.errors import InfeasibleError

__all__ = [
    "DEFAULT_PROBES",
    "MOMENTUM_MODES",
    "InfeasibleError",
    "average_decay",
    "lr_factor",
    "momentum_for_staleness",
    "probe_median_response",
    "probe_response_quantile",
    "split_groups",
    "staleness_weights",
]

# How the rounds' optimizer treats an SGD momentum (``--policy rna:momentum=``):
# corrected for the gradients' staleness, or kept as configured.
MOMENTUM_MODES = ("auto", "keep")
DEFAULT_PROBES = 2  # the paper's probe count (§3.2); §8.4 found a third not worth its messages


def staleness_weights(versions: Sequence[int], *, current: int, bound: int) -> list[float]:
    """§3.3's local-reduction coefficients of a worker's pending gradients.

    ``versions[j]`` is the model version (global rounds applied) the ``j``-th
    pending gradient was computed at; ``current`` is the round about to run
    (``k``). A gradient staler than ``bound`` rounds (``current - t > bound``)
    gets 0.0. The kept ones get ``t - min_kept + 1`` (``= t - (k - tau) + 1``),
    normalised to sum to 1, so e.g. versions ``[3, 3, 5]`` at round 5 get
    ``[0.2, 0.2, 0.6]``. No gradient, or none within the bound: all 0.0.

    Raises:
        InfeasibleError: (a ``ValueError``) ``bound`` or ``current`` not an
            integer ``>= 0``, or a version that is not an integer in
            ``0 .. current`` (one from the future means a bookkeeping bug).
    """
    current = _validated_int("current", current)
    bound = _validated_int("bound", bound)
    ts = [_validated_int(f"versions[{j}]", t) for j, t in enumerate(versions)]
    for j, t in enumerate(ts):
        if t > current:
            raise InfeasibleError(
                f"versions[{j}] is {t}, after the current round {current}: a gradient "
                "cannot be computed on a model that has not been made yet"
            )
    kept = [t for t in ts if current - t <= bound]
    if not kept:
        return [0.0] * len(ts)
    oldest = min(kept)
    raw = [t - oldest + 1 if current - t <= bound else 0 for t in ts]
    total = sum(raw)  # exact: integers
    return [w / total for w in raw]


def lr_factor(contributors: float, world: int) -> float:
    """§3.3's linear scaling: the factor on the configured learning rate for a
    round that averaged ``contributors`` (``sum_i w_{k,i}``) of ``world`` workers'
    gradients, ``contributors / world`` (the configured rate is the one for all
    ``world`` contributing).

    Raises:
        InfeasibleError: (a ``ValueError``) ``world`` not an integer ``>= 1``, or
            ``contributors`` not a number in ``[0, world]``.
    """
    world = _validated_int("world", world, minimum=1)
    if not 0 <= contributors <= world:  # also rejects NaN
        raise InfeasibleError(
            f"contributors is {contributors!r}; it must be a number in [0, world={world}]"
        )
    return float(contributors) / world


def average_decay(average: float, updates: int) -> float:
    """The weight on the old average at the update after ``updates`` earlier
    ones (see the module docstring): ``min(average, (1 + updates) / (10 +
    updates))``.

    Raises:
        InfeasibleError: (a ``ValueError``) ``average`` outside ``[0, 1)`` or
            ``updates`` negative.
    """
    if not 0 <= average < 1:  # also rejects NaN
        raise InfeasibleError(f"average is {average!r}; it must be in [0, 1)")
    if updates < 0:
        raise InfeasibleError(f"updates is {updates}; it must be >= 0")
    return min(average, (1 + updates) / (10 + updates))


def momentum_for_staleness(
    momentum: float, staleness: float, *, dampening: float = 0.0
) -> tuple[float, float]:
    """The SGD momentum and the factor on the learning rate for a round whose
    contributions were ``staleness`` rounds old on average (see the module
    docstring): ``(mu', (1 - mu') / (1 - mu))`` with ``mu' = mu * max(0, 1 -
    staleness)``. Fresh gradients (``staleness`` 0) give ``(momentum, 1.0)``,
    and so do a momentum of 1 or more (no finite step to keep) and one with
    ``dampening`` (its step is another formula): those are not corrected.

    Raises:
        InfeasibleError: (a ``ValueError``) ``momentum`` not a number ``>= 0``
            or ``staleness`` not a finite number ``>= 0``.
    """
    if not momentum >= 0:  # also rejects NaN
        raise InfeasibleError(f"momentum is {momentum!r}; it must be a number >= 0")
    if not (math.isfinite(staleness) and staleness >= 0):
        raise InfeasibleError(f"staleness is {staleness!r}; it must be a finite number >= 0")
    if momentum >= 1 or dampening:
        return momentum, 1.0
    faded = momentum * max(0.0, 1.0 - staleness)
    return faded, (1.0 - faded) / (1.0 - momentum)


def split_groups(
    iteration_s: Mapping[int, float], *, min_size: int = 1, threshold: float = 1.0
) -> list[tuple[int, ...]]:
    """§4's recursive split of workers by iteration time.

    ``iteration_s`` maps rank to its iteration time. While ``zeta = max - min >
    threshold * v`` (``v`` the mean; the paper's rule is ``threshold`` 1) inside
    a group, it is split into ranks with time ``<= v`` and ranks with time
    ``> v``. A split that would leave either part with fewer than
    ``min_size`` ranks is not made (the group stays whole). Returns the groups
    fastest first, each a sorted tuple of ranks; empty input gives ``[]``. The
    answer does not depend on the mapping's order.

    Raises:
        InfeasibleError: (a ``ValueError``) a rank that is not an integer >= 0, a time
            that is not a finite number ``>= 0``, ``min_size < 1``, or a
            ``threshold`` that is not a finite number ``> 0``.
    """
    min_size = _validated_int("min_size", min_size, minimum=1)
    if not (math.isfinite(threshold) and threshold > 0):
        raise InfeasibleError(f"threshold is {threshold!r}; it must be a finite number > 0")
    times: dict[int, float] = {}
    for rank, seconds in iteration_s.items():
        r = _validated_int("rank", rank)
        if not (math.isfinite(seconds) and seconds >= 0):
            raise InfeasibleError(
                f"iteration time of rank {r} is {seconds!r}; it must be a finite number >= 0"
            )
        times[r] = float(seconds)
    if not times:
        return []
    groups: list[tuple[int, ...]] = []
    # Ranks in time order (rank breaks ties). Every split is a threshold on time,
    # so each group is a run of this order and emitting the faster part first
    # gives the groups fastest first, by mean as by any other statistic.
    _split(sorted(times, key=lambda r: (times[r], r)), times, min_size, threshold, groups)
    return groups


def _split(
    ranks: list[int],
    times: dict[int, float],
    min_size: int,
    threshold: float,
    out: list[tuple[int, ...]],
) -> None:
    values = [times[r] for r in ranks]
    zeta = values[-1] - values[0]  # ranks are in time order
    mean = math.fsum(values) / len(values)  # fsum: exact, so no order flips a tie at v
    if zeta > threshold * mean and zeta > 0:
        # zeta > 0 puts min < mean < max strictly: both parts are non-empty,
        # each smaller than the group, so the recursion ends.
        faster = [r for r in ranks if times[r] <= mean]
        slower = [r for r in ranks if times[r] > mean]
        if len(faster) >= min_size and len(slower) >= min_size:
            _split(faster, times, min_size, threshold, out)
            _split(slower, times, min_size, threshold, out)
            return
    out.append(tuple(sorted(ranks)))


def probe_response_quantile(residual_s: Sequence[float], probes: int, q: float) -> float:
    """The ``q``-quantile of the time until the first of ``probes`` probed
    workers is ready, when each one's time to ready is iid with the empirical
    distribution of ``residual_s``: ``F^-1(1 - (1 - q)^(1/probes))``, ``F^-1`` the
    linearly interpolated sample quantile (``numpy.quantile``, "linear"). The
    probes' messaging cost is not included.

    Raises:
        InfeasibleError: (a ``ValueError``) no sample, a sample that is not a
            finite number ``>= 0``, ``probes`` not an integer ``>= 1``, or ``q``
            not in ``(0, 1)``.
    """
    probes = _validated_int("probes", probes, minimum=1)
    if not 0 < q < 1:
        raise InfeasibleError(f"q is {q!r}; it must be a probability in (0, 1)")
    sample = np.asarray(residual_s, dtype=np.float64)
    if sample.ndim != 1 or sample.size == 0:
        raise InfeasibleError("residual_s must be a non-empty sequence of times")
    if not (np.all(np.isfinite(sample)) and np.all(sample >= 0)):
        raise InfeasibleError("residual_s must hold finite times >= 0")
    # 1 - (1 - q)^(1/d) without the cancellation of 1 - (number near 1) for small q.
    level = -math.expm1(math.log1p(-q) / probes)
    return float(np.quantile(sample, level, method="linear"))


def probe_median_response(residual_s: Sequence[float], probes: int) -> float:
    """The median of :func:`probe_response_quantile`: ``F^-1(1 - 2^(-1/probes))``.

    Raises:
        InfeasibleError: as :func:`probe_response_quantile`.
    """
    return probe_response_quantile(residual_s, probes, 0.5)


def _validated_int(name: str, value: int, minimum: int = 0) -> int:
    if type(value) is not int:
        if isinstance(value, bool):
            raise InfeasibleError(f"{name} must be an integer, not a bool")
        try:
            value = operator.index(value)  # numpy integers are fine
        except TypeError:
            raise InfeasibleError(f"{name} must be an integer, got {value!r}") from None
    if value < minimum:
        raise InfeasibleError(f"{name} is {value}; it must be an integer >= {minimum}")
    return value

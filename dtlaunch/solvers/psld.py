"""PSLD parameter-server load distribution, the pure core (Chen et al., SoCC '20, §4).

Servers are positions ``0 .. m-1`` of a sequence of :class:`ServerFit`, blocks
positions in a sequence of sizes in bytes. Randomness comes only from the
``random.Random`` the caller passes. No I/O, no logging, no global state.

§4.1 performance model
----------------------
``Pred(r, s) = alpha_r * s + beta_r`` (seconds for ``s`` bytes), fitted by
:func:`fit_server` by least squares over the samples given (the caller keeps the
sliding window). ``Pred_SEM(r, s)`` is the standard error of the fitted mean,
``SEM(s)^2 = var_center + (s - center)^2 * var_slope``; for a line that is
``sigma^2 (1/n + (s - mean_size)^2 / Sxx)``, ``sigma^2 = RSS / (n - 2)``, and at
the mean size the paper's SEM of a mean, ``sigma / sqrt(n)``. Degenerate windows:

* no sample, or all of 0 bytes: the time per byte is unknown, so
  :class:`InfeasibleError` (give such a server a prior :class:`ServerFit`; §5.1
  predicts a new server by the other servers' average);
* one sample, or all sizes equal (the usual window between two reassignments):
  the slope is not identifiable; the fit goes through the origin, ``alpha =
  sum(s t) / sum(s^2)`` (mean time / size), ``beta = 0``: §2.3's bytes-per-second
  speed. It is the conservative choice: more load is predicted slower, so the
  greedy never piles blocks on a server whose slope it never saw;
* a negative slope or intercept (noise over a narrow size range) is not physical;
  least squares under ``alpha, beta >= 0`` then lies on an edge: the best level
  (``alpha = 0``, a latency-bound server) or the best line through the origin,
  whichever leaves the smaller residual (``n - 1`` degrees of freedom);
* no degree of freedom left (one sample; two of different sizes): the noise is
  unknown, the SEM infinite (0 at 0 bytes through the origin). No residual: SEM 0.

Trigger
-------
:func:`should_reassign`: speed variation ``(best - worst) / worst`` strictly above
the threshold (1 in §4), or a changed server set. Speeds are bytes per second;
prefer :meth:`ServerFit.speed` at one common size, as §2.3's measured ``bytes / mean
seconds`` favours loaded servers, whose latency is spread over more bytes.

§4.2 superior server set
------------------------
Bounds at ``s = model bytes / number of servers`` (Alg. 1 line 2): ``Pred_mean
-/+ 1.645 Pred_SEM``. The prose *defines* the set as the minimal one whose every
outsider's lower bound is higher than every member's upper bound. It is unique:
the chain of overlapping intervals from the smallest lower bound, found by a sweep
in order of lower bounds (``rule="definition"``, the default). Alg. 1's loop
(``rule="algorithm1"``, literal: by upper bound, stop at the first lower bound
``>=`` the threshold) can return less: it drops a wide interval behind the first
gap although it overlaps the members, and an exact (SEM 0) twin of the best
server. An unbounded interval cannot be ruled out, so the definition then keeps
every server; Alg. 1 looks at it last. Alg. 1 lines 11-13 (scale out below
``ScaleThreshold``, 1/2 of the initial servers, §4.4) become ``scale_out``.

§4.3 ε-greedy assignment (Alg. 2-3)
-----------------------------------
Blocks are placed one by one, in order. When ``epsilon > 0``, per block ``u =
rng.random()``; if ``u < epsilon`` (the paper's ``Rand() <= 1 - ε`` is this event
for ``Rand() = 1 - u``) the block goes to ``rng.randrange(m)``, any server
(exploration). Otherwise Alg. 2 picks the superior server of least ``cost =
theta0 / omega * Pred_mean(r, S_r) + theta1 * S_r / S_assign``: ``S_r`` is the
server's load with the block, ``S_assign`` the bytes placed before it, ``omega``
the mean of ``Pred_mean(r, load_r)`` over the superior set (``math.fsum``, so no
summation order flips a near-tie). Corners, as limits that keep the argmin:

* ``S_assign = 0`` (first block, or only empty blocks before it): every ``S_r``
  is the block's size, so the workload term is equal for all and left out;
* ``omega = 0`` (superior servers holding nothing with ``beta = 0``), or
  ``theta0 / omega`` overflowing: least time wins, then least workload term;
* equal costs go to the lowest server index (Alg. 2 line 9's ``<=`` keeps the
  last one in the iteration order of a set, which has none).

With ``epsilon = 0`` the rng is not used. A server's predicted time is
``Pred_mean(r, load_r)`` if it holds a block (even an empty one: it is still
contacted), else 0; the makespan is the largest. Cost: O(blocks x superior
servers): 1,000 blocks on 20 superior servers take about 5-8 ms of CPU.
"""

from __future__ import annotations

import dataclasses
import math
import operator
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from dtlaunch.errors import InfeasibleError

__all__ = [
    "CONFIDENCE_Z",
    "EPSILON",
    "MAX_BYTES",
    "SCALE_THRESHOLD",
    "TRIGGER_THRESHOLD",
    "BlockAssignment",
    "InfeasibleError",
    "ServerFit",
    "SuperiorRule",
    "SuperiorSet",
    "assign_blocks",
    "fit_server",
    "predicted_makespan",
    "predicted_times",
    "should_reassign",
    "speed_variation",
    "superior_servers",
]

CONFIDENCE_Z = 1.645  # two-sided 90% normal bound (§4.2, footnote 4)
EPSILON = 0.1  # exploration probability (§4.3, §6.1)
TRIGGER_THRESHOLD = 1.0  # speed variation that means a straggler (§4)
SCALE_THRESHOLD = 0.5  # scale out below this share of the initial servers (§4.4)
# Sizes and loads stay exact in a float (8 PiB).
MAX_BYTES = 2**53

SuperiorRule = Literal["definition", "algorithm1"]
FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerFit:
    """``Pred(r, s) = alpha * s + beta`` of one server and the SEM of that mean.

    ``alpha`` is seconds per byte and ``beta`` seconds, both finite and ``>= 0``.
    ``SEM(s)^2 = var_center + (s - center)^2 * var_slope`` (see the module docs);
    the defaults (0) make an exact model, e.g. a prior for a server without samples.
    ``n`` is the number of samples fitted (0 for a prior).

    Raises:
        InfeasibleError: a field out of range.
    """

    alpha: float
    beta: float
    n: int = 0
    center: float = 0.0
    var_center: float = 0.0
    var_slope: float = 0.0

    def __post_init__(self) -> None:
        for name, ok, want in (
            ("alpha", math.isfinite(self.alpha) and self.alpha >= 0, "finite and >= 0 (s/byte)"),
            ("beta", math.isfinite(self.beta) and self.beta >= 0, "finite and >= 0 (seconds)"),
            ("center", math.isfinite(self.center), "finite (bytes)"),
            ("var_center", self.var_center >= 0, "a variance >= 0 (inf: unknown)"),
            ("var_slope", self.var_slope >= 0, "a variance >= 0 (inf: unknown)"),
            ("n", type(self.n) is int and self.n >= 0, "an integer >= 0 (samples)"),
        ):
            if not ok:
                value = getattr(self, name)
                raise InfeasibleError(f"ServerFit.{name} is {value!r}; it must be {want}")

    def mean(self, size: float) -> float:
        """``Pred_mean(r, size)``: predicted seconds for ``size`` bytes."""
        return self.alpha * size + self.beta

    def sem(self, size: float) -> float:
        """``Pred_SEM(r, size)``: standard error of :meth:`mean` (``inf``: unknown)."""
        offset = size - self.center
        slope_part = offset * offset * self.var_slope if offset != 0 else 0.0
        return math.sqrt(self.var_center + slope_part)

    def bounds(self, size: float) -> tuple[float, float]:
        """``(Pred_lower, Pred_upper)``: the mean -/+ ``CONFIDENCE_Z`` SEM (§4.2)."""
        mean, half = self.mean(size), CONFIDENCE_Z * self.sem(size)
        return mean - half, mean + half

    def speed(self, size: float) -> float:
        """Predicted bytes per second when holding ``size > 0`` bytes (``inf`` if free).

        Raises:
            InfeasibleError: ``size`` is not a finite number > 0.
        """
        if not (math.isfinite(size) and size > 0):
            raise InfeasibleError(f"speed needs a size > 0 bytes, got {size!r}")
        seconds = self.mean(size)
        return size / seconds if seconds > 0 else math.inf


@dataclass(frozen=True, slots=True, kw_only=True)
class SuperiorSet:
    """Alg. 1's answer, with the bounds it was decided on (per server, all servers)."""

    servers: tuple[int, ...]  # ascending server indices
    probe_bytes: float  # s = model bytes / number of servers
    lower: tuple[float, ...]
    upper: tuple[float, ...]
    scale_out: bool  # fewer superior servers than scale_threshold * initial servers


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockAssignment:
    """Alg. 3's answer and its prediction under the fits."""

    servers: tuple[int, ...]  # servers[i]: the server of block i
    loads: tuple[int, ...]  # bytes per server
    times: tuple[float, ...]  # predicted seconds per server (0.0 if it holds no block)
    makespan: float  # max(times)
    superior: tuple[int, ...]  # the superior set exploitation used
    explored: tuple[int, ...]  # the blocks placed by exploration (Alg. 3 line 8)


def fit_server(sizes: Sequence[float], seconds: Sequence[float]) -> ServerFit:
    """Fit ``Pred(s) = alpha * s + beta`` to one server's ``(bytes, seconds)`` samples.

    Least squares with the SEM of §4.2, under ``alpha, beta >= 0``; one sample or
    equal sizes give a fit through the origin, and an unknown noise level an
    infinite SEM (module docs say why).

    Raises:
        InfeasibleError: no samples, different lengths, a size or time that is not
            a finite number >= 0, or all sizes 0.
    """
    x = _samples("sizes", sizes, "bytes")
    t = _samples("seconds", seconds, "seconds")
    n = int(x.size)
    if n != t.size:
        raise InfeasibleError(f"{n} sizes for {t.size} times; pass one pair per sample")
    if n == 0:
        raise InfeasibleError(
            "no samples to fit; give a server without samples a prior ServerFit "
            "(e.g. the average alpha and beta of the other servers, PSLD §5.1)"
        )
    if float(x.max()) == 0:
        raise InfeasibleError(
            "every sample moved 0 bytes, so the time per byte cannot be estimated; "
            "fit exchanges that carry data, or give the server a prior ServerFit"
        )
    _, exponent = math.frexp(float(x.max()))
    fit = _fit_scaled(np.ldexp(x, -exponent), t)
    return dataclasses.replace(
        fit,
        alpha=math.ldexp(fit.alpha, -exponent),
        center=math.ldexp(fit.center, exponent),
        var_slope=math.ldexp(fit.var_slope, -2 * exponent),
    )


def speed_variation(speeds: Sequence[float]) -> float:
    """``(best - worst) / worst`` of server speeds (bytes/s, ``>= 0``, ``inf`` allowed).

    Equal speeds (also all 0 or all ``inf``) give 0.0; a 0 among faster ones ``inf``.

    Raises:
        InfeasibleError: no speeds, or a speed that is NaN or negative.
    """
    values = [float(v) for v in speeds]
    if not values:
        raise InfeasibleError("no server speeds; pass one speed (bytes/s) per server")
    for r, value in enumerate(values):
        if not value >= 0:
            raise InfeasibleError(
                f"speed of server {r} is {value!r}; speeds are bytes/s >= 0 (0: stalled)"
            )
    best, worst = max(values), min(values)
    if best == worst:
        return 0.0
    return math.inf if worst == 0 else (best - worst) / worst


def should_reassign(
    speeds: Sequence[float],
    *,
    threshold: float = TRIGGER_THRESHOLD,
    server_set_changed: bool = False,
) -> bool:
    """PSLD's trigger: speed variation ``> threshold`` or a changed server set.

    Raises:
        InfeasibleError: invalid speeds (see :func:`speed_variation`) or a
            threshold that is not a number >= 0.
    """
    if not threshold >= 0:
        raise InfeasibleError(f"threshold is {threshold!r}; it must be a number >= 0")
    variation = speed_variation(speeds)
    return server_set_changed or variation > threshold


def superior_servers(
    fits: Sequence[ServerFit],
    model_bytes: float,
    *,
    rule: SuperiorRule = "definition",
    scale_threshold: float = SCALE_THRESHOLD,
    initial_servers: int | None = None,
) -> SuperiorSet:
    """Alg. 1: the servers not confidently slower than the best (see module docs).

    Bounds are taken at ``model_bytes / len(fits)``. ``scale_out`` is set when the
    set has fewer than ``scale_threshold * initial_servers`` servers (default:
    ``len(fits)``). Equal bounds are ordered by server index.

    Raises:
        InfeasibleError: no fits, a negative or non-finite ``model_bytes``, an
            unknown rule, or an invalid scale threshold or initial count.
    """
    fits = _validated_fits(fits)
    if not (math.isfinite(model_bytes) and 0 <= model_bytes <= MAX_BYTES):
        raise InfeasibleError(f"model_bytes is {model_bytes!r}; pass the model's size in bytes")
    if not (math.isfinite(scale_threshold) and scale_threshold >= 0):
        raise InfeasibleError(f"scale_threshold is {scale_threshold!r}; it must be >= 0")
    initial = len(fits) if initial_servers is None else initial_servers
    initial = _validated_int("initial_servers", initial)
    probe = model_bytes / len(fits)
    lower, upper = zip(*(fit.bounds(probe) for fit in fits), strict=True)
    if rule == "definition":
        chosen = _separated_cluster(lower, upper)
    elif rule == "algorithm1":
        chosen = _algorithm1(lower, upper)
    else:
        raise InfeasibleError(f"unknown rule {rule!r}; use 'definition' or 'algorithm1'")
    return SuperiorSet(
        servers=tuple(sorted(chosen)),
        probe_bytes=probe,
        lower=tuple(lower),
        upper=tuple(upper),
        scale_out=len(chosen) < scale_threshold * initial,
    )


def assign_blocks(
    block_sizes: Sequence[int],
    fits: Sequence[ServerFit],
    superior: Sequence[int] | None = None,
    *,
    rng: random.Random | None = None,
    epsilon: float = EPSILON,
    theta0: float = 1.0,
    theta1: float = 1.0,
) -> BlockAssignment:
    """Alg. 3: place every block, in order, ε-greedily (Alg. 2 on ``superior``).

    ``superior`` defaults to :func:`superior_servers` of ``fits`` at the blocks'
    total size. ``rng`` is required when ``epsilon > 0`` and unused when it is 0;
    a fixed seed gives a fixed answer (draw order in the module docs).

    Raises:
        InfeasibleError: invalid sizes or fits, a superior index out of range or
            repeated, an empty superior set, ``epsilon`` outside [0, 1], a weight
            that is negative or both weights 0, or ``epsilon > 0`` without ``rng``.
    """
    sizes = _validated_sizes(block_sizes)
    fits = _validated_fits(fits)
    m = len(fits)
    if not 0 <= epsilon <= 1:
        raise InfeasibleError(f"epsilon is {epsilon!r}; it must be a probability in [0, 1]")
    for name, weight in (("theta0", theta0), ("theta1", theta1)):
        if not (math.isfinite(weight) and weight >= 0):
            raise InfeasibleError(f"{name} is {weight!r}; cost weights must be finite and >= 0")
    if theta0 == 0 and theta1 == 0:
        raise InfeasibleError("theta0 and theta1 are both 0; the cost would ignore the servers")
    if epsilon > 0 and rng is None:
        raise InfeasibleError(
            f"epsilon is {epsilon}, so exploration needs rng=random.Random(seed); "
            "pass one, or epsilon=0 for the deterministic greedy assignment"
        )
    if superior is None:
        chosen = superior_servers(fits, float(sum(sizes))).servers
    else:
        chosen = _validated_superior(superior, m)
    alphas = [fits[r].alpha for r in chosen]
    betas = [fits[r].beta for r in chosen]
    slot = {r: j for j, r in enumerate(chosen)}
    k = len(chosen)
    held = [0.0] * k  # bytes on each superior server (floats: exact below MAX_BYTES)
    now = list(betas)  # Pred_mean(r, held) of each superior server
    loads = [0] * m
    placed: list[int] = []
    explored: list[int] = []
    assigned = 0.0  # S_assign
    for i, size in enumerate(sizes):
        if epsilon > 0 and rng is not None and rng.random() < epsilon:
            server = rng.randrange(m)
            explored.append(i)
        else:
            omega = math.fsum(now) / k  # theta0 / omega: 0 if theta0 is, inf if omega is 0
            weight = 0.0 if theta0 == 0 else theta0 / omega if omega > 0 else math.inf
            server = chosen[_exploit(float(size), held, alphas, betas, weight, assigned, theta1)]
        placed.append(server)
        loads[server] += size
        assigned += size
        j = slot.get(server)
        if j is not None:
            held[j] += size
            now[j] = alphas[j] * held[j] + betas[j]
    times = _times(placed, loads, fits)
    return BlockAssignment(
        servers=tuple(placed),
        loads=tuple(loads),
        times=times,
        makespan=max(times),
        superior=chosen,
        explored=tuple(explored),
    )


def predicted_times(
    block_sizes: Sequence[int], servers: Sequence[int], fits: Sequence[ServerFit]
) -> tuple[float, ...]:
    """Predicted seconds per server of an assignment: ``Pred_mean(r, load_r)`` if
    server ``r`` holds a block, else 0.0.

    Raises:
        InfeasibleError: invalid sizes or fits, lengths that differ, or a server
            index out of range.
    """
    sizes = _validated_sizes(block_sizes)
    fits = _validated_fits(fits)
    if len(servers) != len(sizes):
        raise InfeasibleError(f"{len(servers)} servers for {len(sizes)} blocks; give one per block")
    loads = [0] * len(fits)
    placed: list[int] = []
    for i, (size, server) in enumerate(zip(sizes, servers, strict=True)):
        r = _validated_int(f"server of block {i}", server, minimum=0)
        if r >= len(fits):
            raise InfeasibleError(
                f"block {i} is on server {r}, but there are {len(fits)} fits (0..{len(fits) - 1})"
            )
        loads[r] += size
        placed.append(r)
    return _times(placed, loads, fits)


def predicted_makespan(
    block_sizes: Sequence[int], servers: Sequence[int], fits: Sequence[ServerFit]
) -> float:
    """The largest of :func:`predicted_times` (0.0 with no blocks).

    Raises:
        InfeasibleError: as :func:`predicted_times`.
    """
    return max(predicted_times(block_sizes, servers, fits))


# ---------------------------------------------------------------- internals


def _exploit(
    size: float,
    held: list[float],
    alphas: list[float],
    betas: list[float],
    weight: float,
    assigned: float,
    theta1: float,
) -> int:
    """Alg. 2: the position in the superior set of least cost (corners: module docs)."""
    rows = zip(held, alphas, betas, strict=True)
    if math.isinf(weight):  # time first, then the workload term
        keys = [
            (alpha * (h + size) + beta, theta1 * (h + size) / assigned if assigned > 0 else 0.0)
            for h, alpha, beta in rows
        ]
        return keys.index(min(keys))
    if assigned > 0:
        costs = [
            weight * (alpha * (s_r := h + size) + beta) + theta1 * s_r / assigned
            for h, alpha, beta in rows
        ]
    else:  # S_assign = 0: the workload term is equal for all servers
        costs = [weight * (alpha * (h + size) + beta) for h, alpha, beta in rows]
    return costs.index(min(costs))  # the first least cost: the lowest server index


def _separated_cluster(lower: Sequence[float], upper: Sequence[float]) -> list[int]:
    """§4.2's definition: sweep by lower bound while it is <= the members' max upper."""
    order = sorted(range(len(lower)), key=lambda r: (lower[r], r))
    chosen = [order[0]]
    level = upper[order[0]]
    for r in order[1:]:
        if lower[r] > level:
            break
        chosen.append(r)
        level = max(level, upper[r])
    return chosen


def _algorithm1(lower: Sequence[float], upper: Sequence[float]) -> list[int]:
    """Alg. 1 lines 3-10, literally."""
    chosen: list[int] = []
    threshold = math.inf
    for r in sorted(range(len(lower)), key=lambda r: (upper[r], r)):
        if lower[r] >= threshold:
            break
        threshold = upper[r]
        chosen.append(r)
    return chosen


def _times(
    placed: Sequence[int], loads: Sequence[int], fits: Sequence[ServerFit]
) -> tuple[float, ...]:
    held = set(placed)
    return tuple(fits[r].mean(load) if r in held else 0.0 for r, load in enumerate(loads))


def _fit_scaled(x: FloatArray, t: FloatArray) -> ServerFit:
    """:func:`fit_server` on sizes scaled by a power of two (exact) to a maximum in
    [0.5, 1), so that neither ``sum(s^2)`` nor ``Sxx`` can under- or overflow."""
    n = int(x.size)
    if bool((x == x[0]).all()):
        return _fit_on_an_edge(x, t, level_allowed=False)
    center = float(x.mean())
    dx = x - center
    sxx = float(dx @ dx)
    alpha = float(dx @ (t - t.mean())) / sxx
    beta = float(t.mean()) - alpha * center
    if alpha < 0 or beta < 0:
        return _fit_on_an_edge(x, t, level_allowed=True)
    residuals = t - (alpha * x + beta)
    sigma2 = float(residuals @ residuals) / (n - 2) if n > 2 else math.inf
    return ServerFit(
        alpha=alpha, beta=beta, n=n, center=center, var_center=sigma2 / n, var_slope=sigma2 / sxx
    )


def _fit_on_an_edge(x: FloatArray, t: FloatArray, *, level_allowed: bool) -> ServerFit:
    """Least squares on the edge ``beta = 0``, or ``alpha = 0`` if allowed and closer."""
    n = int(x.size)
    sxx = float(x @ x)
    slope = float(x @ t) / sxx
    residuals = t - slope * x
    rss = float(residuals @ residuals)
    if level_allowed:
        level = float(t.mean())
        rss_level = float((t - level) @ (t - level))
        if rss_level < rss:
            return ServerFit(alpha=0.0, beta=level, n=n, var_center=rss_level / (n - 1) / n)
    sigma2 = rss / (n - 1) if n > 1 else math.inf
    return ServerFit(alpha=slope, beta=0.0, n=n, var_slope=sigma2 / sxx)


def _samples(name: str, values: Sequence[float], unit: str) -> FloatArray:
    try:
        array = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InfeasibleError(f"{name} must be a sequence of numbers ({unit}): {exc}") from None
    if array.ndim != 1:
        raise InfeasibleError(f"{name} must be a flat sequence with one value per sample")
    bad = ~(np.isfinite(array) & (array >= 0))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise InfeasibleError(
            f"{name}[{i}] is {float(array[i])!r}; every sample must be a finite number >= 0 {unit}"
        )
    return array


def _validated_fits(fits: Sequence[ServerFit]) -> Sequence[ServerFit]:
    if len(fits) == 0:
        raise InfeasibleError("no servers; pass one ServerFit per parameter server")
    for r, fit in enumerate(fits):
        if not isinstance(fit, ServerFit):
            raise InfeasibleError(
                f"fits[{r}] is a {type(fit).__name__}; build it with fit_server() or ServerFit()"
            )
    return fits


def _validated_sizes(block_sizes: Sequence[int]) -> list[int]:
    sizes = [_validated_int(f"size of block {i} (bytes)", b, 0) for i, b in enumerate(block_sizes)]
    if sum(sizes) > MAX_BYTES:
        raise InfeasibleError(f"the blocks total more than {MAX_BYTES} bytes; sizes are bytes")
    return sizes


def _validated_superior(superior: Sequence[int], m: int) -> tuple[int, ...]:
    indices = [_validated_int("superior server", r, minimum=0) for r in superior]
    if not indices:
        raise InfeasibleError("the superior set is empty; pass at least one server index")
    if len(set(indices)) != len(indices):
        raise InfeasibleError(f"superior servers {indices} repeat an index; list each once")
    if max(indices) >= m:
        raise InfeasibleError(
            f"superior server {max(indices)} does not exist; there are {m} fits (0..{m - 1})"
        )
    return tuple(sorted(indices))


def _validated_int(name: str, value: int, minimum: int = 1) -> int:
    if type(value) is not int:
        if isinstance(value, bool):
            raise InfeasibleError(f"{name} must be an integer, not a bool")
        try:
            value = operator.index(value)
        except TypeError:
            raise InfeasibleError(f"{name} must be an integer, got {value!r}") from None
    if value < minimum:
        raise InfeasibleError(f"{name} is {value}; it must be an integer >= {minimum}")
    return value

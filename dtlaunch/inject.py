"""``--inject`` straggler specs and the delay they add to a step (AntDT §VII-A-4).

Spec forms (DESIGN.md "Straggler injection")::

    persistent:role=worker,ranks=3,delay=4.0
    transient:role=worker,prob=0.3,period=30,duration=15,sleep=1.5,intensity=0.8
    slowdown:role=server,ranks=1,factor=10

- ``role`` is ``worker`` (default) or ``server``.
- ``ranks=1,3-5`` binds the spec to those ranks wherever they run (a slow shard);
  ``hosts=node1,node2`` binds it to hosts (contention), so a KILL_RESTART onto
  another host escapes it. List items continue after the comma until the next
  ``key=``. Neither: every node of the role. Both: a node must match both.
- ``persistent`` adds ``delay`` seconds to every step.
- ``transient`` (FlexRR/AntDT): time is cut into windows of ``period`` seconds;
  in each window a node is disturbed with probability ``prob`` (default 1), and
  then, for the window's first ``duration`` seconds, every step sleeps
  ``sleep x intensity`` (intensity in [0, 1], default 1). The coin is tossed once
  per (spec, node, window) from a seed derived from the given ``rng`` without
  advancing it, so every call in a window, in any process given the same seed,
  agrees. A host-bound spec tosses per host (all its processes suffer together);
  otherwise per (role, rank).
- ``slowdown`` makes a node ``factor`` times slower: ``(factor - 1) x`` the
  step's compute time. On a server with ``link=RATE`` (bytes a second a healthy
  server's link moves, a size: ``link=200M``), its transfers are ``factor``
  times slower too: every pull it answers and every push it takes costs ``(factor
  - 1) x bytes / RATE`` more, one transfer after another, as on a slow link
  (PSLD's slow server is slow at both).
- ``after=S`` / ``until=S`` (any kind) limit a spec to the time from ``S`` seconds
  after the job started (start-up included) / before ``S``: a straggler that
  appears mid-run, or a slow host that recovers by itself.

Several specs may be given; their delays add up.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from dtlaunch.errors import ConfigError
from dtlaunch.quantities import parse_size

__all__ = ["InjectionSpec", "injected_delay", "parse_injection", "parse_injections"]

KINDS = ("persistent", "transient", "slowdown")
ROLES = ("worker", "server")
_COMMON_KEYS = ("role", "ranks", "hosts", "after", "until")
_KIND_KEYS: dict[str, tuple[str, ...]] = {
    "persistent": ("delay",),
    "transient": ("prob", "period", "duration", "sleep", "intensity"),
    "slowdown": ("factor", "link"),
}
_REQUIRED: dict[str, tuple[str, ...]] = {
    "persistent": ("delay",),
    "transient": ("period", "duration", "sleep"),
    "slowdown": ("factor",),
}
_LIST_KEYS = ("ranks", "hosts")


@dataclass(frozen=True, slots=True, kw_only=True)
class InjectionSpec:
    """One parsed ``--inject`` spec; ``text`` is the original, for events."""

    kind: str
    role: str = "worker"
    ranks: frozenset[int] | None = None
    hosts: frozenset[str] | None = None
    delay: float = 0.0
    prob: float = 1.0
    period: float = 0.0
    duration: float = 0.0
    sleep: float = 0.0
    intensity: float = 1.0
    factor: float = 1.0
    link: float = 0.0  # slowdown of a server: a healthy link's bytes/s (0: no transfer delay)
    after: float = 0.0  # seconds since the job started: active from here...
    until: float = math.inf  # ...until here
    text: str = ""

    def applies_to(self, *, role: str, rank: int, host: str) -> bool:
        """Whether this spec targets the node ``(role, rank)`` running on ``host``."""
        if role != self.role:
            return False
        if self.ranks is not None and rank not in self.ranks:
            return False
        return self.hosts is None or host in self.hosts

    def active_at(self, now: float) -> bool:
        """Whether the spec applies ``now`` seconds after the job started."""
        return self.after <= now < self.until


def parse_injections(texts: Iterable[str]) -> tuple[InjectionSpec, ...]:
    """Parse several specs; each text may also hold several separated by ``;``.

    Raises: ConfigError naming the first bad spec.
    """
    return tuple(
        parse_injection(part) for text in texts for part in text.split(";") if part.strip()
    )


def parse_injection(text: str) -> InjectionSpec:
    """Parse one spec (forms in the module doc).

    Raises:
        ConfigError: unknown kind or key (naming it and listing the valid ones),
            missing required key, or a value out of range.
    """
    kind, colon, body = text.strip().partition(":")
    kind = kind.strip()
    if kind not in KINDS:
        raise ConfigError(
            f"--inject {text!r}: unknown kind {kind!r}; valid kinds: {', '.join(KINDS)} "
            "(e.g. persistent:role=worker,ranks=3,delay=4.0)"
        )
    valid = _COMMON_KEYS + _KIND_KEYS[kind]
    raw = _split_pairs(text, body if colon else "", valid)
    missing = [k for k in _REQUIRED[kind] if k not in raw]
    if missing:
        raise ConfigError(
            f"--inject {text!r}: {kind} needs {', '.join(missing)}; "
            f"valid keys for {kind}: {', '.join(valid)}"
        )
    role = raw.pop("role", ["worker"])[0]
    if role not in ROLES:
        raise ConfigError(
            f"--inject {text!r}: role must be one of {', '.join(ROLES)}, got {role!r}"
        )
    ranks = _parse_ranks(text, raw.pop("ranks")) if "ranks" in raw else None
    hosts = frozenset(raw.pop("hosts")) if "hosts" in raw else None
    link = _link_rate(text, raw.pop("link"), role) if "link" in raw else 0.0
    nums = {key: _number(text, key, items) for key, items in raw.items()}
    spec = InjectionSpec(
        kind=kind,
        role=role,
        ranks=ranks,
        hosts=hosts,
        delay=nums.get("delay", 0.0),
        prob=nums.get("prob", 1.0),
        period=nums.get("period", 0.0),
        duration=nums.get("duration", 0.0),
        sleep=nums.get("sleep", 0.0),
        intensity=nums.get("intensity", 1.0),
        factor=nums.get("factor", 1.0),
        link=link,
        after=nums.get("after", 0.0),
        until=nums.get("until", math.inf),
        text=text.strip(),
    )
    _check_ranges(text, spec)
    return spec


def injected_delay(
    specs: Sequence[InjectionSpec],
    *,
    role: str,
    rank: int,
    host: str,
    now: float,
    step_compute_s: float,
    rng: random.Random,
) -> float:
    """Seconds to sleep in this step of node ``(role, rank)`` on ``host`` at ``now``.

    ``now`` must be a clock shared by the job (seconds since the job started) so
    that transient windows line up across processes. ``rng`` is only read (its
    state seeds the per-window coin), never advanced: pass ``Random(job_seed)``.
    """
    total = 0.0
    base: int | None = None
    for index, spec in enumerate(specs):
        if not spec.applies_to(role=role, rank=rank, host=host) or not spec.active_at(now):
            continue
        if spec.kind == "persistent":
            total += spec.delay
        elif spec.kind == "slowdown":
            total += (spec.factor - 1.0) * max(step_compute_s, 0.0)
        elif spec.kind == "transient":
            window = math.floor(now / spec.period)
            if now - window * spec.period >= spec.duration:
                continue
            if base is None:
                base = _base_seed(rng)
            who = f"host={host}" if spec.hosts is not None else f"{role}={rank}"
            if _coin(base, index, who, window) < spec.prob:
                total += spec.sleep * spec.intensity
    return total


def _base_seed(rng: random.Random) -> int:
    shadow = random.Random()
    shadow.setstate(rng.getstate())
    return shadow.getrandbits(64)


def _coin(base: int, index: int, who: str, window: int) -> float:
    # Seeding with a str hashes it with SHA-512 (not the per-process salted
    # hash()), so every process computes the same coin.
    return random.Random(f"{base}:{index}:{who}:{window}").random()


def _split_pairs(text: str, body: str, valid: tuple[str, ...]) -> dict[str, list[str]]:
    raw: dict[str, list[str]] = {}
    last: str | None = None
    for item in (part.strip() for part in body.split(",")):
        if not item:
            raise ConfigError(f"--inject {text!r}: empty item (two commas in a row?)")
        key, eq, value = (p.strip() for p in item.partition("="))
        if not eq:
            if last in _LIST_KEYS:
                raw[last].append(item)
                continue
            raise ConfigError(
                f"--inject {text!r}: {item!r} is not key=value; valid keys: {', '.join(valid)}"
            )
        if key not in valid:
            raise ConfigError(
                f"--inject {text!r}: unknown key {key!r}; valid keys: {', '.join(valid)}"
            )
        if key in raw:
            raise ConfigError(f"--inject {text!r}: key {key!r} given twice")
        if not value:
            raise ConfigError(f"--inject {text!r}: key {key!r} has no value")
        raw[key] = [value]
        last = key
    return raw


def _parse_ranks(text: str, items: list[str]) -> frozenset[int]:
    ranks: set[int] = set()
    for item in items:
        lo, dash, hi = item.partition("-")
        try:
            first, last = int(lo), int(hi) if dash else int(lo)
        except ValueError:
            first, last = -1, -2
        if first < 0 or last < first:
            raise ConfigError(f"--inject {text!r}: bad rank {item!r}; write ranks like 3 or 1,3-5")
        ranks.update(range(first, last + 1))
    return frozenset(ranks)


def _link_rate(text: str, items: list[str], role: str) -> float:
    if role != "server":
        raise ConfigError(
            f"--inject {text!r}: link= slows a parameter server's transfers; use it with "
            "role=server"
        )
    try:
        rate = parse_size(items[0]) if len(items) == 1 else 0
    except ValueError:
        rate = 0
    if rate <= 0:
        raise ConfigError(
            f"--inject {text!r}: link must be the bytes a second a healthy server's link "
            f"moves, a size such as 200M, got {','.join(items)!r}"
        )
    return float(rate)


def _number(text: str, key: str, items: list[str]) -> float:
    try:
        value = float(items[0])
    except ValueError:
        value = math.nan
    if len(items) != 1 or not math.isfinite(value):
        raise ConfigError(f"--inject {text!r}: {key} must be a number, got {','.join(items)!r}")
    return value


def _check_ranges(text: str, spec: InjectionSpec) -> None:
    problems = {
        "delay": spec.delay >= 0,
        "prob": 0 <= spec.prob <= 1,
        "period": spec.kind != "transient" or spec.period > 0,
        "duration": 0 <= spec.duration <= max(spec.period, 0),
        "sleep": spec.sleep >= 0,
        "intensity": 0 <= spec.intensity <= 1,
        "factor": spec.factor >= 1,
        "after": spec.after >= 0,
        "until": spec.until > spec.after,
    }
    rules = {
        "delay": "seconds >= 0",
        "prob": "a probability in [0, 1]",
        "period": "seconds > 0",
        "duration": "seconds in [0, period]",
        "sleep": "seconds >= 0",
        "intensity": "in [0, 1]",
        "factor": ">= 1 (10 means 10x slower)",
        "after": "seconds >= 0 since the job started",
        "until": "seconds since the job started, after 'after'",
    }
    for key, ok in problems.items():
        if not ok:
            value = getattr(spec, key)
            raise ConfigError(f"--inject {text!r}: {key} must be {rules[key]}, got {value:g}")

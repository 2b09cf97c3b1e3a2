"""Hostfile text -> ``list[HostSpec]``; pure apart from :func:`load_hosts` reading a file.

A hostfile line is a superset of DeepSpeed, OpenMPI and Horovod hostfile lines::

    # comments and blank lines are fine; trailing comments too
    node1 slots=4                     # 4 processes may run here
    deploy@node2:2222 slots=2 servers=1
    node3 slots=4 spare               # spare capacity: relaunch / scale-out target
    node4 slots=2 class=v100 bmax=96  # device class and its batch bounds (AntDT-DD)
    node5 slots=4 gpus=4              # 4 GPUs: each worker gets one (CUDA_VISIBLE_DEVICES)
    node6 slots=4 cpus=16 mem=64G     # capacity: each process gets 4 CPUs and 16 GiB
    [fd00::7]:2222 slots=8            # IPv6 goes in brackets

Grammar: ``[user@]host[:port] [slots=N] [servers=N] [spare] [class=NAME] [gpus=N]
[bmin=N] [bmax=N] [cpus=N] [mem=SIZE]``.
``host`` is an IPv4 address, an RFC 1123 host name or a bracketed IPv6 address.

The inline form (``-H node1:4,node2:4``) holds ``[user@]host[:slots]`` entries;
there the number after ``:`` is a slot count, as with ``mpirun -H`` and
``horovodrun -H``, not a port.

Every problem of the whole input is reported at once, as
``file:line:col: what was wrong; expected ...`` (``-H:1:col:`` for inline lists),
inside one :class:`~dtlaunch.errors.HostfileError`.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from pathlib import Path

from dtlaunch.errors import HostfileError
from dtlaunch.hostaddr import (
    HOST_HELP,
    Problems,
    host_label,
    hostname_problem,
    parse_host_token,
)
from dtlaunch.quantities import parse_cpus, parse_size

__all__ = [
    "MAX_SLOTS",
    "HostSpec",
    "load_hosts",
    "parse_hostfile",
    "parse_inline",
]

# A sanity bound: a bigger number is a typo, not a machine.
MAX_SLOTS = 4096

_VALUE_FORMS = {
    "slots": "slots=N",
    "servers": "servers=N",
    "class": "class=NAME",
    "gpus": "gpus=N",
    "bmin": "bmin=N",
    "bmax": "bmax=N",
    "cpus": "cpus=N",
    "mem": "mem=SIZE",
}
_VALUE_KEYS = tuple(_VALUE_FORMS)
_VALUE_RANGES = {"cpus": "0.001..65536", "mem": "64M..1P (did you forget G?)"}
_FLAG_KEYS = ("spare",)
_OPTIONS_HELP = "slots=N, servers=N, spare, class=NAME, gpus=N, bmin=N, bmax=N, cpus=N, mem=SIZE"
# A per-device micro-batch above this is a typo, not a memory size.
MAX_DEVICE_BATCH = 1 << 24
# Bounds that catch typos (mem=64 meaning 64 bytes, cpus=80000), not machines.
MIN_HOST_MEMORY = 64 << 20
MAX_HOST_MEMORY = 1 << 50
MAX_HOST_CPUS = 65536
_INLINE_HELP = "[user@]host[:slots] (e.g. node1:4,deploy@node2:2)"
_CLASS_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}")
# Only ASCII digits: str.isdigit() would accept '²' and int() would accept '+4' or '1_0'.
_DIGITS_RE = re.compile(r"[0-9]+")
# Inline lists never point at files, so these suffixes mean "a hostfile that is missing".
_FILE_SUFFIXES = (".txt", ".hosts", ".hostfile", ".cfg", ".conf", ".ini", ".list", ".lst")


@dataclass(frozen=True, slots=True, kw_only=True)
class HostSpec:
    """One host that may run workers and servers."""

    label: str  # unique name used in logs/prefixes: hostname, or "hostname:port" with a port
    hostname: str  # what SSH connects to; IPv6 without brackets
    user: str | None = None
    port: int | None = None
    slots: int = 1  # max processes (workers + servers) on this host
    servers: int = 0  # how many of those slots are preferred for parameter servers
    spare: bool = False  # not used at start; relaunch / scale-out target
    device_class: str | None = None  # `class=v100`
    # `gpus=N`: the host's GPUs 0..N-1; each worker there is given one (LOCAL_RANK
    # indexes CUDA_VISIBLE_DEVICES, as DeepSpeed's launcher does). 0: no GPUs declared.
    gpus: int = 0
    # `bmin=`/`bmax=`: the device's micro-batch bounds for AntDT-DD and lb-bsp:
    # its saturation point and the largest batch its memory holds. None: not given.
    min_batch: int | None = None
    max_batch: int | None = None
    # `cpus=N` and `mem=SIZE`: the capacity the processes placed here share; each
    # gets cpus/slots and mem/slots as its limits. 0: not declared (the agent
    # measures the memory; no CPU quota).
    cpus: float = 0.0
    memory_bytes: int = 0
    origin: str = ""  # "file:line" where it was defined, or "-H" for inline

    def __post_init__(self) -> None:
        # Guards hand-built specs too: placement relies on these bounds.
        if not 1 <= self.slots <= MAX_SLOTS:
            raise HostfileError([f"{self.label}: slots={self.slots}; expected 1..{MAX_SLOTS}"])
        if not 0 <= self.servers <= self.slots:
            raise HostfileError(
                [f"{self.label}: servers={self.servers}; expected 0..slots ({self.slots})"]
            )
        if self.port is not None and not 1 <= self.port <= 65535:
            raise HostfileError([f"{self.label}: port {self.port}; expected 1..65535"])
        if not 0 <= self.gpus <= MAX_SLOTS:
            raise HostfileError([f"{self.label}: gpus={self.gpus}; expected 0..{MAX_SLOTS}"])
        for key, bound in (("bmin", self.min_batch), ("bmax", self.max_batch)):
            if bound is not None and not 1 <= bound <= MAX_DEVICE_BATCH:
                raise HostfileError(
                    [f"{self.label}: {key}={bound}; expected 1..{MAX_DEVICE_BATCH}"]
                )
        if not (0 <= self.cpus <= MAX_HOST_CPUS and 0 <= self.memory_bytes <= MAX_HOST_MEMORY):
            raise HostfileError([f"{self.label}: cpus={self.cpus} mem={self.memory_bytes}"])
        low, high = self.min_batch, self.max_batch
        if low is not None and high is not None and low > high:
            raise HostfileError([f"{self.label}: bmin={low} exceeds bmax={high}"])


def parse_hostfile(text: str, filename: str = "<hostfile>") -> list[HostSpec]:
    """Parse hostfile ``text``; ``filename`` only prefixes error locations.

    Raises:
        HostfileError: with every problem in the text, or when it defines no host.
    """
    problems = Problems(filename)
    hosts: list[HostSpec] = []
    first_seen: dict[str, str] = {}
    class_bounds: dict[str, tuple[int | None, int | None, int]] = {}
    saw_host_line = False
    text = text.removeprefix("\ufeff")
    # split("\n"), not splitlines(): editors number lines by '\n' only, and
    # splitlines() also breaks at form feeds and other rare separators.
    for line_no, raw in enumerate(text.split("\n"), start=1):
        content = raw.removesuffix("\r").split("#", 1)[0]
        tokens = [(m.start() + 1, m.group()) for m in re.finditer(r"\S+", content)]
        if not tokens:
            continue
        saw_host_line = True
        label, spec = _parse_line(tokens, line_no, filename, problems)
        if label is None:
            continue
        here = f"{filename}:{line_no}"
        duplicate = _is_duplicate(label, first_seen, here, line_no, tokens[0][0], problems)
        if spec is not None and not duplicate:
            hosts.append(spec)
            _check_class_bounds(spec, line_no, tokens[0][0], class_bounds, problems)
    if not saw_host_line:
        problems.add(1, 1, "no hosts in this hostfile; expected lines like 'node1 slots=4'")
    problems.raise_if_any()
    return hosts


def parse_inline(spec: str) -> list[HostSpec]:
    """Parse an inline ``-H`` list: comma-separated ``[user@]host[:slots]`` entries.

    Raises:
        HostfileError: with every problem in the list (locations ``-H:1:col``).
    """
    problems = Problems("-H")
    hosts: list[HostSpec] = []
    first_seen: dict[str, str] = {}
    if not spec.strip():
        problems.add(1, 1, f"empty host list; expected {_INLINE_HELP}")
        problems.raise_if_any()
    start = 0
    for entry in spec.split(","):
        entry_col = start + 1
        start += len(entry) + 1
        token = entry.strip()
        col = entry_col + len(entry) - len(entry.lstrip())
        if not token:
            problems.add(1, entry_col, f"empty entry between commas; expected {_INLINE_HELP}")
            continue
        inner_space = re.search(r"\s", token)
        if inner_space:
            problems.add(
                1,
                col + inner_space.start(),
                "space inside an inline entry; expected comma-separated "
                f"{_INLINE_HELP} (use a hostfile for servers=/spare/class=)",
            )
            continue
        before = problems.count()
        part = parse_host_token(token, 1, col, problems, suffix_name="slots")
        slots = 1
        if part is not None and part.suffix is not None:
            value = _parse_int(part.suffix, 1, part.suffix_col, problems, "slots", 1, MAX_SLOTS)
            slots = value if value is not None else 1
        if part is None:
            continue
        here = f"-H:1:{col}"
        duplicate = _is_duplicate(part.hostname, first_seen, here, 1, col, problems)
        if duplicate or problems.count() > before:
            continue
        hosts.append(
            HostSpec(
                label=part.hostname,
                hostname=part.hostname,
                user=part.user,
                slots=slots,
                origin="-H",
            )
        )
    problems.raise_if_any()
    return hosts


def load_hosts(arg: str) -> list[HostSpec]:
    """Resolve a ``-H`` argument: an existing file path, else an inline host list.

    Raises:
        HostfileError: the file is unreadable or bad, the inline list is bad, or
            ``arg`` names a hostfile that does not exist.
    """
    path = Path(arg).expanduser()
    if path.is_file():
        try:
            text = path.read_text(encoding="utf-8-sig")
        except UnicodeDecodeError as err:
            raise HostfileError(
                [f"{arg}: not UTF-8 text (byte {err.start}); expected a plain-text hostfile"]
            ) from err
        except OSError as err:
            raise HostfileError(
                [f"{arg}: cannot read the hostfile ({err.strerror}); check its permissions"]
            ) from err
        return parse_hostfile(text, filename=arg)
    if path.exists():
        raise HostfileError([f"{arg}: is not a regular file; expected a hostfile path"])
    if _looks_inline(arg):
        return parse_inline(arg)
    raise HostfileError(
        [
            f"{arg}: hostfile does not exist; expected the path of an existing hostfile "
            "or an inline list like node1:4,node2:4"
        ]
    )


def _looks_inline(arg: str) -> bool:
    """Whether ``arg`` reads as a host list rather than a file name."""
    if not arg.strip() or re.search(r"\s", arg.strip()):
        return False
    if "/" in arg or "\\" in arg or arg.startswith(("~", ".")):
        return False
    return not arg.lower().endswith(_FILE_SUFFIXES)


def _parse_line(
    tokens: list[tuple[int, str]], line: int, filename: str, problems: Problems
) -> tuple[str | None, HostSpec | None]:
    """Parse one non-blank hostfile line into ``(label, spec)``.

    ``label`` is ``None`` when the host itself is bad; ``spec`` is ``None`` when
    the line had any problem (the label still serves duplicate detection).
    """
    before = problems.count()
    host_col, host_token = tokens[0]
    if "=" in host_token:
        problems.add(
            line, host_col, f"line starts with option {host_token!r}; expected {HOST_HELP} first"
        )
        part = None
    else:
        part = parse_host_token(host_token, line, host_col, problems, suffix_name="port")
    port: int | None = None
    if part is not None and part.suffix is not None:
        port = _parse_int(part.suffix, line, part.suffix_col, problems, "port", 1, 65535)

    values: dict[str, int | float | str | None] = {
        "slots": 1,
        "servers": 0,
        "class": None,
        "gpus": 0,
        "bmin": None,
        "bmax": None,
        "cpus": None,
        "mem": None,
    }
    key_cols: dict[str, int] = {}
    for col, token in tokens[1:]:
        key, eq, value = token.partition("=")
        if key in key_cols:
            problems.add(
                line,
                col,
                f"{key!r} given twice on this line (first at col {key_cols[key]}); "
                "expected each key at most once",
            )
            continue
        if key in _FLAG_KEYS:
            key_cols[key] = col
            if eq:
                problems.add(line, col, f"{key!r} takes no value; expected just '{key}'")
            continue
        if key not in _VALUE_KEYS:
            problems.add(line, col, _unknown_option(token, key, bool(eq)))
            continue
        key_cols[key] = col
        if not eq:
            problems.add(line, col, f"{key!r} needs a value; expected {_VALUE_FORMS[key]}")
            continue
        values[key] = _parse_value(key, value, line, col + len(key) + 1, problems)

    slots, servers = values["slots"], values["servers"]
    if isinstance(slots, int) and isinstance(servers, int) and servers > slots:
        slots_note = "" if "slots" in key_cols else " (the default when slots= is absent)"
        problems.add(
            line,
            key_cols["servers"] + len("servers="),
            f"servers={servers} exceeds slots={slots}{slots_note}; "
            "expected servers <= slots (servers take slots from the same host)",
        )
    bmin, bmax = values["bmin"], values["bmax"]
    if isinstance(bmin, int) and isinstance(bmax, int) and bmin > bmax:
        problems.add(
            line,
            key_cols["bmin"] + len("bmin="),
            f"bmin={bmin} exceeds bmax={bmax}; expected bmin (the device's saturation "
            "batch) <= bmax (the largest batch its memory holds)",
        )
    label = None
    if part is not None and (part.suffix is None or port is not None):
        label = host_label(part, port)
    if label is None or part is None or problems.count() > before:
        return label, None
    gpus = values["gpus"]
    if not isinstance(slots, int) or not isinstance(servers, int) or not isinstance(gpus, int):
        return label, None  # unreachable: each bad value was reported
    device_class = values["class"]
    cpus, mem = values["cpus"], values["mem"]
    return label, HostSpec(
        label=label,
        hostname=part.hostname,
        user=part.user,
        port=port,
        slots=slots,
        servers=servers,
        spare="spare" in key_cols,
        device_class=device_class if isinstance(device_class, str) else None,
        gpus=gpus,
        min_batch=bmin if isinstance(bmin, int) else None,
        max_batch=bmax if isinstance(bmax, int) else None,
        cpus=float(cpus) if isinstance(cpus, int | float) else 0.0,
        memory_bytes=mem if isinstance(mem, int) else 0,
        origin=f"{filename}:{line}",
    )


def _parse_value(
    key: str, value: str, line: int, col: int, problems: Problems
) -> int | float | str | None:
    """Check the value of ``key=value``; ``None`` (and a problem) when bad."""
    if key in ("cpus", "mem"):
        try:
            amount = parse_cpus(value) if key == "cpus" else parse_size(value)
            low, high = (
                (1e-3, MAX_HOST_CPUS) if key == "cpus" else (MIN_HOST_MEMORY, MAX_HOST_MEMORY)
            )
            if not low <= amount <= high:
                raise ValueError(f"{value} is out of range; expected {_VALUE_RANGES[key]}")
        except ValueError as exc:
            problems.add(line, col, f"{key}: {exc}")
            return None
        return amount
    if key == "slots":
        return _parse_int(value, line, col, problems, "slots", 1, MAX_SLOTS)
    if key == "servers":
        return _parse_int(value, line, col, problems, "servers", 0, MAX_SLOTS)
    if key == "gpus":
        return _parse_int(value, line, col, problems, "gpus", 0, MAX_SLOTS)
    if key in ("bmin", "bmax"):
        return _parse_int(value, line, col, problems, key, 1, MAX_DEVICE_BATCH)
    if not _CLASS_RE.fullmatch(value):
        problems.add(
            line,
            col,
            f"invalid class {value!r}; expected a name of letters, digits, '_', '.', '+', '-' "
            "(up to 64 characters, e.g. class=v100)",
        )
        return None
    return value


def _parse_int(
    text: str, line: int, col: int, problems: Problems, what: str, low: int, high: int
) -> int | None:
    """A whole number in ``low..high``; ``None`` (and a problem) otherwise."""
    if not text:
        problems.add(line, col, f"missing {what} value; expected a whole number {low}..{high}")
        return None
    # The length bound keeps int() away from huge digit strings.
    if not _DIGITS_RE.fullmatch(text) or len(text) > 9:
        kind = "too large" if _DIGITS_RE.fullmatch(text) else "not a whole number"
        problems.add(line, col, f"{what} {text!r} is {kind}; expected a whole number {low}..{high}")
        return None
    number = int(text)
    if not low <= number <= high:
        problems.add(line, col, f"{what} {number} is out of range; expected {low}..{high}")
        return None
    return number


def _unknown_option(token: str, key: str, has_value: bool) -> str:
    """Message for a token that is no known option, with a hint when one helps."""
    close = difflib.get_close_matches(key.lower(), [*_VALUE_KEYS, *_FLAG_KEYS], n=1, cutoff=0.6)
    if close:
        hint = f" (did you mean {close[0]!r}?)"
    elif not has_value and hostname_problem(token.split(":")[0]) is None:
        hint = " (one host per line)"
    else:
        hint = ""
    what = f"unknown key {key!r}" if has_value else f"unexpected {token!r}"
    return f"{what}{hint}; expected one of {_OPTIONS_HELP}"


def _is_duplicate(
    label: str, seen: dict[str, str], here: str, line: int, col: int, problems: Problems
) -> bool:
    """Record where ``label`` is defined; report and return True if seen before.

    Same user/hostname/port always yields the same label, so one check covers both.
    """
    earlier = seen.setdefault(label, here)
    if earlier == here:
        return False
    problems.add(
        line,
        col,
        f"duplicate host {label!r}, already defined at {earlier}; expected each host once "
        "(merge the two, or give a second sshd on that machine its own port)",
    )
    return True


def _check_class_bounds(
    spec: HostSpec,
    line: int,
    col: int,
    seen: dict[str, tuple[int | None, int | None, int]],
    problems: Problems,
) -> None:
    """One device class has one pair of batch bounds: AntDT-DD gives every device
    of a class the same micro-batch, so two values would leave one of them wrong."""
    if spec.device_class is None:
        return
    bounds = (spec.min_batch, spec.max_batch)
    first = seen.setdefault(spec.device_class, (*bounds, line))
    if first[:2] == bounds:
        return

    def shown(b: tuple[int | None, int | None]) -> str:
        return " ".join(f"{k}={v}" for k, v in zip(("bmin", "bmax"), b, strict=True) if v)

    problems.add(
        line,
        col,
        f"class={spec.device_class} has {shown(bounds) or 'no bmin/bmax'} here but "
        f"{shown(first[:2]) or 'no bmin/bmax'} on line {first[2]}; expected the same "
        "bmin=/bmax= on every host of a class (they describe the device)",
    )

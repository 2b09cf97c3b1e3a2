"""Resource quantities as people write them: memory sizes (``mem=64G``,
``--memory-limit 512M``), shown back as ``3.0 GiB``, and CPU counts (``cpus=7.5``).

Size suffixes are binary, as ``free -g``, Kubernetes' ``Gi`` and Slurm's ``--mem``
read them: ``K``/``Ki``/``KiB`` = 1024 bytes, ``M`` = 1024², ``G`` = 1024³,
``T`` = 1024⁴; a plain number is bytes. Case does not matter; a trailing ``B``
is allowed. Decimal fractions are allowed with a suffix (``1.5G``).
"""

from __future__ import annotations

import re

__all__ = ["SIZE_HELP", "format_size", "parse_cpus", "parse_size"]

_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_CPUS_RE = re.compile(r"[0-9]+(?:\.[0-9]+)?")
_SIZE_RE = re.compile(r"(?P<number>[0-9]+(?:\.[0-9]+)?)\s*(?P<unit>[kmgt]?)(?:i?b)?", re.I)
SIZE_HELP = "a size such as 512M, 16G or 1.5T (binary units; a plain number is bytes)"


def parse_size(text: str) -> int:
    """Bytes in ``text``; ValueError naming the expected form when it is not a size."""
    match = _SIZE_RE.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"{text!r} is not a size; expected {SIZE_HELP}")
    number, unit = match.group("number"), match.group("unit").lower()
    if "." in number and not unit:
        raise ValueError(f"{text!r}: a fraction of a byte; expected {SIZE_HELP}")
    return int(float(number) * _UNITS[unit]) if "." in number else int(number) * _UNITS[unit]


def parse_cpus(text: str) -> float:
    """A positive number of CPUs (a quota may be fractional); ValueError otherwise."""
    cpus = float(text) if _CPUS_RE.fullmatch(text.strip()) else 0.0
    if not cpus > 0:
        raise ValueError(f"{text!r} is not a number of CPUs; expected e.g. 8 or 0.5")
    return cpus


def format_size(size: int) -> str:
    """``format_size(3 << 30) == "3.0 GiB"``; bytes below 1 KiB as ``"512 B"``."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024:
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"

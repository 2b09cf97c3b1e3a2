"""Host addresses as hostfiles and ``-H`` lists write them: ``[user@]host[:suffix]``.

``host`` is an IPv4 address, an RFC 1123 host name or a bracketed IPv6 address;
the suffix is a port in hostfiles and a slot count inline. Problems are gathered
per input (``Problems``), so that one error names every bad line and column.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field

from dtlaunch.errors import HostfileError

__all__ = [
    "HOST_HELP",
    "HostPart",
    "Problems",
    "host_label",
    "hostname_problem",
    "normal_ipv6",
    "parse_host_token",
]

HOST_HELP = "[user@]host[:port] (e.g. node1, deploy@10.0.0.2:2222, [fd00::1]:2222)"
# POSIX portable user names, plus the trailing '$' Samba machine accounts use.
_USER_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}\$?")
# Only ASCII digits: str.isdigit() would accept '²'.
_DIGITS_RE = re.compile(r"[0-9]+")
_DNS_LABEL_RE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


@dataclass(slots=True)
class Problems:
    """Collects ``source:line:col: message`` strings for one input."""

    source: str
    found: list[tuple[int, int, str]] = field(default_factory=list)

    def add(self, line: int, col: int, message: str) -> None:
        self.found.append((line, col, message))

    def count(self) -> int:
        return len(self.found)

    def raise_if_any(self) -> None:
        """Raise one HostfileError with every problem, in file order."""
        if self.found:
            ordered = sorted(self.found, key=lambda item: (item[0], item[1]))
            raise HostfileError([f"{self.source}:{ln}:{col}: {msg}" for ln, col, msg in ordered])


@dataclass(frozen=True, slots=True)
class HostPart:
    """The ``[user@]host[:suffix]`` token, split and checked."""

    user: str | None
    hostname: str
    is_ipv6: bool
    suffix: str | None  # text after the ':' (port in files, slots inline)
    suffix_col: int


def parse_host_token(
    token: str, line: int, col: int, problems: Problems, *, suffix_name: str
) -> HostPart | None:
    """Split and check ``[user@]host[:suffix]``; ``None`` when it had problems."""
    before = problems.count()
    user: str | None = None
    rest, rest_col = token, col
    if "@" in token:
        user, _, rest = token.partition("@")
        rest_col = col + len(user) + 1
        if not user:
            problems.add(line, col, f"empty user name before '@'; expected {HOST_HELP}")
        elif not _USER_RE.fullmatch(user):
            problems.add(
                line,
                col,
                f"invalid user name {user!r}; expected letters, digits, '_', '.', '-' "
                "(up to 32 characters)",
            )
    suffix: str | None = None
    suffix_col = 0
    if rest.startswith("["):
        close = rest.find("]")
        if close < 0:
            problems.add(
                line,
                rest_col,
                f"unclosed '['; expected [IPv6-address] or [IPv6-address]:{suffix_name}",
            )
            return None
        address, after = rest[1:close], rest[close + 1 :]
        hostname = normal_ipv6(address)
        if hostname is None:
            problems.add(
                line, rest_col + 1, f"invalid IPv6 address {address!r}; expected e.g. [fd00::1]"
            )
        if after.startswith(":"):
            suffix, suffix_col = after[1:], rest_col + close + 2
        elif after:
            problems.add(
                line,
                rest_col + close + 1,
                f"unexpected {after!r} after ']'; expected ':' followed by the {suffix_name}",
            )
        is_ipv6 = True
    else:
        if rest.count(":") > 1:
            problems.add(
                line,
                rest_col,
                f"{rest!r} looks like an IPv6 address without brackets; "
                f"expected [address] or [address]:{suffix_name} (e.g. [fd00::1])",
            )
            return None
        hostname, sep, tail = rest.partition(":")
        if sep:
            suffix, suffix_col = tail, rest_col + len(hostname) + 1
        error = hostname_problem(hostname)
        if error is not None:
            offset, message = error
            problems.add(line, rest_col + offset, message)
        hostname = hostname.lower()  # DNS and ssh_config Host matching ignore case
        is_ipv6 = False
    if hostname is None or problems.count() > before:
        return None
    return HostPart(user, hostname, is_ipv6, suffix, suffix_col)


def normal_ipv6(address: str) -> str | None:
    """The compressed form of an IPv6 address (zone ids kept), or ``None``."""
    try:
        return str(ipaddress.IPv6Address(address))
    except ValueError:
        return None


def hostname_problem(hostname: str) -> tuple[int, str] | None:
    """``(offset, message)`` if ``hostname`` is no IPv4 address / RFC 1123 name."""
    if not hostname:
        return 0, f"missing host name; expected {HOST_HELP}"
    labels = hostname.split(".")
    # An all-numeric last label can only be an IPv4 address (RFC 1123 section 2.1).
    if _DIGITS_RE.fullmatch(labels[-1]):
        try:
            ipaddress.IPv4Address(hostname)
        except ValueError:
            return 0, (
                f"invalid IPv4 address {hostname!r}; expected four numbers 0..255 "
                "without leading zeros, like 10.0.0.1"
            )
        return None
    if len(hostname) > 253:
        return 0, f"host name is {len(hostname)} characters long; expected at most 253"
    offset = 0
    for label in labels:
        if not _DNS_LABEL_RE.fullmatch(label):
            what = f"invalid host name label {label!r}" if label else "empty label"
            return offset, (
                f"{what} in {hostname!r}; expected labels of letters, digits and '-' "
                "(not first or last, at most 63 characters) separated by '.'"
            )
        offset += len(label) + 1
    return None


def host_label(part: HostPart, port: int | None) -> str:
    if port is None:
        return part.hostname
    return f"[{part.hostname}]:{port}" if part.is_ipv6 else f"{part.hostname}:{port}"

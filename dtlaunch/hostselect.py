"""Which hosts of the list a run uses: DeepSpeed's ``--include``/``--exclude``
filters and torchrun's ``--nproc-per-node``, applied to the parsed host list
(``dtlaunch.hostfile``) before placement."""

from __future__ import annotations

import dataclasses
import difflib
import re

from dtlaunch.errors import HostfileError
from dtlaunch.hostfile import HostSpec

__all__ = ["select_hosts", "with_processes_per_host"]


def select_hosts(
    hosts: list[HostSpec], *, include: str | None = None, exclude: str | None = None
) -> list[HostSpec]:
    """The hosts ``--include``/``--exclude`` keep, in hostfile order (DeepSpeed's filters).

    Both take host names separated by ``@`` (DeepSpeed's form) or ``,``; a name is
    a host's label (``node1``, or ``node1:2222`` when it has a port) or its host
    name. Only whole hosts are selected: dtlaunch places processes by ``slots=``.

    Raises:
        HostfileError: a name is no host of the list (the nearest ones are named),
            or no host is left.
    """
    kept = list(hosts)
    for option, text, keep in (("--include", include, True), ("--exclude", exclude, False)):
        if text is None:
            continue
        chosen = _named_hosts(hosts, option, text)
        kept = [h for h in kept if (h.label in chosen) == keep]
    if not kept:
        labels = ", ".join(h.label for h in hosts)
        raise HostfileError([f"--include/--exclude left no host to run on; hosts: {labels}"])
    return kept


def _named_hosts(hosts: list[HostSpec], option: str, text: str) -> set[str]:
    """The labels of the hosts ``text`` names."""
    by_name = {h.label: h.label for h in hosts} | {h.hostname: h.label for h in hosts}
    names = [n.strip() for n in re.split(r"[@,]", text)]
    problems: list[str] = []
    chosen: set[str] = set()
    for name in names:
        if not name:
            problems.append(f"{option} {text!r}: empty host name; expected NAME@NAME or NAME,NAME")
        elif name in by_name:
            chosen.add(by_name[name])
        else:
            nearest = difflib.get_close_matches(name, list(by_name), n=1)
            hint = f" (did you mean {nearest[0]}?)" if nearest else ""
            known = ", ".join(h.label for h in hosts)
            problems.append(f"{option}: {name!r} is not a host of the list{hint}; hosts: {known}")
    if problems:
        raise HostfileError(problems)
    return chosen


def with_processes_per_host(hosts: list[HostSpec], count: int) -> list[HostSpec]:
    """Every host with room for exactly ``count`` workers beside its servers quota:
    ``--nproc-per-node`` (torchrun's meaning) overrides the hostfile's ``slots=``.
    Spare hosts get the same room, as they stand in for a host."""
    return [dataclasses.replace(h, slots=count + h.servers) for h in hosts]

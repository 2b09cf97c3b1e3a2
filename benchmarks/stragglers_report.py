"""Tables and files of ``benchmarks/stragglers.py``'s results (a JSON document
``summarize`` builds there): the worker side and, in a full run, the server side
of AntDT Table III, as text and as Markdown."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

COLUMNS = ("none", "torchrun", "lb-bsp", "nd", "ideal")
OPTIONAL_COLUMNS = ("backup",)  # PS mode, full runs only
SERVER_COLUMNS = ("none", "nd", "ideal")


def _cell(value: float | None) -> str:
    return "failed" if value is None else f"{value:.1f}"


def _speed(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x ({(value - 1) * 100:+.1f}%)"


def table_rows(results: dict[str, Any]) -> list[list[str]]:
    """The worker side: one row per intensity."""
    extra = [c for c in OPTIONAL_COLUMNS if any(c in v for v in results["jct_s"].values())]
    columns = [*COLUMNS, *extra]
    floors = results.get("floor_s", {})  # (absent from results of before it was added)
    header = ["SI", *columns, *(["floor"] if floors else []), "nd speedup vs none", "nd / ideal"]
    if floors:
        header += ["floor / ideal", "none / floor"]
    rows = [header]
    for si, cols in results["jct_s"].items():
        ratio = results["nd_over_ideal"].get(si)
        row = [si, *(_cell(cols.get(c)) for c in columns)]
        if floors:
            row.append(_cell(floors.get(si)))
        row += [
            _speed(results["speedup_nd_over_none"].get(si)),
            "-" if ratio is None else f"{ratio:.3f}",
        ]
        if floors:
            row.append(_ratio(results["floor_over_ideal"].get(si)))
            row.append(_ratio(results["none_over_floor"].get(si)))
        rows.append(row)
    return rows


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def server_rows(results: dict[str, Any]) -> list[list[str]]:
    """The server side (full runs): one row per intensity, [] when not measured."""
    server = results.get("server")
    if not server:
        return []
    rows = [["SI", *SERVER_COLUMNS, "nd speedup vs none"]]
    for si, cols in server["jct_s"].items():
        rows.append(
            [si, *(_cell(cols.get(c)) for c in SERVER_COLUMNS), _speed(server["speedup"].get(si))]
        )
    return rows


def _aligned(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.rjust(w) for cell, w in zip(r, widths, strict=True)) for r in rows]


def _markdown(rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(rows[0]) + " |", "|" + "|".join("---" for _ in rows[0]) + "|"]
    return out + ["| " + " | ".join(r) + " |" for r in rows[1:]]


def render_text(results: dict[str, Any]) -> str:
    lines = ["JCT in seconds (training time, start to end), 8 workers on loopback hosts"]
    lines += _aligned(table_rows(results))
    servers = server_rows(results)
    if servers:
        lines += ["", "Server stragglers (PS mode, 2 servers, one slowed):", *_aligned(servers)]
    lines += _notes(results)
    return "\n".join(lines)


def render_markdown(results: dict[str, Any]) -> str:
    out = [
        f"# Straggler benchmark ({results['mode']}, {results['date']}, {results['cpus']} CPUs)",
        "",
        "AntDT Table III, worker side: JCT in seconds (training time, start to end; "
        "wall time with start-up in the JSON).",
        "",
        *_markdown(table_rows(results)),
    ]
    servers = server_rows(results)
    if servers:
        out += [
            "",
            "AntDT Table III, server side: one of 2 parameter servers slowed (PS mode, BSP).",
            "",
            *_markdown(servers),
        ]
    out += ["", *(f"- {n.strip()}" for n in _notes(results)), ""]
    return "\n".join(out)


def _notes(results: dict[str, Any]) -> list[str]:
    notes = []
    over = results.get("overhead")
    if over:
        notes.append(
            f"controller overhead without stragglers: nd / none = {over['jct_ratio']} (JCT), "
            f"{over['wall_ratio']} (wall), medians of {over['pairs']} runs each"
        )
    for name, met in results["targets"].items():
        notes.append(f"target {name}: {'met' if met else 'NOT met'}")
    if results.get("floor_s"):
        notes.append(
            "floor: an oracle's training time (the persistent straggler on a spare from "
            "the first step, every transient one balanced perfectly at once; "
            "benchmarks/stragglers.py oracle_floor): no policy's nd / ideal is below "
            "floor / ideal, nor its speedup over none above none / floor"
        )
    sc = results["scenario"]
    notes.append(
        f"policies: {sc['nd']} | {sc['lb_bsp']} | --control-interval {sc['control_interval_s']}"
    )
    if any("backup" in v for v in results["jct_s"].values()):
        notes.append(
            f"backup: {sc['backup']} in PS mode (1 server; the other columns use allreduce)"
        )
    return notes


def write_results(results: dict[str, Any], out: Path) -> Path:
    """Write the JSON to ``out`` and the Markdown table beside it; returns the .md path."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    md = out.with_suffix(".md")
    md.write_text(render_markdown(results))
    return md

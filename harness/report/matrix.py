"""The report of a scenario: a group x path grid of verdicts (e.g. architecture x path for
the zoo), then one row per cell, linking each cell group's own report."""

from __future__ import annotations

import json
from html import escape
from pathlib import Path

from harness.pipeline import Evaluation
from harness.report.summary import md_text
from harness.scenario import CellGroup
from harness.store import SCHEMA_VERSION, write_atomic


def matrix_summary(scenario: str, results: list[tuple[CellGroup, Evaluation]]) -> dict:
    cells = {}
    for group, ev in results:
        for v in ev.verdicts:
            cells[f"{v.path}[{group.id}]"] = {"verdict": v.status.value, "group": group.id, "path": v.path,
                                             "reasons": list(v.reasons[:3])}
    codes = [ev.exit_code for _, ev in results]
    exit_code = 2 if 2 in codes else max(codes, default=0)
    grid = {g.id: {v.path: v.status.value for v in ev.verdicts} for g, ev in results}
    return {"schema_version": SCHEMA_VERSION, "scenario": scenario, "exit_code": exit_code, "cells": cells,
            "groups": {g.id: f"{g.id}/index.html" for g, _ in results}, "grid": grid,
            "control_tensors": {g.id: ev.record.checkpoints.control_tensor for g, ev in results if ev.record}}


def _grid(summary: dict) -> tuple[str, list[str]]:
    """(HTML table, Markdown lines) of the group x path grid."""
    grid = summary.get("grid") or {}
    paths = list(dict.fromkeys(p for row in grid.values() for p in row))
    head = "".join(f"<th><code>{escape(p)}</code></th>" for p in paths)
    rows = "".join(
        f"<tr><th>{_link(summary['groups'][g], g)}</th>"
        + "".join(f"<td class='{escape(row.get(p, ''))}'>{escape(row.get(p, ''))}</td>" for p in paths) + "</tr>"
        for g, row in grid.items())
    md = ["| cell group | " + " | ".join(md_text(p) for p in paths) + " |", "|---" * (len(paths) + 1) + "|"]
    md += [f"| {md_text(g)} | " + " | ".join(row.get(p, "") for p in paths) + " |" for g, row in grid.items()]
    return f"<table id='grid'><tr><th></th>{head}</tr>{rows}</table>", md


def write_matrix(out: Path, summary: dict) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "summary.json", json.dumps(summary, indent=2))
    rows = "".join(
        f"<tr><td><code>{escape(cell)}</code></td><td class='{escape(c['verdict'])}'>{escape(c['verdict'])}</td>"
        f"<td>{_link(summary['groups'][c['group']], c['group'])}</td>"
        f"<td>{'<br>'.join(escape(r) for r in c['reasons'])}</td></tr>"
        for cell, c in summary["cells"].items())
    css = ("body{font:14px system-ui,sans-serif;margin:2rem}td,th{border:1px solid #ccd;padding:.25rem .5rem}"
           "table{border-collapse:collapse}.PASS{background:#d9f2dd}.FAIL,.ERROR{background:#f9d6d5}"
           ".INCONCLUSIVE,.XPASS{background:#fbefc8}.SKIPPED,.XFAIL{background:#e6e6e6}")
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>refit-harness: {escape(summary['scenario'])}"
            f"</title><style>{css}</style></head><body><h1>Scenario <code>{escape(summary['scenario'])}</code></h1>"
            f"{_grid(summary)[0]}<h2>Cells</h2><table id='cells'><tr><th>cell</th><th>verdict</th><th>report</th><th>reasons</th></tr>{rows}</table>"
            "</body></html>")
    write_atomic(out / "index.html", page)
    lines = [f"## refit-harness scenario {md_text(summary['scenario'])}", "", *_grid(summary)[1], "",
             "| cell | verdict |", "|---|---|"]
    lines += [f"| {md_text(cell)} | {c['verdict']} |" for cell, c in summary["cells"].items()]
    write_atomic(out / "summary.md", "\n".join(lines) + "\n")
    return out / "index.html"


def _link(href: str, text: str) -> str:
    """A link to a cell group's own report: a relative path inside the run directory only.
    Group ids come from model labels, so ``javascript:...`` or ``https://...`` is possible;
    those are shown as text. The path is percent-encoded segment by segment."""
    from urllib.parse import quote, urlsplit

    parts = urlsplit(href)
    if parts.scheme or parts.netloc or href.startswith(("/", "\\")) or ".." in href.split("/"):
        return escape(text)
    return f"<a href='{escape(quote(href, safe='/'))}'>{escape(text)}</a>"

"""The report of a scenario: a group x path grid of verdicts (e.g. architecture x path for
the zoo), then one row per cell (x builds), linking each cell group's own report and, with
several builds, each group's comparison."""

from __future__ import annotations

import json
from pathlib import Path

from harness.judge import exit_codes
from harness.judge.evaluation import Evaluation
from harness.report.markdown import md_code, md_text
from harness.report.render import ENV, render
from harness.report.style import REPORT_SCHEMA_VERSION
from harness.run_dir import INDEX_HTML, RunDir
from harness.spec.engine_config import shown_items
from harness.spec.scenario import CellGroup
from harness.store import write_atomic

Results = list[tuple[CellGroup, Evaluation]]


def matrix_summary(
    scenario: str, results: Results | dict[str, Results], comparisons: dict[str, tuple[str, int]] | None = None
) -> dict:
    """``results``: one list of (group, evaluation), or one per build name (run order);
    ``comparisons``: group id -> (link to its comparison page, its exit code)."""
    per_build = results if isinstance(results, dict) else {"": results}
    builds = [b for b in per_build if b]
    cells: dict[str, dict] = {}
    groups: dict[str, str] = {}
    grid: dict[str, dict[str, str]] = {}
    control_tensors: dict[str, str] = {}
    engine_args: dict[str, list[str]] = {}
    codes = []
    for build, runs in per_build.items():
        for group, ev in runs:
            groups.setdefault(group.id, f"{build}/{group.id}/{INDEX_HTML}" if build else f"{group.id}/{INDEX_HTML}")
            codes.append(ev.exit_code)
            if ev.record:
                control_tensors[group.id] = ev.record.checkpoints.control_tensor
                engine_args[group.id] = shown_items(ev.record.spec.engine.engine_args)
            for v in ev.verdicts:
                cell = cells.setdefault(
                    f"{v.path}[{group.id}]", {"group": group.id, "path": v.path, "builds": {}, "links": {}}
                )
                cell["builds"][build] = v.shown
                cell["links"][build] = f"{build}/{group.id}/{INDEX_HTML}" if build else f"{group.id}/{INDEX_HTML}"
                # one build: its verdict; several: the build under review (the last one) decides
                cell["verdict"] = v.shown
                cell["earned"] = v.earned
                cell["reasons"] = list(v.reasons[:3])
                cell["headline"] = v.headline
                grid.setdefault(group.id, {})[v.path] = v.shown
    # With builds, expectations decide; an engine that could not run (2) still wins.
    exit_code = exit_codes.combined(codes, [code for _, code in comparisons.values()] if comparisons else None)
    from harness.report.provenance import scenario_provenance

    return {
        "schema_version": REPORT_SCHEMA_VERSION,
        "scenario": scenario,
        "provenance": scenario_provenance((ev for runs in per_build.values() for _, ev in runs), builds),
        "exit_code": exit_code,
        "builds": builds,
        "cells": cells,
        "groups": groups,
        "grid": grid,
        "control_tensors": control_tensors,
        "engine_args": engine_args,
        "comparisons": {
            g: {"link": link, "expectations_met": code == 0} for g, (link, code) in (comparisons or {}).items()
        },
    }


def safe_href(href: str) -> str | None:
    """A link to a report inside the run directory, percent-encoded; None for anything else.
    Group ids come from model labels, so ``javascript:...`` or ``https://...`` is possible:
    such a link is shown as text."""
    from urllib.parse import quote, urlsplit

    parts = urlsplit(href)
    if parts.scheme or parts.netloc or href.startswith(("/", "\\")) or ".." in href.split("/"):
        return None
    return quote(href, safe="/")


ENV.filters["safe_href"] = safe_href


def write_matrix(out: Path, summary: dict) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    d = RunDir(out)
    write_atomic(d.summary_json, json.dumps(summary, indent=2))
    columns = summary.get("builds") or [""]
    paths = list(dict.fromkeys(p for row in summary.get("grid", {}).values() for p in row))
    page = render("matrix.html.j2", s=summary, columns=columns, paths=paths)
    write_atomic(d.index_html, page)
    write_atomic(d.summary_md, _markdown(summary, columns, paths))
    return d.index_html


def _args_md(summary: dict, group: str) -> str:
    args = (summary.get("engine_args") or {}).get(group) or []
    return (" (" + " ".join(md_code(a) for a in args) + ")") if args else ""


def _markdown(summary: dict, columns: list[str], paths: list[str]) -> str:
    from harness.report.provenance import provenance_markdown

    lines = [
        f"## refit-harness scenario {md_text(summary['scenario'])}",
        "",
        *provenance_markdown(summary.get("provenance") or {}),
    ]
    if summary.get("grid"):
        lines += ["| cell group | " + " | ".join(md_text(p) for p in paths) + " |", "|---" * (len(paths) + 1) + "|"]
        lines += [
            f"| {md_text(g)}{_args_md(summary, g)} | " + " | ".join(row.get(p, "—") for p in paths) + " |"
            for g, row in summary["grid"].items()
        ]
        lines.append("")
    head = " | ".join(md_text(c) for c in columns) if summary.get("builds") else "verdict"
    lines += [f"| cell | {head} |", "|---|" + "---|" * len(columns)]
    lines += [
        f"| {md_text(cell)} | " + " | ".join(c["builds"].get(b, "—") for b in columns) + " |"
        for cell, c in summary["cells"].items()
    ]
    for g, c in summary.get("comparisons", {}).items():
        lines.append(
            f"\nComparison {md_text(g)}: expectations {'met' if c['expectations_met'] else '**NOT met**'} "
            f"({md_text(c['link'])})"
        )
    return "\n".join(lines) + "\n"

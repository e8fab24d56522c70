"""Reports, built from an ``Evaluation`` (records on disk), never from live engines."""

from __future__ import annotations

from pathlib import Path

from harness.judge.evaluation import Evaluation
from harness.report.html import render_html
from harness.report.repro import repro_script
from harness.report.style import REPORT_SCHEMA_VERSION
from harness.report.summary import render_markdown, summary_dict
from harness.report.tables import accuracy_table, consumed_table, csv_text, hook_table, tensor_table, token_table
from harness.run_dir import RUN_TABLES, RunDir
from harness.store import write_atomic


def write_reports(ev: Evaluation, out: Path) -> dict[str, Path]:
    import json

    out.mkdir(parents=True, exist_ok=True)
    d = RunDir(out)
    files = {p.name: p for p in (d.index_html, d.summary_json, d.summary_md, *map(d.table, RUN_TABLES))}
    tensors, tokens, consumed, hooks = tensor_table(ev), token_table(ev), consumed_table(ev), hook_table(ev)
    # Every file is written whole or not at all (temp + fsync + rename): an interrupted or
    # disk-full run never leaves a truncated report that looks complete.
    for name, table in zip(RUN_TABLES, (tensors, tokens, consumed, hooks, accuracy_table(ev)), strict=True):
        write_atomic(d.table(name), csv_text(table))
    summary = summary_dict(ev)
    write_atomic(d.summary_json, json.dumps(summary, indent=2, default=str))
    write_atomic(d.summary_md, render_markdown(ev, summary))
    write_atomic(d.index_html, render_html(ev, summary, tensors, tokens, consumed, hooks))
    script = repro_script(ev)  # a FAIL/XFAIL, reproducible with vLLM (and the plugin for a fixture)
    if script is not None:
        files[d.repro.name] = write_atomic(d.repro, script)
    return files


__all__ = ["write_reports", "REPORT_SCHEMA_VERSION"]

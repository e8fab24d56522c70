"""Reports, built from an ``Evaluation`` (records on disk), never from live engines."""

from __future__ import annotations

from pathlib import Path

from harness.judge.evaluation import Evaluation
from harness.report.html import render_html
from harness.report.repro import repro_script
from harness.report.style import REPORT_SCHEMA_VERSION
from harness.report.summary import render_markdown, summary_dict
from harness.report.tables import accuracy_table, consumed_table, csv_text, hook_table, tensor_table, token_table
from harness.store import write_atomic


def write_reports(ev: Evaluation, out: Path) -> dict[str, Path]:
    import json

    out.mkdir(parents=True, exist_ok=True)
    names = (
        "index.html",
        "summary.json",
        "summary.md",
        "tensors.csv",
        "tokens.csv",
        "consumed.csv",
        "hooks.csv",
        "accuracy.csv",
    )
    files = {name: out / name for name in names}
    tensors, tokens, consumed, hooks = tensor_table(ev), token_table(ev), consumed_table(ev), hook_table(ev)
    # Every file is written whole or not at all (temp + fsync + rename): an interrupted or
    # disk-full run never leaves a truncated report that looks complete.
    for name, table in (
        ("tensors.csv", tensors),
        ("tokens.csv", tokens),
        ("consumed.csv", consumed),
        ("hooks.csv", hooks),
        ("accuracy.csv", accuracy_table(ev)),
    ):
        write_atomic(files[name], csv_text(table))
    summary = summary_dict(ev)
    write_atomic(files["summary.json"], json.dumps(summary, indent=2, default=str))
    write_atomic(files["summary.md"], render_markdown(ev, summary))
    write_atomic(files["index.html"], render_html(ev, summary, tensors, tokens, consumed, hooks))
    script = repro_script(ev)  # a FAIL/XFAIL, reproducible with vLLM (and the plugin for a fixture)
    if script is not None:
        files["repro.py"] = out / "repro.py"
        write_atomic(files["repro.py"], script)
    return files


__all__ = ["write_reports", "REPORT_SCHEMA_VERSION"]

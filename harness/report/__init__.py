"""Reports, built from an ``Evaluation`` (records on disk), never from live engines."""

from __future__ import annotations

from pathlib import Path

from harness.pipeline import Evaluation
from harness.report.html import render_html
from harness.report.repro import repro_script
from harness.report.summary import render_markdown, summary_dict
from harness.report.tables import consumed_table, hook_table, tensor_table, token_table
from harness.store import SCHEMA_VERSION


def write_reports(ev: Evaluation, out: Path) -> dict[str, Path]:
    import json

    out.mkdir(parents=True, exist_ok=True)
    names = ("index.html", "summary.json", "summary.md", "tensors.csv", "tokens.csv", "consumed.csv", "hooks.csv")
    files = {name: out / name for name in names}
    tensors, tokens, consumed, hooks = tensor_table(ev), token_table(ev), consumed_table(ev), hook_table(ev)
    for name, table in (("tensors.csv", tensors), ("tokens.csv", tokens), ("consumed.csv", consumed), ("hooks.csv", hooks)):
        table.to_csv(files[name], index=False)
    summary = summary_dict(ev)
    files["summary.json"].write_text(json.dumps(summary, indent=2, default=str))
    files["summary.md"].write_text(render_markdown(ev, summary))
    files["index.html"].write_text(render_html(ev, summary, tensors, tokens, consumed, hooks))
    script = repro_script(ev)  # a stock model's FAIL/XFAIL, reproducible with vLLM alone
    if script is not None:
        files["repro.py"] = out / "repro.py"
        files["repro.py"].write_text(script)
    return files


__all__ = ["write_reports", "SCHEMA_VERSION"]

"""index.html: one self-contained page (inline CSS, no scripts, no network)."""

from __future__ import annotations

from html import escape
from typing import Any

import pandas as pd

from harness.pipeline import Evaluation
from harness.report.style import CSS

def render_html(ev: Evaluation, summary: dict[str, Any], tensors: pd.DataFrame, tokens: pd.DataFrame,
                consumed: pd.DataFrame, hooks: pd.DataFrame) -> str:
    parts = [f"<h1>refit-harness report</h1><p class='muted'>Oracle: warm A→B through each path vs a cold start "
             f"on B, with cold A as witness. Started {escape(ev.record.started)}.</p>",
             _verdicts(summary), _first_divergences(summary), _control(summary), _sabotage(summary), _accuracy(summary), _noise(summary),
             _unobserved(summary), _non_ok(tensors), _consumed(consumed), _hooks(hooks), _tokens(tokens), _arms(summary),
             _environment(summary)]
    return ("<!doctype html><html lang='en'><head><meta charset='utf-8'><title>refit-harness report</title>"
            f"<style>{CSS}</style></head><body>{''.join(parts)}</body></html>")


def _table(headers: list[str], rows: list[list[str]], row_classes: list[str] | None = None) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join(
        f"<tr class='{(row_classes or [''] * len(rows))[i]}'>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>"
        for i, row in enumerate(rows))
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _badge(status: str) -> str:
    return f"<span class='badge {escape(status)}'>{escape(status)}</span>"


def _verdicts(summary: dict[str, Any]) -> str:
    rows = []
    for name, p in summary["paths"].items():
        ctl = p.get("positive_control")
        ctl_text = "—" if ctl is None else ("detected" if ctl["detected"] else "<b>missed</b>")
        reasons = "<br>".join(escape(r) for r in p["reasons"]) or "—"
        rows.append([f"<code>{escape(name)}</code>", _badge(p["verdict"]), ctl_text, reasons])
    return "<section id='verdicts'><h2>Verdicts</h2>" + _table(["path", "verdict", "positive control", "reasons"], rows) + "</section>"


def _first_divergences(summary: dict[str, Any]) -> str:
    items = []
    for name, p in summary["paths"].items():
        lines = [f"first divergent kernel input: <code>{escape(p['first_divergent_kernel_input'])}</code>"
                 if p.get("first_divergent_kernel_input") else "",
                 f"first divergent tensor: <code>{escape(p['first_divergent_tensor'])}</code>"
                 if p.get("first_divergent_tensor") else ""]
        if any(lines):
            items.append(f"<div class='first'><b>{escape(name)}</b>: " + "<br>".join(x for x in lines if x) + "</div>")
    if not items:
        return "<section id='first-divergence'><h2>First divergence</h2><p>No tensor differs after any refit.</p></section>"
    return "<section id='first-divergence'><h2>First divergence</h2>" + "".join(items) + "</section>"


def _control(summary: dict[str, Any]) -> str:
    rows = []
    for name, p in summary["paths"].items():
        ctl = p.get("positive_control")
        if ctl is None:
            continue
        rows.append([f"<code>{escape(name)}</code>", _badge("OK" if ctl["detected"] else "FAIL"),
                     f"<code>{escape(ctl['checkpoint_tensor'])}</code>",
                     "<br>".join(f"<code>{escape(m)}</code>" for m in ctl["expected_modules"]),
                     "<br>".join(f"<code>{escape(t)}</code>" for t in ctl["localized_to"]) or "—",
                     "yes" if ctl["tokens_moved"] else "<b>no</b>", f"{ctl['max_logprob_shift']:.3g}"])
    return ("<section id='positive-control'><h2>Positive control</h2><p class='muted'>B′ = B with one checkpoint "
            "tensor scaled. Warm B′ vs warm B must differ at the module that tensor loads into; otherwise the "
            "verdict is INCONCLUSIVE.</p>"
            + f"<p>Scaled tensor: <code>{escape(summary['checkpoints']['control_tensor'])}</code>, "
            f"{escape(summary['checkpoints'].get('control_reason') or 'given')}.</p>"
            + _table(["path", "detected", "scaled tensor", "expected modules", "seen at", "outputs moved",
                      "max logprob shift"], rows) + "</section>")


def _sabotage(summary: dict[str, Any]) -> str:
    rows = []
    for name, p in summary["paths"].items():
        so = p.get("sabotage")
        if so is None:
            continue
        rows.append([f"<code>{escape(name)}</code>", _badge("OK" if so["caught"] else "FAIL"), escape(so["sabotage"]),
                     _badge(so["twin_verdict"]), escape(so["detail"])])
    if not rows:
        return ("<section id='sabotage'><h2>Sabotage controls</h2><p class='muted'>Not run (use --sabotage): no path "
                "has shown here that it could fail.</p></section>")
    return ("<section id='sabotage'><h2>Sabotage controls</h2><p class='muted'>Each path's sabotaged twin skips or "
            "breaks the one step the path exists for, in the same engine. It must FAIL with what it planted; "
            "otherwise the path's PASS is INCONCLUSIVE.</p>"
            + _table(["path", "caught", "sabotage", "twin verdict", "evidence"], rows) + "</section>")


def _accuracy(summary: dict[str, Any]) -> str:
    acc = summary.get("accuracy")
    if not acc:
        return ""
    rows = [[f"<code>{escape(p['point'])}</code>", escape(p["arm"]), f"{p['correct']}/{p['total']}",
             f"{p['invalid']}/{p['total']}", escape(p["status"] or "—")] for p in acc["points"]]
    classes = ["FAIL" if p["status"] == "differs from cold B" else "" for p in acc["points"]]
    power = ("" if acc["discriminating_power"] else
             "<p class='first'><b>No discriminating power:</b> the damaged copy of B scores no lower than cold B, "
             "so this eval cannot tell a broken model from a good one. No accuracy result here is a pass.</p>")
    return ("<section id='accuracy'><h2>Accuracy (--accuracy)</h2><p class='muted'>Exact match of the completion's "
            f"first line over {acc['items']} item(s) of <code>{escape(acc['file'])}</code>; invalid: an empty first "
            f"line. Tokenizer: {escape(', '.join(acc['tokenizer']) or '?')}. Full list in accuracy.csv.</p>"
            f"<p>Outcome: <b>{escape(acc['outcome'])}</b></p>{power}"
            + _table(["point", "arm", "correct", "invalid", "status"], rows, classes) + "</section>")


def _noise(summary: dict[str, Any]) -> str:
    nf = summary["noise_floor"]
    rows = [[escape(k), "identical" if v["first_divergence"] is None else escape(str(v["first_divergence"])),
             f"{v['max_logprob_diff']:.3g}"] for k, v in nf["tokens"].items()]
    tensors = ", ".join(f"<code>{escape(t)}</code>" for t in nf["differing_tensors"]) or "none"
    return ("<section id='noise-floor'><h2>Noise floor (cold B vs cold B)</h2>"
            f"<p>Tensors that differ between two cold starts (not judged): {tensors}</p>"
            + _table(["prompt", "first divergence", "max logprob diff"], rows) + "</section>")


def _unobserved(summary: dict[str, Any]) -> str:
    u = summary.get("unobserved") or {"count": 0, "items": []}
    if not u["count"]:
        return ""
    rows = [[f"<code>{escape(i['name'])}</code>", escape(i["kind"]), escape(i["reason"]),
             ", ".join(escape(a) for a in i["arms"])] for i in u["items"]]
    return (f"<section id='unobserved'><h2>Unobserved ({u['count']})</h2><p class='muted'>Reached by the census "
            "but impossible to observe here, so never judged; the rest of each observation went on.</p>"
            + _table(["name", "kind", "reason", "arms"], rows) + "</section>")


def _non_ok(tensors: pd.DataFrame) -> str:
    """Rows that decide a verdict first; not-judged (NOISY, UNJUDGEABLE) and reported-only
    (REBOUND) rows folded away. Sabotaged twins have their own section."""
    own = tensors[~tensors["path"].str.contains("~", regex=False)]
    bad = own[(own["status"] != "OK") & (own["check"] != "noise")]
    deciding = bad["status"].isin(["STALE", "CORRUPT", "MISSING", "EXTRA"])

    def rows(frame: pd.DataFrame) -> list[list[str]]:
        return [[f"<code>{escape(r.path)}</code>", escape(r.check), f"<code>{escape(r.tensor)}</code>", escape(r.kind),
                 _badge(r.status), "yes" if r.address_moved else "no"] for r in frame.itertuples()]

    headers = ["path", "check", "tensor", "kind", "status", "address moved"]
    body = _table(headers, rows(bad[deciding])) if deciding.any() else "<p>No tensor decides a verdict: all OK.</p>"
    rest = bad[~deciding]
    if len(rest):
        body += (f"<details><summary>{len(rest)} tensor(s) not judged or only reported "
                 f"({', '.join(sorted(set(rest['status'])))})</summary>{_table(headers, rows(rest))}</details>")
    refit = own[own["check"] == "refit"]
    unjudgeable = int((refit["status"] == "UNJUDGEABLE").sum())
    return (f"<section id='tensors'><h2>Non-OK tensors</h2><p class='muted'>{len(refit)} tensor(s) compared after "
            f"refit over all paths, {unjudgeable} of them UNJUDGEABLE (equal before and after the refit, so they could "
            f"not show a refit that missed them); full list in tensors.csv.</p>{body}</section>")


def _consumed(consumed: pd.DataFrame) -> str:
    bad = consumed[~consumed["status"].isin(["OK", "NOISY", "UNJUDGEABLE"])
                   & ~consumed["path"].str.contains("~", regex=False)]
    rows = [[f"<code>{escape(r.path)}</code>", str(r.op_index), f"<code>{escape(r.op)}</code>", str(r.arg),
             f"<code>{escape(r.module)}</code>", f"<code>{escape(r.tensor)}</code>", _badge(r.status)]
            for r in bad.itertuples()]
    body = (_table(["path", "op #", "op", "arg", "module", "kernel input", "status"], rows) if rows
            else "<p>Every recorded kernel input matches cold B.</p>")
    noisy = int((consumed["status"] == "NOISY").sum())
    return (f"<section id='consumed'><h2>Kernel inputs (recorded forward)</h2><p class='muted'>Persistent tensors the "
            f"ops read during one prefill, warm vs cold B; {len(consumed)} recorded, {noisy} noisy (differ between two "
            f"cold starts, e.g. opaque kernel handles). Full list in consumed.csv.</p>{body}</section>")


def _hooks(hooks: pd.DataFrame) -> str:
    rows = [[f"<code>{escape(r.path)}</code>", f"<code>{escape(r.module)}</code>", escape(r.kind),
             "yes" if r.runs_on_refit else "<b>no</b>",
             " ".join(f"<code>{escape(t)}</code>" for t in str(r.stale_derived).split() if t != "nan") or "—"]
            for r in hooks.itertuples()]
    return ("<section id='hooks'><h2>Post-load hooks per path</h2><p class='muted'>Hooks found on the live model; "
            "whether the path's refit ran them (observed by wrapping them in the worker), and derived tensors "
            "under each that the refit left stale.</p>"
            + _table(["path", "module", "hook", "runs on refit", "stale derived tensors"], rows) + "</section>")


def _tokens(tokens: pd.DataFrame) -> str:
    rows = []
    classes = []
    for r in tokens[tokens["check"] != "noise"].itertuples():
        diverged = not pd.isna(r.first_divergence)
        rows.append([f"<code>{escape(r.path)}</code>", escape(r.check), str(r.prompt),
                     escape(str(r.first_divergence)) if diverged else "identical", f"{r.max_logprob_diff:.3g}",
                     f"<span class='mono'>{escape(r.subject_tokens)}</span>",
                     f"<span class='mono'>{escape(r.reference_tokens)}</span>"])
        classes.append("FAIL" if diverged else "")
    return ("<section id='tokens'><h2>Greedy tokens</h2>"
            + _table(["path", "check", "prompt", "first divergence", "max logprob diff", "subject", "reference"],
                     rows, classes) + "</section>")


def _arms(summary: dict[str, Any]) -> str:
    rows = [[escape(a["arm"]), escape(a["role"]), escape(", ".join(a["paths"]) or "—"), _badge("OK" if a["status"] == "ok" else "ERROR"),
             f"{a['seconds']:.0f} s" + (" (reused)" if a.get("reused") else ""),
             escape(", ".join(a["observations"])), escape(a["error"] or "")]
            for a in summary["arms"]]
    ref = summary.get("reference") or {}
    note = (f"<p>reused reference <code>{escape(ref['key'])}</code>: the cold-B reference and noise arms were not "
            f"run again. Engine cold starts in this run: {summary['cold_starts']}.</p>" if ref.get("reused")
            else f"<p class='muted'>Engine cold starts in this run: {summary.get('cold_starts', '?')}.</p>")
    return "<section id='arms'><h2>Arms</h2>" + note + _table(["arm", "role", "paths", "status", "time", "observed", "error"], rows) + "</section>"


def _environment(summary: dict[str, Any]) -> str:
    env = {**summary["environment"], **{f"checkpoint {k}": v for k, v in summary["checkpoints"].items()}}
    rows = [[escape(k), f"<code>{escape(str(v))}</code>"] for k, v in env.items()]
    return "<section id='environment'><h2>Environment</h2>" + _table(["", ""], rows) + "</section>"

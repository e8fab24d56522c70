"""Flat tables of the comparisons, for CSV and the HTML page."""

from __future__ import annotations

import pandas as pd

from harness.judge.evaluation import Evaluation
from harness.report.style import REPORT_SCHEMA_VERSION

TENSOR_COLUMNS = [
    "schema_version",
    "path",
    "check",
    "tensor",
    "kind",
    "status",
    "address_moved",
    "subject_digest",
    "reference_digest",
    "witness_digest",
]
TOKEN_COLUMNS = [
    "schema_version",
    "path",
    "check",
    "prompt",
    "first_divergence",
    "max_logprob_diff",
    "subject_tokens",
    "reference_tokens",
    "subject_text",
    "reference_text",
]


def tensor_table(ev: Evaluation) -> pd.DataFrame:
    rows = [
        {
            "schema_version": REPORT_SCHEMA_VERSION,
            "path": c.path,
            "check": d.check,
            "tensor": d.tensor,
            "kind": d.kind,
            "status": d.status.value,
            "address_moved": d.address_moved,
            "subject_digest": d.subject_digest,
            "reference_digest": d.reference_digest,
            "witness_digest": d.witness_digest,
        }
        for c in ev.comparisons
        for d in c.tensors
    ]
    return pd.DataFrame(rows, columns=TENSOR_COLUMNS)


def token_table(ev: Evaluation) -> pd.DataFrame:
    rows = [
        {
            "schema_version": REPORT_SCHEMA_VERSION,
            "path": c.path,
            "check": d.check,
            "prompt": d.prompt,
            "first_divergence": d.first_divergence,
            "max_logprob_diff": d.max_logprob_diff,
            "subject_tokens": " ".join(map(str, d.subject_tokens)),
            "reference_tokens": " ".join(map(str, d.reference_tokens)),
            "subject_text": d.subject_text,
            "reference_text": d.reference_text,
        }
        for c in ev.comparisons
        for d in c.tokens
    ]
    df = pd.DataFrame(rows, columns=TOKEN_COLUMNS)
    df["first_divergence"] = df["first_divergence"].astype("Int64")  # keep ints with gaps, not floats
    return df


CONSUMED_COLUMNS = ["schema_version", "path", "op_index", "op", "arg", "module", "tensor", "status"]
HOOK_COLUMNS = ["schema_version", "path", "module", "kind", "runs_on_refit", "stale_derived"]


def consumed_table(ev: Evaluation) -> pd.DataFrame:
    rows = [
        {
            "schema_version": REPORT_SCHEMA_VERSION,
            "path": c.path,
            "op_index": d.op_index,
            "op": d.op,
            "arg": d.arg,
            "module": d.module,
            "tensor": d.tensor,
            "status": d.status.value,
        }
        for c in ev.comparisons
        for d in c.consumed
    ]
    return pd.DataFrame(rows, columns=CONSUMED_COLUMNS)


def hook_table(ev: Evaluation) -> pd.DataFrame:
    rows = [
        {
            "schema_version": REPORT_SCHEMA_VERSION,
            "path": c.path,
            "module": h.module,
            "kind": h.kind,
            "runs_on_refit": h.runs,
            "stale_derived": " ".join(h.stale_derived),
        }
        for c in ev.comparisons
        for h in c.hooks
    ]
    return pd.DataFrame(rows, columns=HOOK_COLUMNS)


ACCURACY_COLUMNS = [
    "schema_version",
    "point",
    "arm",
    "item",
    "prompt",
    "answer",
    "completion",
    "given",
    "correct",
    "invalid",
]


def accuracy_table(ev: Evaluation) -> pd.DataFrame:
    """One row per accuracy item per measured point (``--accuracy``; empty without it)."""
    from harness.judge.accuracy import extract_answer

    spec = ev.record.spec.accuracy
    rows = []
    for a in ev.arms if spec else ():
        assert spec is not None
        for c in a.completions:
            for i, (prompt, answer, text) in enumerate(zip(spec.prompts, spec.answers, c.texts)):
                given = extract_answer(text)
                rows.append(
                    {
                        "schema_version": REPORT_SCHEMA_VERSION,
                        "point": c.label.point,
                        "arm": a.arm,
                        "item": i,
                        "prompt": prompt,
                        "answer": answer,
                        "completion": text,
                        "given": given,
                        "correct": given == answer.strip(),
                        "invalid": not given,
                    }
                )
    return pd.DataFrame(rows, columns=ACCURACY_COLUMNS)


# A spreadsheet runs a cell that starts with one of these as a formula (OWASP "CSV injection").
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def neutralise_formula(value):
    """Prefix a quote to a text cell a spreadsheet would run as a formula (``=cmd|' /C calc'!A0``);
    model labels, tensor names and error texts come from checkpoints and engines, not from us."""
    if isinstance(value, str) and value.startswith(_FORMULA_START):
        return "'" + value
    return value


def csv_text(table: pd.DataFrame) -> str:
    safe = table.copy()
    for column in safe.columns:
        if not pd.api.types.is_numeric_dtype(safe[column]):  # object or pandas' own str dtype
            safe[column] = safe[column].map(neutralise_formula)
    return safe.to_csv(index=False)


def logprob_floor(tokens: pd.DataFrame, atol: float) -> float:
    """The logprob difference a refit may show: the tolerance plus what two cold starts differ by."""
    noise = tokens.loc[tokens["check"] == "noise", "max_logprob_diff"].max()
    return atol + (0.0 if pd.isna(noise) else float(noise))


def outputs_moved(tokens: pd.DataFrame, atol: float) -> dict[str, str]:
    """Per real path, how its outputs after the refit moved from cold B's (greedy tokens, or
    logprobs beyond the tolerance); paths whose outputs equal cold B's are absent."""
    out: dict[str, str] = {}
    refit = tokens[(tokens["check"] != "noise") & ~tokens["path"].str.contains("~", regex=False)]
    for path, rows in refit.groupby("path", sort=False):
        diverged = rows[rows["first_divergence"].notna()]
        parts = []
        if len(diverged):
            first = diverged.sort_values("first_divergence").iloc[0]
            parts.append(
                f"greedy tokens diverge on {len(diverged)} of {len(rows)} prompt(s), first prompt "
                f"{first['prompt']} at token {first['first_divergence']}"
            )
        worst = rows["max_logprob_diff"].max()
        if worst > atol:
            parts.append(f"logprobs differ by up to {worst:.3g} (tolerance {atol:g})")
        if parts:
            out[str(path)] = "; ".join(parts)
    return out


def outputs_headline(moved: dict[str, str], paths: int) -> str:
    if not moved:
        return f"Outputs: greedy tokens and logprobs equal cold B's on every path ({paths})."
    return f"Outputs moved on {len(moved)} of {paths} path(s): " + "; ".join(f"{p}: {t}" for p, t in moved.items())

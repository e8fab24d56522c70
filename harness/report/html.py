"""index.html: one self-contained page (inline CSS, no scripts, no network), rendered from a
Jinja2 template with autoescaping: every value from a record (names, reasons, errors, token
ids) is text, never markup, without an ``escape`` call at each site."""

from __future__ import annotations

from typing import Any

import pandas as pd

from harness.judge.evaluation import Evaluation
from harness.judge.verdict import FAILING_STATUSES
from harness.report.render import render
from harness.report.summary import engine_args_shown


def render_html(
    ev: Evaluation,
    summary: dict[str, Any],
    tensors: pd.DataFrame,
    tokens: pd.DataFrame,
    consumed: pd.DataFrame,
    hooks: pd.DataFrame,
) -> str:
    # A path that never ran has no positive-control entry at all.
    paths = {name: {"positive_control": None, **p, **_folded(p)} for name, p in summary["paths"].items()}
    return render(
        "run.html.j2",
        engine={
            "dtype": ev.record.spec.engine.dtype,
            "mode": ev.record.spec.engine.mode,
            "tensor_parallel_size": ev.record.spec.engine.tensor_parallel_size,
            "args": engine_args_shown(ev),
        },
        provenance=summary["provenance"],
        paths=paths,
        divergent=[
            (name, p)
            for name, p in paths.items()
            if p.get("first_divergent_kernel_input") or p.get("first_divergent_tensor")
        ],
        checkpoints=summary["checkpoints"],
        sabotaged=[(name, p["sabotage"]) for name, p in paths.items() if p.get("sabotage") is not None],
        accuracy=summary.get("accuracy"),
        noise=summary["noise_floor"],
        unobserved=summary.get("unobserved") or {"count": 0, "items": []},
        tensors=_non_ok(tensors),
        tensor_headers=["path", "check", "tensor", "kind", "status", "address moved"],
        consumed=_consumed(consumed),
        hooks=_hooks(hooks),
        tokens=_tokens(tokens),
        reference=summary.get("reference") or {},
        cold_starts=summary.get("cold_starts", "?"),
        arms=summary["arms"],
        environment={**summary["environment"], **{f"checkpoint {k}": v for k, v in summary["checkpoints"].items()}},
    )


def finding_links(findings: list[str]) -> list[tuple[str, str | None]]:
    """Each finding page (``docs/findings/NAME.md``) with a link to it in this harness's checkout,
    where it is there (None: shown as text)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    return [(f, (root / f).as_uri() if (root / f).is_file() else None) for f in findings]


def _folded(p: dict[str, Any]) -> dict[str, Any]:
    """What a verdict row shows beyond its headline: the token divergences of a FAIL on top,
    and, folded away, the reasons after the first and the facts only reported."""
    diverged = [(k, v) for k, v in (p.get("first_token_divergence") or {}).items() if v is not None][:4]
    reasons = [r for r in p["reasons"] if r != p["headline"]]
    notes = list(p.get("notes", ()))
    parts = ([f"{len(reasons)} more reason(s)"] if reasons else []) + (
        [f"{len(notes)} reported, not deciding"] if notes else []
    )
    return {
        "diverged": diverged,
        "more": reasons + notes,
        "more_summary": ", ".join(parts),
        "finding_links": finding_links(p.get("findings") or []),
    }


def _non_ok(tensors: pd.DataFrame) -> dict[str, Any]:
    """Rows that decide a verdict first; not-judged (NOISY, UNJUDGEABLE) and reported-only
    (REBOUND) rows folded away. Sabotaged twins have their own section."""
    own = tensors[~tensors["path"].str.contains("~", regex=False)]
    bad = own[(own["status"] != "OK") & (own["check"] != "noise")]
    deciding = bad["status"].isin([s.value for s in FAILING_STATUSES])
    refit = own[own["check"] == "refit"]
    rest = bad[~deciding]
    return {
        "deciding": bad[deciding].to_dict("records"),
        "rest": rest.to_dict("records"),
        "rest_statuses": sorted(set(rest["status"])),
        "compared": len(refit),
        "unjudgeable": int((refit["status"] == "UNJUDGEABLE").sum()),
    }


def _consumed(consumed: pd.DataFrame) -> dict[str, Any]:
    bad = consumed[
        ~consumed["status"].isin(["OK", "NOISY", "UNJUDGEABLE"]) & ~consumed["path"].str.contains("~", regex=False)
    ]
    return {
        "rows": bad.to_dict("records"),
        "recorded": len(consumed),
        "noisy": int((consumed["status"] == "NOISY").sum()),
    }


def _hooks(hooks: pd.DataFrame) -> list[dict[str, Any]]:
    return [
        {**r, "stale_derived": [t for t in str(r["stale_derived"]).split() if t != "nan"]}
        for r in hooks.to_dict("records")
    ]


def _tokens(tokens: pd.DataFrame) -> list[dict[str, Any]]:
    return [
        {
            **r,
            "diverged": not pd.isna(r["first_divergence"]),
            **{k: None if pd.isna(r.get(k)) else r[k] for k in ("subject_text", "reference_text")},
        }
        for r in tokens[tokens["check"] != "noise"].to_dict("records")
    ]

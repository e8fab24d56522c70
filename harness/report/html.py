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
from harness.report.tables import logprob_floor, outputs_headline, outputs_moved


def render_html(
    ev: Evaluation,
    summary: dict[str, Any],
    tensors: pd.DataFrame,
    tokens: pd.DataFrame,
    consumed: pd.DataFrame,
    hooks: pd.DataFrame,
) -> str:
    # A path that never ran has no positive-control entry at all.
    floor = logprob_floor(tokens, ev.record.spec.judge.logprob_atol)
    moved = outputs_moved(tokens, floor)
    paths = {
        name: {"positive_control": None, **p, **_folded(p), "outputs": moved.get(name)}
        for name, p in summary["paths"].items()
    }
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
        controls=_controls(paths),
        outputs_headline=outputs_headline(moved, len(paths)),
        counts=_counts(paths),
        accuracy=summary.get("accuracy"),
        noise=summary["noise_floor"],
        unobserved=summary.get("unobserved") or {"count": 0, "items": []},
        tensors=_non_ok(tensors),
        tensor_headers=["paths", "check", "tensor", "kind", "status", "address moved"],
        consumed=_consumed(consumed),
        hooks=_hooks(hooks),
        tokens=_tokens(tokens, floor),
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
    every = list(dict.fromkeys(own["path"]))
    return {
        "deciding": _collapsed(
            bad[deciding].to_dict("records"), ("check", "tensor", "kind", "status", "address_moved"), every
        ),
        "rest": _collapsed(rest.to_dict("records"), ("check", "tensor", "kind", "status", "address_moved"), every),
        "rest_statuses": sorted(set(rest["status"])),
        "compared": len(refit),
        "unjudgeable": int((refit["status"] == "UNJUDGEABLE").sum()),
    }


def _collapsed(rows: list[dict[str, Any]], key: tuple[str, ...], every: list[str]) -> list[dict[str, Any]]:
    """Rows equal but for their path, as one row naming its paths (``paths_shown``: the path, "every
    path (N)", or "N paths"; ``paths``: them all), in first-seen order."""
    groups: dict[tuple, dict[str, Any]] = {}
    for r in rows:
        g = groups.setdefault(tuple(r[k] for k in key), {**r, "paths": []})
        g["paths"].append(r["path"])
    for g in groups.values():
        n = len(g["paths"])
        g["paths_shown"] = (
            g["paths"][0] if n == 1 else f"every path ({n})" if set(g["paths"]) >= set(every) else f"{n} paths"
        )
    return list(groups.values())


def _consumed(consumed: pd.DataFrame) -> dict[str, Any]:
    bad = consumed[
        ~consumed["status"].isin(["OK", "NOISY", "UNJUDGEABLE"]) & ~consumed["path"].str.contains("~", regex=False)
    ]
    return {
        "rows": bad.to_dict("records"),
        "recorded": len(consumed),
        "noisy": int((consumed["status"] == "NOISY").sum()),
    }


def _hooks(hooks: pd.DataFrame) -> dict[str, Any]:
    """Hook rows that say something (a hook the refit did not run, or stale derived tensors
    under it), one row per finding with the paths it holds for; the rows that say "ran, nothing
    stale" only counted (hooks.csv has them all). Sabotaged twins have their own section."""
    said: dict[tuple, list[str]] = {}
    silent = 0
    for r in hooks.to_dict("records"):
        if "~" in str(r["path"]):
            continue
        stale = tuple(t for t in str(r["stale_derived"]).split() if t != "nan")
        if r["runs_on_refit"] and not stale:
            silent += 1
            continue
        said.setdefault((r["module"], r["kind"], bool(r["runs_on_refit"]), stale), []).append(str(r["path"]))
    rows = [
        {"paths": paths, "module": m, "kind": k, "runs_on_refit": runs, "stale_derived": list(stale)}
        for (m, k, runs, stale), paths in said.items()
    ]
    return {"rows": rows, "silent": silent, "total": len(hooks)}


def _tokens(tokens: pd.DataFrame, atol: float = 0.0) -> dict[str, Any]:
    """Token rows of the real paths that differ from cold B first (a divergence, or logprobs
    beyond the tolerance); the ones equal to cold B counted and folded; the sabotaged twins'
    rows apart, since they are expected to diverge."""
    rows = [
        {
            **r,
            "diverged": not pd.isna(r["first_divergence"]),
            "drift": bool(r["max_logprob_diff"] > atol),
            **{k: None if pd.isna(r.get(k)) else r[k] for k in ("subject_text", "reference_text")},
        }
        for r in tokens[tokens["check"] != "noise"].to_dict("records")
    ]
    real = [r for r in rows if "~" not in str(r["path"])]
    every = list(dict.fromkeys(r["path"] for r in real))
    same_key = ("check", "prompt", "subject_tokens", "reference_tokens")
    return {
        "moved": _collapsed([r for r in real if r["diverged"] or r["drift"]], (*same_key, "max_logprob_diff"), every),
        "same": _collapsed([r for r in real if not (r["diverged"] or r["drift"])], same_key, every),
        "twins": _collapsed([r for r in rows if "~" in str(r["path"])], (*same_key, "max_logprob_diff"), []),
    }


def _counts(paths: dict[str, Any]) -> str:
    from collections import Counter

    counts = Counter(p.get("shown", p["verdict"]) for p in paths.values())
    return ", ".join(f"{n} {v}" for v, n in sorted(counts.items()))


def _controls(paths: dict[str, Any]) -> list[dict[str, Any]]:
    """Positive-control rows, one per distinct outcome with the paths that share it."""
    groups: dict[tuple, dict[str, Any]] = {}
    for name, p in paths.items():
        ctl = p.get("positive_control")
        if ctl is None:
            continue
        key = (
            ctl["detected"],
            ctl["checkpoint_tensor"],
            tuple(ctl["expected_modules"]),
            tuple(ctl["localized_to"]),
            ctl["tokens_moved"],
        )
        g = groups.setdefault(key, {**ctl, "paths": [], "shifts": []})
        g["paths"].append(name)
        g["shifts"].append(ctl["max_logprob_shift"])
    return list(groups.values())

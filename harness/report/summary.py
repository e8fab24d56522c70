"""summary.json (the output contract) and summary.md (a PR comment)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from harness.judge.evaluation import Evaluation
from harness.report.markdown import md_code, md_text
from harness.report.provenance import cpu_line, cpu_summary
from harness.report.style import ICON, REPORT_SCHEMA_VERSION


def summary_dict(ev: Evaluation) -> dict[str, Any]:
    comparisons = {c.path: c for c in ev.comparisons}
    paths: dict[str, Any] = {}
    for v in ev.verdicts:
        c = comparisons.get(v.path)
        entry: dict[str, Any] = {
            "verdict": v.status.value,
            "shown": v.shown,
            "earned": v.earned,
            "headline": v.headline,
            "reasons": list(v.reasons),
            "notes": list(v.notes),
            "first_divergent_tensor": v.first_divergent_tensor,
            "first_divergent_kernel_input": v.first_divergent_kernel_input,
            "known_issues": list(v.known),
            "findings": list(v.findings),
        }
        so = v.sabotage
        entry["sabotage"] = (
            None
            if so is None
            else {
                "sabotage": so.sabotage,
                "evidence": so.evidence,
                "planted": so.planted,
                "twin_verdict": so.verdict.value,
                "caught": so.caught,
                "detail": so.detail,
            }
        )
        if c is not None:
            entry["cache_hits"] = c.cache_hits
            entry["tensor_statuses"] = {
                check: dict(Counter(d.status.value for d in c.tensors if d.check == check))
                for check in ("refit", "idempotency", "round_trip")
            }
            entry["first_token_divergence"] = {
                str(d.prompt): d.first_divergence for d in c.tokens if d.check == "refit"
            }
            ctl = c.control
            entry["positive_control"] = (
                None
                if ctl is None
                else {
                    "checkpoint_tensor": ctl.checkpoint_tensor,
                    "detected": ctl.detected,
                    "expected_modules": list(ctl.expected_modules),
                    "localized_to": list(ctl.localized),
                    "changed": list(ctl.changed),
                    "tokens_moved": ctl.tokens_moved,
                    "max_logprob_shift": ctl.max_logprob_shift,
                    "first_kernel_input": ctl.first_kernel_input,
                }
            )
            entry["consumed_statuses"] = dict(Counter(d.status.value for d in c.consumed))
            entry["hooks_run_on_refit"] = {f"{h.module} ({h.kind})": h.runs for h in c.hooks}
        paths[v.path] = entry
    noise = next(iter(ev.comparisons), None)
    noise_tensors = [d.tensor for d in noise.tensors if d.check == "noise" and d.status.value != "OK"] if noise else []
    noise_tokens = (
        {
            str(d.prompt): {"first_divergence": d.first_divergence, "max_logprob_diff": d.max_logprob_diff}
            for d in noise.tokens
            if d.check == "noise"
        }
        if noise
        else {}
    )
    env = dict(next((a.environment for a in ev.arms if a.environment), ()))
    reused = set(ev.record.plan.reused)
    from harness.judge.throughput import points

    throughput = {
        p.point: {
            "median_tokens_per_s": p.median,
            "spread": p.spread,
            "samples": list(p.samples),
            "slower_than_cold_B": p.slower_than_cold,
        }
        for p in points(ev.arms)
    }
    from harness.report.provenance import run_provenance

    return {
        "schema_version": REPORT_SCHEMA_VERSION,
        "exit_code": ev.exit_code,
        "provenance": run_provenance(ev),
        "accuracy": accuracy_summary(ev),
        "paths": paths,
        "noise_floor": {"differing_tensors": noise_tensors, "tokens": noise_tokens},
        "cold_starts": sum(a.cold_starts for a in ev.arms if a.arm not in reused),
        "reference": {"key": ev.record.reference_key, "reused": bool(reused)},
        "throughput": throughput,
        "arms": [
            {
                "arm": a.arm,
                "role": a.role,
                "paths": list(a.paths),
                "status": a.status,
                "error": a.error,
                "seconds": a.seconds,
                "observations": [str(o.label) for o in a.observations],
                "cold_starts": a.cold_starts,
                "reused": a.arm in reused,
            }
            for a in ev.arms
        ],
        "checkpoints": {
            "A": ev.record.checkpoints.a,
            "B": ev.record.checkpoints.b,
            "B_control": ev.record.checkpoints.b_control,
            "control_tensor": ev.record.checkpoints.control_tensor,
            "control_reason": ev.record.checkpoints.control_reason,
        },
        "unobserved": unobserved_summary(ev),
        "cpu": cpu_summary(ev),
        "environment": {
            **env,
            "cpu_capabilities": cpu_line(ev),
            "git_sha": ev.record.git_sha,
            "started": ev.record.started,
            "mode": ev.record.spec.engine.mode,
            "dtype": ev.record.spec.engine.dtype,
            "tensor_parallel_size": ev.record.spec.engine.tensor_parallel_size,
            "engine_args": ev.record.spec.engine.vllm_kwargs(),
        },
    }


def accuracy_summary(ev: Evaluation) -> dict[str, Any] | None:
    """The accuracy probe (``--accuracy``), judged from the records; None without it."""
    from harness.judge.accuracy import judge_run

    spec = ev.record.spec.accuracy
    j = judge_run(ev.arms, spec)
    if j is None or spec is None:
        return None
    tokenizers = sorted({c.tokenizer for a in ev.arms for c in a.completions})
    return {
        "file": spec.file,
        "items": len(spec.prompts),
        "max_tokens": spec.max_tokens,
        "tokenizer": tokenizers,
        "discriminating_power": j.discriminates,
        "outcome": j.summary,
        "cold_B_correct_range": list(j.cold_range) if j.cold_range else None,
        "points": [
            {
                "point": p.point,
                "arm": p.arm,
                "correct": p.correct,
                "invalid": p.invalid,
                "total": p.total,
                "accuracy": round(p.accuracy, 4),
                "invalid_rate": round(p.invalid_rate, 4),
                "status": p.status,
            }
            for p in j.points
        ],
    }


def unobserved_summary(ev: Evaluation) -> dict[str, Any]:
    """What the census could not observe, once per name, with the reason and the arms it
    happened in: counted and shown, never judged."""
    items: dict[str, dict[str, Any]] = {}
    for arm in ev.arms:
        for obs in arm.observations:
            for u in obs.unobserved:
                name = obs.shown_name(u)
                item = items.setdefault(name, {"name": name, "kind": u.kind, "reason": u.reason, "arms": []})
                if arm.arm not in item["arms"]:
                    item["arms"].append(arm.arm)
    return {"count": len(items), "items": list(items.values())}


def engine_args_shown(ev: Evaluation) -> list[str]:
    """The run's engine arguments as ``key=value`` (strings bare, other values as JSON)."""
    from harness.spec.engine_config import shown_items

    return shown_items(ev.record.spec.engine.engine_args)


def render_markdown(ev: Evaluation, summary: dict[str, Any]) -> str:
    from harness.report.provenance import provenance_markdown

    icon = ICON
    from harness.report.tables import logprob_floor, outputs_headline, outputs_moved, token_table

    tokens = token_table(ev)
    moved = outputs_moved(tokens, logprob_floor(tokens, ev.record.spec.judge.logprob_atol))
    counts = Counter(p.get("shown", p["verdict"]) for p in summary["paths"].values())
    lines = ["## refit-harness: warm A→B vs cold B", "", *provenance_markdown(summary["provenance"])]
    lines += [
        "**Verdicts: "
        + ", ".join(f"{n} {md_text(v)}" for v, n in sorted(counts.items()))
        + "**. "
        + md_text(outputs_headline(moved, len(summary["paths"]))),
        "",
    ]
    if summary.get("cpu", {}).get("arms_on_another_cpu"):
        lines += [f"**arms measured on another CPU**: {md_text(', '.join(summary['cpu']['arms_on_another_cpu']))}", ""]
    lines += [
        "| path | verdict | what decided it |",
        "|---|---|---|",
    ]
    notes: dict[str, list[str]] = {}  # a reported-only fact -> the paths it holds for
    for name, p in summary["paths"].items():
        decided = md_text(p["headline"])
        if p["verdict"] == "FAIL":
            diverged = {k: v for k, v in (p.get("first_token_divergence") or {}).items() if v is not None}
            if p["first_divergent_tensor"] and p["first_divergent_kernel_input"]:
                decided += f"<br>first divergent tensor: {md_code(p['first_divergent_tensor'])}"
            if diverged:
                decided += "<br>tokens diverge from cold B: " + ", ".join(
                    f"prompt {k} at token {v}" for k, v in list(diverged.items())[:4]
                )
        if p.get("findings"):
            decided += "<br>finding: " + ", ".join(md_code(f) for f in p["findings"])
        shown = p.get("shown", p["verdict"])
        lines.append(f"| {md_code(name)} | {icon[shown]} **{shown}** | {decided} |")
        for note in p.get("notes", ()):
            notes.setdefault(note, []).append(name)
    if notes:
        lines += ["", "<details><summary>Reported, not deciding</summary>", ""]
        lines += [f"- {md_text(note)} ({', '.join(md_code(n) for n in names)})" for note, names in notes.items()]
        lines += ["", "</details>"]
    ck = summary["checkpoints"]
    lines += [
        "",
        f"Positive control: {md_code(ck['control_tensor'])} ({md_text(ck.get('control_reason') or 'given')}).",
    ]
    if summary["unobserved"]["count"]:
        first = summary["unobserved"]["items"][0]
        lines += [
            "",
            f"Unobserved (not judged): {summary['unobserved']['count']} tensor(s)/kernel(s), e.g. "
            f"{md_code(first['name'])}: {md_text(first['reason'])}.",
        ]
    for point, t in summary.get("throughput", {}).items():
        flag = " — **slower than cold B** beyond its floor" if t["slower_than_cold_B"] else ""
        lines.append(
            f"Throughput {md_code(point)}: {t['median_tokens_per_s']:.1f} tokens/s (spread {t['spread']:.1f}){flag}"
        )
    lines += accuracy_markdown(summary.get("accuracy"))
    nf = summary["noise_floor"]
    lines += [
        "",
        f"Noise floor (cold B twice): {len(nf['differing_tensors'])} differing tensor(s); "
        f"{sum(1 for t in nf['tokens'].values() if t['first_divergence'] is not None)} diverging prompt(s).",
    ]
    if summary["reference"]["reused"]:
        lines += [
            "",
            f"Cold-B reference and noise: reused reference `{summary['reference']['key']}` (not cold-started "
            f"again); engine cold starts in this run: {summary['cold_starts']}.",
        ]
    return "\n".join(lines) + "\n"


def accuracy_markdown(acc: dict[str, Any] | None) -> list[str]:
    if not acc:
        return []
    lines = [
        "",
        f"Accuracy ({acc['items']} item(s) of {md_code(acc['file'])}, exact match, tokenizer "
        f"{md_text(', '.join(acc['tokenizer']) or '?')}): **{md_text(acc['outcome'])}**"
        + (
            ""
            if acc["discriminating_power"]
            else " — the damaged copy of B scores no lower than cold B, so this "
            "eval cannot tell a broken model from a good one; no accuracy result is a pass."
        ),
        "",
        "| point | arm | correct | invalid | status |",
        "|---|---|---|---|---|",
    ]
    for p in acc["points"]:
        status = f"**{p['status']}**" if p["status"] == "differs from cold B" else (p["status"] or "—")
        lines.append(
            f"| {md_code(p['point'])} | {md_text(p['arm'])} | {p['correct']}/{p['total']} | "
            f"{p['invalid']}/{p['total']} | {status} |"
        )
    return lines

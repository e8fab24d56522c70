"""Judging the regression corpus: from an entry's patched and stock runs (their evaluations), the
evidence the patched failure rests on, whether the entry was caught, which of its expectations
did not hold, and the recall over the corpus. Pure: works from evaluations, never runs anything.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from harness.judge.evaluation import Evaluation
from harness.spec.regressions import Entry


@dataclass(frozen=True)
class Outcome:
    """What the harness concluded about one corpus entry."""

    id: str
    """The entry's id."""
    title: str
    """What the bug does."""
    fix: str
    """The upstream fix's address."""
    issue: str
    """The upstream report, if not the fix itself."""
    model: str
    """The exposing model (``zoo:mamba2``, ...)."""
    paths: tuple[str, ...]
    """Paths run."""
    ran: bool
    """False for an entry whose patched code cannot run on this device (built only), or that was
    SKIPPED or masked on this version."""
    status: str
    """``caught``, ``missed``, ``skipped`` (no patch for this vLLM, or it does not apply) or
    ``masked`` (this vLLM hides the bug)."""
    executable: bool
    """The entry's patched code executes on this device (``run`` in its ``entry.toml``)."""
    fidelity: str
    """``faithful`` or ``stand-in`` (``entry.toml``)."""
    fidelity_note: str
    """Why the entry is faithful, or what it does instead."""
    patches: tuple[tuple[str, str], ...]
    """(file name, sha256) of each patch applied."""
    patched: tuple[tuple[str, str], ...]
    """(path, verdict) on the patched build."""
    stock: tuple[tuple[str, str], ...]
    """(path, verdict) on stock vLLM."""
    evidence: tuple[str, ...]
    """Evidence kinds the patched failure rests on (``tensor``, ``kernel_input``, ``tokens``, ``logprobs``,
    ``error``)."""
    detail: str
    """The first piece of that evidence, or why nothing was caught (for a miss, the detector it
    needs), or why the entry was skipped or masked."""
    caught: bool
    """The patched build FAILed with the evidence the entry names."""
    expected_caught: bool
    """What the entry expects."""
    met: bool
    """Every expectation of the entry held (patched and stock verdicts, caught or missed)."""
    unmet: tuple[str, ...]
    """The expectations that did not hold."""
    seconds: float
    """Wall time of the entry's own work (its build and patched run; the shared stock run is counted once, in its first entry)."""
    patched_run: str
    """The patched run's directory, relative to the scenario's output."""
    stock_run: str
    """The stock run's directory, relative to the scenario's output."""


def evidence_of(ev: Evaluation, path: str) -> tuple[dict[str, list[str]], str]:
    """Evidence kinds present in a path's refit checks (each with what it names), and the verdict."""
    from harness.judge.verdict import FAILING_STATUSES, JUDGED_CHECKS, _token_reasons

    verdict = next(v for v in ev.verdicts if v.path == path)
    comp = next((c for c in ev.comparisons if c.path == path), None)
    found: dict[str, list[str]] = {}
    if comp is not None:
        tensors = [
            f"{d.tensor} ({d.status.value}, {d.check})"
            for d in comp.tensors
            if d.check in JUDGED_CHECKS and d.status in FAILING_STATUSES
        ]
        kernel = [
            f"op #{d.op_index} {d.op} (arg {d.arg}) in {d.module} reads {d.tensor} ({d.status.value})"
            for d in comp.consumed
            if d.status in FAILING_STATUSES
        ]
        reasons = _token_reasons(comp.tokens, ev.record.spec.judge)
        for kind, items in (
            ("tensor", tensors),
            ("kernel_input", kernel),
            ("tokens", [r for r in reasons if " diverges at token " in r]),
            ("logprobs", [r for r in reasons if "logprobs differ" in r]),
            ("error", list(comp.errors)),
        ):
            if items:
                found[kind] = items
    return found, verdict.status.value


def judge_entry(entry: Entry, patched: Evaluation | None, stock: Evaluation | None) -> dict:
    """The entry's evidence, caught flag and unmet expectations, from its runs (None: not run).
    For a live bug (no patch) the patched run is the stock run, and a failure a known issue
    expects (XFAIL) is caught like a FAIL: the issue names that very bug."""
    exp = entry.expect
    # A loud bug is caught by its error; a live bug's failure may be one a known issue expects.
    failing = ("FAIL", "ERROR", "XFAIL") if entry.live else ("FAIL", "ERROR")
    unmet: list[str] = []
    if patched is None:
        return {"patched": (), "stock": (), "evidence": (), "detail": exp.reason, "caught": False, "unmet": ()}
    kinds: dict[str, list[str]] = {}
    patched_verdicts, stock_verdicts = [], []
    for path in entry.exposure.paths:
        found, verdict = evidence_of(patched, path)
        patched_verdicts.append((path, verdict))
        if verdict in failing:
            for k, items in found.items():
                kinds.setdefault(k, []).extend(items)
        if stock is not None:
            stock_verdicts.append((path, next(v.status.value for v in stock.verdicts if v.path == path)))
    named = [t for k in ("tensor", "kernel_input") for t in kinds.get(k, [])]
    pattern_ok = exp.tensor is None or any(re.search(exp.tensor, t) for t in named)
    words_ok = exp.error is None or any(re.search(exp.error, t) for t in kinds.get("error", []))
    caught = (
        all(v in failing for _, v in patched_verdicts)
        and bool(exp.evidence)
        and all(k in kinds for k in exp.evidence)
        and pattern_ok
        and words_ok
    )
    for path, v in patched_verdicts:
        if v != exp.patched:
            unmet.append(f"patched {path}: {v}, expected {exp.patched}")
    for path, v in stock_verdicts:
        if v != exp.stock:
            unmet.append(f"stock {path}: {v}, expected {exp.stock}")
    if caught != exp.caught:
        missing = [k for k in exp.evidence if k not in kinds]
        why = (
            f"missing evidence {', '.join(missing)}"
            if missing
            else (
                "no failing tensor matches " + exp.tensor
                if exp.tensor and not pattern_ok
                else f"no error matches {exp.error}"
                if exp.error and not words_ok
                else ""
            )
        )
        unmet.append(
            f"{'caught' if caught else 'not caught'}, expected {'caught' if exp.caught else 'a miss'}"
            + (f" ({why})" if why and not caught else "")
        )
    order = [k for k in ("tensor", "kernel_input", "tokens", "logprobs", "error") if k in kinds]
    if order:
        detail = "; ".join(
            f"{k}: {kinds[k][0]}" + (f" (+{len(kinds[k]) - 1})" if len(kinds[k]) > 1 else "") for k in order
        )
    else:
        detail = exp.reason or "nothing differs from cold B"
    return {
        "patched": tuple(patched_verdicts),
        "stock": tuple(stock_verdicts),
        "evidence": tuple(order),
        "detail": detail,
        "caught": caught,
        "unmet": tuple(unmet),
    }


def _share(caught: int, total: int) -> dict:
    return {"caught": caught, "total": total, "value": round(caught / total, 3) if total else 0.0}


def recall_of(outcomes: list[Outcome]) -> dict:
    """Recall over every entry not masked on this version (``caught``/``total``/``value``), and over
    those that execute on this device (``executable``); a SKIPPED entry counts as not caught in both."""
    counted = [o for o in outcomes if o.status != "masked"]
    executable = [o for o in counted if o.executable]
    return {
        **_share(sum(o.caught for o in counted), len(counted)),
        "executable": _share(sum(o.caught for o in executable), len(executable)),
        "skipped": sum(o.status == "skipped" for o in outcomes),
        "masked": sum(o.status == "masked" for o in outcomes),
    }

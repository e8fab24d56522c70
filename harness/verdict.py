"""Comparisons -> verdicts. Pure; failure is a value here, exit codes come later."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from enum import Enum

from harness.compare import PathComparison, TensorDiff, TensorStatus, TokenDiff
from harness.spec import JudgePolicy, KnownIssue, Mode


class VerdictStatus(str, Enum):
    PASS = "PASS"
    FAIL = "FAIL"
    INCONCLUSIVE = "INCONCLUSIVE"
    SKIPPED = "SKIPPED"
    ERROR = "ERROR"
    XFAIL = "XFAIL"    # failed, entirely inside a known issue of this path on this device
    XPASS = "XPASS"    # a known issue no longer reproduces: the expectation is out of date


@dataclass(frozen=True)
class Verdict:
    """The answer for one path, with the reasons a reviewer reads."""

    path: str
    """Reload path name."""
    status: VerdictStatus
    """PASS, FAIL, INCONCLUSIVE, SKIPPED, ERROR, XFAIL or XPASS."""
    reasons: tuple[str, ...]
    """Why, most important first; empty only for a clean PASS."""
    first_divergent_tensor: str | None = None
    """First tensor (model order) that is not OK after the refit, with its status."""
    first_divergent_kernel_input: str | None = None
    """First op of the recorded forward whose persistent input is not OK after the refit."""
    control_detected: bool | None = None
    """Whether the positive control was seen at its target (None if never run)."""


FAILING = (TensorStatus.STALE, TensorStatus.CORRUPT, TensorStatus.MISSING, TensorStatus.EXTRA)
JUDGED_CHECKS = ("refit", "idempotency", "round_trip")


def skipped(path: str, reason: str) -> Verdict:
    return Verdict(path=path, status=VerdictStatus.SKIPPED, reasons=(reason,))


def rebound_fails(policy: JudgePolicy, mode: Mode, device: str) -> bool:
    """A moved address matters where a captured graph keeps reading the old one."""
    if policy.rebound == "auto":
        return mode == "compiled" and not device.startswith("cpu")
    return policy.rebound == "fail"


def judge(c: PathComparison, policy: JudgePolicy, fail_on_rebound: bool, known: KnownIssue | None = None) -> Verdict:
    """``known``: the path's known issue on the device the subject ran on, if any."""
    # A moved address matters only for what a kernel reads; when the forward was recorded,
    # REBOUND counts only for consumed tensors (vLLM rebuilds some CPU-side scalars no op reads).
    consumed = {d.tensor for d in c.consumed}

    def fails(d: TensorDiff) -> bool:
        if d.status is TensorStatus.REBOUND:
            return fail_on_rebound and (not consumed or d.tensor in consumed)
        return d.status in FAILING

    judged = [d for d in c.tensors if d.check in JUDGED_CHECKS]
    bad = [d for d in judged if fails(d)]
    kernel_bad = [d for d in c.consumed if d.status in FAILING
                  or (d.status is TensorStatus.REBOUND and fail_on_rebound)]
    reasons = [_tensor_reason(check, [d for d in bad if d.check == check]) for check in JUDGED_CHECKS]
    reasons = [r for r in reasons if r]
    token_reasons = _token_reasons(c.tokens, policy)
    reasons += token_reasons
    first_kernel = (f"op #{kernel_bad[0].op_index} {kernel_bad[0].op} (arg {kernel_bad[0].arg}) in "
                    f"{kernel_bad[0].module} reads {kernel_bad[0].tensor} ({kernel_bad[0].status.value})"
                    if kernel_bad else None)
    if first_kernel:
        reasons.insert(0, f"first divergent kernel input: {first_kernel}; {len(kernel_bad)} differing kernel input(s)")
    rebound = sorted({d.tensor for d in judged if d.status is TensorStatus.REBOUND and not fails(d)})
    if rebound:
        why = "no kernel reads them" if fail_on_rebound else "no captured graph reads old addresses in this mode"
        reasons.append(f"{len(rebound)} tensor(s) REBOUND, not failing: {why} (first: {rebound[0]})")
    noisy = sorted({d.tensor for d in c.tensors if d.check == "noise" and d.status is not TensorStatus.OK})
    # Name a wrong value before a moved address, and the refit check before the others.
    ranked = sorted(bad, key=lambda d: (d.status is TensorStatus.REBOUND, JUDGED_CHECKS.index(d.check)))
    first_bad = ranked[0] if ranked else None
    first = f"{first_bad.tensor} ({first_bad.status.value}, {first_bad.check})" if first_bad else None
    control = c.control
    control_reasons = _control_reasons(c)
    if noisy:
        reasons.append(f"noise floor: {len(noisy)} tensor(s) differ between two cold starts on B and were not "
                       f"judged (first: {noisy[0]})")

    reasons += list(c.notes)
    detected = control.detected if control else None
    if c.errors or c.missing_observations:
        why = list(c.errors) or [f"observations missing: {', '.join(c.missing_observations)}"]
        status, reasons = VerdictStatus.ERROR, why + reasons
    elif bad or kernel_bad or token_reasons:
        status, reasons = VerdictStatus.FAIL, reasons + control_reasons
    elif control_reasons:
        status, reasons = VerdictStatus.INCONCLUSIVE, control_reasons + reasons
    else:
        return _against_known(Verdict(c.path, VerdictStatus.PASS, tuple(reasons), None, None, True), known, False)
    explained = known is not None and _explains(known, c, status, bad, kernel_bad)
    return _against_known(Verdict(c.path, status, tuple(reasons), first, first_kernel, detected), known, explained)


def _explains(known: KnownIssue, c: PathComparison, status: VerdictStatus, bad: list[TensorDiff],
              kernel_bad: list) -> bool:
    """An error by its text; a failure when every failing tensor and kernel input is of a
    kind the issue names (tokens that diverge because of them come with it)."""
    if status is VerdictStatus.ERROR:
        return bool(known.error_contains) and any(known.error_contains in e for e in c.errors)
    kinds = {d.tensor: d.kind for d in c.tensors}
    named = re.compile(known.tensor_pattern) if known.tensor_pattern else None
    return (bool(bad) and all(d.kind in known.tensor_kinds for d in bad)
            and all(kinds.get(d.tensor) in known.tensor_kinds for d in kernel_bad)
            and (named is None or all(named.search(d.tensor) for d in [*bad, *kernel_bad])))


def _against_known(v: Verdict, known: KnownIssue | None, explained: bool) -> Verdict:
    """XFAIL when the failure lies wholly inside the known issue; XPASS when it has gone."""
    if known is None:
        return v
    if v.status is VerdictStatus.PASS:
        gone = f"known issue on {known.device} did not reproduce, so the expectation is out of date: {known.reason}"
        return replace(v, status=VerdictStatus.XPASS, reasons=(gone, *v.reasons))
    if explained and v.status in (VerdictStatus.FAIL, VerdictStatus.ERROR):
        return replace(v, status=VerdictStatus.XFAIL, reasons=(f"known issue on {known.device}: {known.reason}",)
                       + v.reasons)
    if v.status in (VerdictStatus.FAIL, VerdictStatus.ERROR):
        beyond = f"beyond this path's known issue on {known.device} ({known.reason})"
        return replace(v, reasons=(*v.reasons, beyond))
    return v


def _tensor_reason(check: str, diffs: list[TensorDiff]) -> str | None:
    if not diffs:
        return None
    counts: dict[str, int] = {}
    for d in diffs:
        counts[d.status.value] = counts.get(d.status.value, 0) + 1
    summary = ", ".join(f"{n} {s}" for s, n in counts.items())
    where = {"refit": "after refit A->B vs cold B", "idempotency": "after refitting B a second time vs the first",
             "round_trip": "after refit back to A vs cold A"}[check]
    return f"{summary} {where} (first: {diffs[0].tensor} {diffs[0].status.value})"


def _token_reasons(tokens: tuple[TokenDiff, ...], tol: JudgePolicy) -> list[str]:
    noise = {d.prompt: d for d in tokens if d.check == "noise"}
    reasons = []
    for d in tokens:
        if d.check not in JUDGED_CHECKS:
            continue
        n = noise.get(d.prompt)
        noise_div = n.first_divergence if n else None
        noise_lp = n.max_logprob_diff if n else 0.0
        if d.first_divergence is not None and (noise_div is None or d.first_divergence < noise_div):
            floor = "identical" if noise_div is None else f"diverges at token {noise_div}"
            reasons.append(f"prompt {d.prompt} ({d.check}) diverges at token {d.first_divergence}: "
                           f"{_window(d.subject_tokens, d.first_divergence)} vs "
                           f"{_window(d.reference_tokens, d.first_divergence)} (noise floor: {floor})")
        elif d.max_logprob_diff > tol.logprob_atol + noise_lp:
            reasons.append(f"prompt {d.prompt} ({d.check}) logprobs differ by {d.max_logprob_diff:.3g} "
                           f"> tolerance {tol.logprob_atol:g} + noise floor {noise_lp:.3g}")
    return reasons


def _window(tokens: tuple[int, ...], at: int) -> str:
    return "[" + " ".join(str(t) for t in tokens[max(0, at - 1): at + 2]) + "]"


def _control_reasons(c: PathComparison) -> list[str]:
    ctl = c.control
    if ctl is None:
        return ["positive control never ran: verdict cannot be trusted"]
    reasons = []
    if not ctl.detected:
        where = ", ".join(ctl.expected_modules)
        seen = f"; changed instead: {', '.join(ctl.changed[:3])}" if ctl.changed else "; nothing changed"
        reasons.append(f"positive control not detected: scaling {ctl.checkpoint_tensor} changed no tensor of "
                       f"{where}{seen}")
    if not ctl.tokens_moved:
        reasons.append(f"positive control invisible to the token check: outputs moved by at most "
                       f"{ctl.max_logprob_shift:.3g} after scaling {ctl.checkpoint_tensor}")
    return reasons

"""Comparisons -> verdicts. Pure; failure is a value here, exit codes come later."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from enum import Enum

from harness.judge.diff import ConsumedDiff, PathComparison, TensorDiff, TensorStatus, TokenDiff, control_targets
from harness.records import DRAFTER_PREFIX, InFlightRequest
from harness.spec.known_issues import KnownIssue
from harness.spec.path_declaration import SabotageEvidence
from harness.spec.run import JudgePolicy, Mode


class VerdictStatus(str, Enum):
    PASS = "PASS"
    FAIL = "FAIL"
    INCONCLUSIVE = "INCONCLUSIVE"
    SKIPPED = "SKIPPED"
    ERROR = "ERROR"
    XFAIL = "XFAIL"  # failed, entirely inside a known issue of this path on this device
    XPASS = "XPASS"  # a known issue no longer reproduces: the expectation is out of date


UNEARNED_PASS = "PASS (no twin)"
"""How a PASS whose sabotaged twin did not run is shown (grid, compare page, expectations): it
exits 0 like a PASS, but it is not earned, and an expectation of PASS is not met by it."""
NO_TWIN = "no sabotaged twin ran (--no-sabotage): nothing showed this path could fail here, so this PASS is not earned"


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
    sabotage: SabotageOutcome | None = None
    """Whether the path's sabotaged twin was caught (None when no twin ran)."""
    known: tuple[str, ...] = ()
    """Titles of the known issues that explain an XFAIL (or that no longer reproduce: XPASS)."""
    findings: tuple[str, ...] = ()
    """The docs pages of those known issues' findings (``docs/findings/NAME.md``), where written."""
    notes: tuple[str, ...] = ()
    """Facts reported but not deciding the verdict: REBOUND tensors that fail nothing here,
    the noise floor, UNJUDGEABLE tensors. A reviewer reads them folded away."""

    @property
    def earned(self) -> bool:
        """A PASS whose sabotaged twin ran and was caught: the only PASS that proves something."""
        return self.status is VerdictStatus.PASS and self.sabotage is not None and self.sabotage.caught

    @property
    def shown(self) -> str:
        """The verdict as a reviewer reads it: the status, or ``PASS (no twin)`` for a PASS
        that is not earned."""
        if self.status is VerdictStatus.PASS and not self.earned:
            return UNEARNED_PASS
        return self.status.value

    @property
    def headline(self) -> str:
        """One line: what decided this verdict."""
        if self.status is VerdictStatus.PASS:
            twin = "; its sabotaged twin was caught" if self.earned else f"; {NO_TWIN}"
            return f"warm A→B equals cold B; the positive control was seen{twin}"
        if self.status is VerdictStatus.FAIL and (self.first_divergent_kernel_input or self.first_divergent_tensor):
            if self.first_divergent_kernel_input:
                return f"first divergent kernel input: {self.first_divergent_kernel_input}"
            return f"first divergent tensor: {self.first_divergent_tensor}"
        if self.status in (VerdictStatus.XFAIL, VerdictStatus.XPASS) and self.known:
            gone = "" if self.status is VerdictStatus.XFAIL else " no longer reproduces"
            return f"known issue{gone}: " + "; ".join(self.known)
        return self.reasons[0] if self.reasons else self.status.value


@dataclass(frozen=True)
class SabotageOutcome:
    """The path's sabotaged twin: the one step the path exists for, skipped or broken."""

    sabotage: str
    """What the twin breaks (the path's ``sabotage``)."""
    evidence: SabotageEvidence
    """What must show it: the left-out tensor failing, greedy tokens diverging, or a drafter tensor failing."""
    planted: str | None
    """Checkpoint tensor the twin left where it was (None for token evidence)."""
    verdict: VerdictStatus
    """The twin's own verdict; it must be FAIL."""
    caught: bool
    """FAIL, and with the evidence the sabotage plants."""
    detail: str
    """What caught it, or why it was not caught."""


FAILING_STATUSES = (TensorStatus.STALE, TensorStatus.CORRUPT, TensorStatus.MISSING, TensorStatus.EXTRA)
JUDGED_CHECKS = ("refit", "idempotency", "round_trip")


def skipped(path: str, reason: str) -> Verdict:
    return Verdict(path=path, status=VerdictStatus.SKIPPED, reasons=(reason,))


def rebound_fails(policy: JudgePolicy, mode: Mode, device: str) -> bool:
    """A moved address matters where a captured graph keeps reading the old one."""
    if policy.rebound == "auto":
        return mode == "compiled" and not device.startswith("cpu")
    return policy.rebound == "fail"


def judge(
    c: PathComparison,
    policy: JudgePolicy,
    fail_on_rebound: bool,
    known: KnownIssue | tuple[KnownIssue, ...] | None = None,
    require_cache_hits: bool = False,
    graphs: bool | None = None,
) -> Verdict:
    """``known``: the path's known issue(s) on the device the subject ran on, if any; a failure
    is XFAIL when every failing tensor is explained by one of them.
    ``require_cache_hits``: the path proves something only if the prefix cache served
    tokens after its refit; without hits it FAILs.
    ``graphs``: the engine captures CUDA graphs (None: wherever a REBOUND fails, as ``auto``
    decides). Then a REBOUND fails unless the captured graphs were shown to leave the tensor's
    old storage unread (``PathComparison.graph_unread``): a dispatch-mode recording cannot see a
    graph replay, so a tensor it did not record is not thereby unread. Outside graphs, a REBOUND
    that fails (``--rebound fail``) counts only for tensors the recorded forward consumed (vLLM
    rebuilds some CPU-side scalars no op reads)."""
    knowns = () if known is None else (known,) if isinstance(known, KnownIssue) else tuple(known)
    graphs = fail_on_rebound if graphs is None else graphs
    consumed = {d.tensor for d in c.consumed}
    unread = c.graph_unread

    def rebound_fails(tensor: str) -> bool:
        if not fail_on_rebound:
            return False
        if graphs:
            return tensor not in unread
        return not consumed or tensor in consumed

    def fails(d: TensorDiff) -> bool:
        if d.status is TensorStatus.REBOUND:
            return rebound_fails(d.tensor)
        return d.status in FAILING_STATUSES

    judged = [d for d in c.tensors if d.check in JUDGED_CHECKS]
    bad = [d for d in judged if fails(d)]
    kernel_bad = [
        d
        for d in c.consumed
        if d.status in FAILING_STATUSES or (d.status is TensorStatus.REBOUND and rebound_fails(d.tensor))
    ]
    reasons: list[str] = [
        r for check in JUDGED_CHECKS if (r := _tensor_reason(check, [d for d in bad if d.check == check]))
    ]
    token_reasons = _token_reasons(c.tokens, policy)
    reasons += token_reasons
    first_kernel = (
        f"op #{kernel_bad[0].op_index} {kernel_bad[0].op} (arg {kernel_bad[0].arg}) in "
        f"{kernel_bad[0].module} reads {kernel_bad[0].tensor} ({kernel_bad[0].status.value})"
        if kernel_bad
        else None
    )
    if first_kernel:
        reasons.insert(0, f"first divergent kernel input: {first_kernel}; {len(kernel_bad)} differing kernel input(s)")
    notes: list[str] = []  # reported, not deciding
    rebound = sorted({d.tensor for d in judged if d.status is TensorStatus.REBOUND and not fails(d)})
    if rebound:
        why = (
            "the captured graphs were shown not to read their old storage"
            if graphs and fail_on_rebound
            else "no kernel reads them"
            if fail_on_rebound
            else "no captured graph reads old addresses in this mode"
        )
        notes.append(f"{len(rebound)} tensor(s) REBOUND, not failing: {why} (first: {rebound[0]})")
    read_by_graphs = sorted({d.tensor for d in bad if d.status is TensorStatus.REBOUND and graphs})
    if read_by_graphs:
        evidence = {g.tensor: g for g in c.graph_reads}
        first_read = read_by_graphs[0]
        shown = evidence.get(first_read)
        how = (
            f"{shown.status}: {shown.evidence}"
            if shown
            else "not probed" + ("" if c.graphs_probed else " (no observation of this path probed its captured graphs)")
        )
        reasons.append(
            f"{len(read_by_graphs)} REBOUND tensor(s) not shown unread by the captured CUDA graphs, which replay "
            f"the addresses they captured (first: {first_read}, {how})"
        )
    noisy = sorted({d.tensor for d in c.tensors if d.check == "noise" and d.status is not TensorStatus.OK})
    # Name a wrong value before a moved address, and the refit check before the others.
    ranked = sorted(bad, key=lambda d: (d.status is TensorStatus.REBOUND, JUDGED_CHECKS.index(d.check)))
    first_bad = ranked[0] if ranked else None
    first = f"{first_bad.tensor} ({first_bad.status.value}, {first_bad.check})" if first_bad else None
    control = c.control
    control_reasons = _control_reasons(c)
    if noisy:
        notes.append(
            f"noise floor: {len(noisy)} tensor(s) differ between two cold starts on B and were not "
            f"judged (first: {noisy[0]})"
        )
    unjudgeable = [d.tensor for d in c.tensors if d.check == "refit" and d.status is TensorStatus.UNJUDGEABLE]
    if unjudgeable:
        notes.append(
            f"{len(unjudgeable)} tensor(s) UNJUDGEABLE: equal before and after the refit, so they could "
            f"not show a refit that missed them (first: {unjudgeable[0]})"
        )
    evidence_reasons = _evidence_reasons(c)
    cache_reasons = (
        [
            f"no prefix-cache hits after the refit{' (the engine did not report them)' if c.cache_hits is None else ''}"
            ": a stale cache could not have been served, so the path proved nothing"
        ]
        if require_cache_hits and not c.cache_hits
        else []
    )
    flight_fails, flight_notes = in_flight_reasons(c.in_flight, c.in_flight_sources)
    draft_fails, draft_notes = drafter_reasons(c)
    encoder_fails, encoder_notes = encoder_cache_reasons(c)
    reasons = encoder_fails + draft_fails + cache_reasons + flight_fails + reasons + flight_notes
    notes += draft_notes + encoder_notes

    notes += c.notes
    detected = control.detected if control else None
    if c.errors or c.missing_observations:
        errors = list(c.errors) or [f"observations missing: {', '.join(c.missing_observations)}"]
        status, reasons = VerdictStatus.ERROR, errors + reasons
    elif bad or kernel_bad or token_reasons or cache_reasons or flight_fails or draft_fails or encoder_fails:
        status, reasons = VerdictStatus.FAIL, reasons + control_reasons
    elif control_reasons or evidence_reasons:
        status, reasons = VerdictStatus.INCONCLUSIVE, control_reasons + evidence_reasons + reasons
    else:
        passed = Verdict(c.path, VerdictStatus.PASS, tuple(reasons), None, None, True, notes=tuple(notes))
        return _against_known(passed, knowns, ())
    explaining = _explaining(knowns, c, status, bad, kernel_bad)
    verdict = Verdict(c.path, status, tuple(reasons), first, first_kernel, detected, notes=tuple(notes))
    return _against_known(verdict, knowns, explaining)


def drafter_reasons(c: PathComparison) -> tuple[list[str], list[str]]:
    """``(failing, informational)`` reasons of a speculative-decoding engine. One that accepts
    drafts at another rate than cold B after the refit is proposing from other weights: its
    drafter was left behind. Speculative decoding is lossless, so the greedy tokens cannot show
    it; the acceptance rate does."""
    if c.acceptance is None:
        return [], []
    warm, cold = c.acceptance
    if warm == cold:
        return [], [f"drafter: acceptance rate {warm:.2f} after the refit, as cold B's"]
    identical = all(t.first_divergence is None for t in c.tokens if t.check == "refit")
    return [
        f"drafter stale: acceptance rate {warm:.2f} vs cold B's {cold:.2f}; tokens "
        + ("identical" if identical else "differ too")
    ], []


def encoder_cache_reasons(c: PathComparison) -> tuple[list[str], list[str]]:
    """``(failing, informational)`` reasons of a vision-language engine's encoder cache. vLLM
    keeps each image's embeddings and serves them to any later request with the same image; an
    embedding that differs from cold B's after the refit was computed by the vision tower before
    it. What the refit did to the cache is always shown."""
    e = c.encoder_cache
    if e is None:
        return [], []
    did = f"the refit left {e.kept} entr{'y' if e.kept == 1 else 'ies'} in it" if e.kept else "the refit emptied it"
    if e.stale:
        return [
            f"encoder cache stale: {len(e.stale)} of {e.compared} image embedding(s) served after the refit differ "
            f"from cold B's ({did}; first image {e.stale[0]})"
        ], []
    return [], [f"encoder cache: {did}; the {e.compared} image embedding(s) served after it equal cold B's"]


def in_flight_reasons(
    requests: tuple[InFlightRequest, ...], sources: tuple[str, ...] = ()
) -> tuple[list[str], list[str]]:
    """``(failing, informational)`` reasons for the requests that were in flight across a paused
    refit. They must end without an error, having run to their token budget, and the pause must
    have frozen them (no token while paused). Under ``keep``, whether the tokens they made after
    ``/resume`` match what the new weights compute from scratch is shown, not judged: vLLM's own
    choice (with ``clear_cache`` left at its default, a keep-pause preempts them and they
    recompute). Under a gated refit (``wait``) each must be wholly cold A's or cold B's output
    (``sources``, from ``gated_sources``): one that is neither mixed the weights."""
    failing, notes = [], []
    gated = [r for r in requests if r.pause_mode == "wait"]
    for r, source in zip(gated, sources):
        if source == "neither" and not r.error:
            where = f" on data-parallel rank {r.rank}" if r.rank is not None else ""
            failing.append(
                f"request {r.prompt}{where}, gated by the refit, made neither cold A's nor cold B's greedy tokens: "
                "it mixed the two weights"
            )
    if gated and len(sources) == len(gated):
        counts = {side: sources.count(side) for side in ("A", "B", "A=B", "neither")}
        notes.append(
            f"gated refit (/pause?mode=wait): {len(gated)} requests, {counts['A']} made cold A's tokens, "
            f"{counts['B']} cold B's, {counts['A=B']} on which A and B agree, {counts['neither']} neither"
        )
    for r in requests:
        if r.error:
            failing.append(f"in-flight request {r.prompt} failed across the paused refit: {r.error}")
        elif r.finish_reason != "length":
            failing.append(
                f"in-flight request {r.prompt} ended with finish_reason {r.finish_reason!r}, not 'length': it was "
                f"cut short across the paused refit"
            )
        if r.tokens_while_paused:
            failing.append(
                f"in-flight request {r.prompt} streamed {r.tokens_while_paused} token(s) while the engine was paused"
            )
    if requests:
        matched = [r.prompt for r in requests if r.tokens_after_resume and r.fresh_divergence is None]
        diverged = [r for r in requests if r.fresh_divergence is not None]
        line = (
            f"in-flight requests: {len(requests)} generating across the paused refit "
            f"({', '.join(f'{len(r.tokens_before_pause)}+{len(r.tokens_after_resume)}' for r in requests)} tokens "
            f"before+after the pause); after /resume "
        )
        if not diverged:
            worst = max((r.fresh_max_logprob_diff for r in requests), default=0.0)
            line += (
                f"all {len(matched)} match B (a fresh request on the same prefix, after the refit), "
                f"logprobs within {worst:.3g}"
            )
        else:
            line += (
                f"{len(diverged)} diverge from B on the same prefix (first: request {diverged[0].prompt} at token "
                f"{diverged[0].fresh_divergence} after the resume, logprobs up to "
                f"{max(r.fresh_max_logprob_diff for r in diverged):.3g} apart): they went on from state the old "
                f"weights computed"
            )
        notes.append(line)
    return failing, notes


def _evidence_reasons(c: PathComparison) -> list[str]:
    """A tensor equal before and after the refit (UNJUDGEABLE) could never have shown a
    refit that missed it; a path whose only evidence is such tensors is not a PASS."""
    refit = [d for d in c.tensors if d.check == "refit"]
    unjudgeable = sum(d.status is TensorStatus.UNJUDGEABLE for d in refit)
    judged = sum(d.status in (TensorStatus.OK, TensorStatus.REBOUND) for d in refit)
    judged += sum(d.status in (TensorStatus.OK, TensorStatus.REBOUND) for d in c.consumed)
    if refit and not judged:
        return [
            f"no judgeable evidence: none of the {len(refit)} tensor(s) differs between the weights before "
            f"and after the refit ({unjudgeable} UNJUDGEABLE), so a refit that missed them could not be seen"
        ]
    return []


def judge_sabotage(
    twin: PathComparison,
    verdict: Verdict,
    sabotage: str,
    evidence: SabotageEvidence,
    planted: str | None,
    packed_modules_mapping: tuple[tuple[str, tuple[str, ...]], ...] = (),
    *,
    policy: JudgePolicy,
) -> SabotageOutcome:
    """Was the sabotaged twin caught, with the evidence its sabotage plants? ``verdict`` is
    the twin's own verdict (judged without known issues: the twin must fail on its own, by
    ``policy``'s tolerances)."""
    failing: list[TensorDiff | ConsumedDiff] = [
        d for d in twin.tensors if d.check == "refit" and d.status in FAILING_STATUSES
    ]
    failing += [d for d in twin.consumed if d.status in FAILING_STATUSES]
    if evidence == "tokens":
        # The outputs after the refit, by the verdict's own tests: greedy tokens diverging beyond
        # the noise floor or, where the planted state moves no greedy token (stale KV of a small
        # model in fp16), logprobs beyond the tolerance.
        moved = _token_reasons(tuple(d for d in twin.tokens if d.check in ("refit", "noise")), policy)
        found = moved[0] if moved else None
    elif evidence == "encoder_cache":
        stale = twin.encoder_cache.stale if twin.encoder_cache else ()
        found = f"{len(stale)} image embedding(s) served after the refit differ from cold B's" if stale else None
    elif evidence == "drafter":
        drafted = [d for d in failing if (d.name or d.tensor).startswith(DRAFTER_PREFIX)]
        found = f"{drafted[0].tensor} {drafted[0].status.value}" if drafted else None
    else:
        modules = control_targets(planted or "", packed_modules_mapping)
        hits = [d.tensor for d in failing if any((d.name or d.tensor).startswith(m + ".") for m in modules)]
        found = f"{hits[0]} {next(d.status.value for d in failing if d.tensor == hits[0])}" if hits else None
    caught = verdict.status is VerdictStatus.FAIL and found is not None
    if caught:
        detail = f"caught: {found}"
    elif verdict.status is VerdictStatus.FAIL:
        detail = (
            f"the twin failed, but not with what its sabotage plants ({'outputs that differ from cold B' if evidence == 'tokens' else planted}):"
            f" {verdict.reasons[0] if verdict.reasons else 'no reason'}"
        )
    else:
        detail = f"the twin was {verdict.status.value}: {verdict.reasons[0] if verdict.reasons else 'nothing differed'}"
    return SabotageOutcome(
        sabotage=sabotage, evidence=evidence, planted=planted, verdict=verdict.status, caught=caught, detail=detail
    )


def with_sabotage(v: Verdict, outcome: SabotageOutcome | None) -> Verdict:
    """A PASS (or XPASS) stands only if the path's sabotaged twin was caught: otherwise this
    path could not have failed here, and the verdict is INCONCLUSIVE."""
    if outcome is None:
        return v
    if v.status in (VerdictStatus.PASS, VerdictStatus.XPASS) and not outcome.caught:
        why = f"sabotaged twin not caught ({outcome.sabotage}): this path cannot fail here; {outcome.detail}"
        return replace(v, status=VerdictStatus.INCONCLUSIVE, reasons=(why, *v.reasons), sabotage=outcome)
    return replace(v, sabotage=outcome)


def without_twin(v: Verdict) -> Verdict:
    """A verdict of a run without sabotaged twins: a PASS says, first, that it is not earned."""
    if v.status is VerdictStatus.PASS and v.sabotage is None and NO_TWIN not in v.reasons:
        return replace(v, reasons=(NO_TWIN, *v.reasons))
    return v


def _explaining(
    knowns: tuple[KnownIssue, ...], c: PathComparison, status: VerdictStatus, bad: list[TensorDiff], kernel_bad: list
) -> tuple[KnownIssue, ...]:
    """The known issues that together explain this failure, or () when they do not. An error
    is explained by its text; a failure when every failing tensor and kernel input is of a kind,
    and matches the name pattern, of one of them (tokens that diverge because of them come with it)."""
    if status is VerdictStatus.ERROR:
        return tuple(k for k in knowns if k.error_contains and any(k.error_contains in e for e in c.errors))[:1]
    if not bad and not kernel_bad:
        # Only tokens diverged, every tensor right: explained by an issue of served state (stale
        # KV, or image embeddings the encoder cache kept).
        stale_images = bool(c.encoder_cache and c.encoder_cache.stale)
        served = [k for k in knowns if (k.tokens_only and c.cache_hits) or (k.encoder_cache_stale and stale_images)]
        return tuple(served[:1])
    kinds = {d.tensor: d.kind for d in c.tensors}

    def covering(name: str, kind: str | None) -> KnownIssue | None:
        return next(
            (
                k
                for k in knowns
                if kind in k.tensor_kinds and (k.tensor_pattern is None or re.search(k.tensor_pattern, name))
            ),
            None,
        )

    used = [covering(d.tensor, d.kind) for d in bad] + [covering(d.tensor, kinds.get(d.tensor)) for d in kernel_bad]
    if any(k is None for k in used):
        return ()
    return tuple(k for k in knowns if k in used)


def _explains(
    known: KnownIssue, c: PathComparison, status: VerdictStatus, bad: list[TensorDiff], kernel_bad: list
) -> bool:
    """Whether this one known issue explains the failure on its own."""
    return bool(_explaining((known,), c, status, bad, kernel_bad))


def _against_known(v: Verdict, knowns: tuple[KnownIssue, ...], explaining: tuple[KnownIssue, ...]) -> Verdict:
    """XFAIL when the failure lies wholly inside the known issues; XPASS when they have gone."""
    if not knowns:
        return v
    if v.status is VerdictStatus.PASS:
        gone = f"known issue on {knowns[0].where} did not reproduce, so the expectation is out of date: " + " / ".join(
            k.reason for k in knowns
        )
        return replace(
            v, status=VerdictStatus.XPASS, reasons=(gone, *v.reasons), known=_titles(knowns), findings=_findings(knowns)
        )
    if explaining and v.status in (VerdictStatus.FAIL, VerdictStatus.ERROR):
        return replace(
            v,
            status=VerdictStatus.XFAIL,
            reasons=tuple(f"known issue on {k.where}: {k.reason}" for k in explaining) + v.reasons,
            known=_titles(explaining),
            findings=_findings(explaining),
        )
    if v.status in (VerdictStatus.FAIL, VerdictStatus.ERROR):
        beyond = f"beyond this path's known issue on {knowns[0].where} (" + " / ".join(k.reason for k in knowns) + ")"
        return replace(v, reasons=(*v.reasons, beyond))
    return v


def _titles(knowns: tuple[KnownIssue, ...]) -> tuple[str, ...]:
    return tuple(k.title or k.reason.split(";")[0] for k in knowns)


def _findings(knowns: tuple[KnownIssue, ...]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(k.finding for k in knowns if k.finding))


def _tensor_reason(check: str, diffs: list[TensorDiff]) -> str | None:
    if not diffs:
        return None
    counts: dict[str, int] = {}
    for d in diffs:
        counts[d.status.value] = counts.get(d.status.value, 0) + 1
    summary = ", ".join(f"{n} {s}" for s, n in counts.items())
    where = {
        "refit": "after refit A->B vs cold B",
        "idempotency": "after refitting B a second time vs the first",
        "round_trip": "after refit back to A vs cold A",
    }[check]
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
            reasons.append(
                f"prompt {d.prompt} ({d.check}) diverges at token {d.first_divergence}: "
                f"{_window(d.subject_tokens, d.first_divergence)} vs "
                f"{_window(d.reference_tokens, d.first_divergence)} (noise floor: {floor})"
            )
        elif d.max_logprob_diff > tol.logprob_atol + noise_lp:
            reasons.append(
                f"prompt {d.prompt} ({d.check}) logprobs differ by {d.max_logprob_diff:.3g} "
                f"> tolerance {tol.logprob_atol:g} + noise floor {noise_lp:.3g}"
            )
    return reasons


def _window(tokens: tuple[int, ...], at: int) -> str:
    return "[" + " ".join(str(t) for t in tokens[max(0, at - 1) : at + 2]) + "]"


def _control_reasons(c: PathComparison) -> list[str]:
    ctl = c.control
    if ctl is None:
        return ["positive control never ran: verdict cannot be trusted"]
    reasons = []
    if not ctl.detected:
        where = ", ".join(ctl.expected_modules)
        seen = f"; changed instead: {', '.join(ctl.changed[:3])}" if ctl.changed else "; nothing changed"
        reasons.append(
            f"positive control not detected: scaling {ctl.checkpoint_tensor} changed no tensor of {where}{seen}"
        )
    if not ctl.tokens_moved:
        reasons.append(
            f"positive control invisible to the token check: outputs moved by at most "
            f"{ctl.max_logprob_shift:.3g} after scaling {ctl.checkpoint_tensor}"
        )
    return reasons


def with_expected_census(verdict: Verdict, patterns: tuple[str, ...], census_names: set[str]) -> Verdict:
    """A configuration names the state its kernels read (``RunSpec.expected_census``: regular
    expressions, searched): one the census of cold B never observed makes a PASS INCONCLUSIVE,
    since a refit that missed it could not have been seen (and is named beside any other verdict)."""
    missing = [p for p in patterns if not any(re.search(p, name) for name in census_names)]
    if not missing or verdict.status in (VerdictStatus.SKIPPED, VerdictStatus.ERROR):
        return verdict
    reason = (
        f"expected in the census but never observed: {', '.join(missing)} (the state this configuration's "
        "kernels read was not reached, so a refit that missed it could not be seen)"
    )
    if verdict.status is VerdictStatus.PASS:
        return replace(verdict, status=VerdictStatus.INCONCLUSIVE, reasons=(reason, *verdict.reasons))
    return replace(verdict, reasons=(*verdict.reasons, reason))

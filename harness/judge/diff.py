"""Observations -> comparisons. Pure functions over records; no torch, no vLLM."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Literal, Protocol

from harness.errors import CompareError
from harness.records import ArmResult, ConsumedTensor, InFlightRequest, Observation, ObservationLabel, TensorRecord

Check = Literal["refit", "idempotency", "round_trip", "noise"]


class TensorStatus(str, Enum):
    OK = "OK"
    STALE = "STALE"  # equals the witness (the value before the refit), not the reference
    CORRUPT = "CORRUPT"  # equals neither (a NaN always counts as a difference)
    REBOUND = "REBOUND"  # right value, but its storage moved across the refit
    MISSING = "MISSING"  # in the reference, not in the subject
    EXTRA = "EXTRA"  # in the subject, not in the reference
    NOISY = "NOISY"  # the two cold references already disagree: not judged
    UNJUDGEABLE = "UNJUDGEABLE"  # right value, but equal before and after the refit: it could never be STALE


@dataclass(frozen=True)
class TensorDiff:
    """One tensor of one check."""

    check: Check
    """Which comparison: refit (warm B vs cold B), idempotency (B twice), round_trip
    (back to A vs cold A), noise (cold B vs cold B)."""
    tensor: str
    """Census name."""
    kind: str
    """Census kind of the subject's (or reference's) record."""
    status: TensorStatus
    """Outcome, see ``TensorStatus``."""
    subject_digest: str | None
    """Digest in the engine under test."""
    reference_digest: str | None
    """Digest it should have."""
    witness_digest: str | None
    """Digest before the refit (what a stale value would equal), if known."""
    address_moved: bool
    """Storage address changed across the refit inside the subject engine."""
    name: str = ""
    """The census name alone (``tensor`` is prefixed ``rank<N>:`` when several ranks were observed)."""
    rank: int | None = None
    """The rank that recorded it (None: a single-rank engine, or a record without ranks)."""


@dataclass(frozen=True)
class TokenDiff:
    """Greedy outputs of one prompt in one check."""

    check: Check
    """Which comparison (as in ``TensorDiff``)."""
    prompt: int
    """Prompt index."""
    first_divergence: int | None
    """Index of the first generated token that differs; None when all are identical."""
    max_logprob_diff: float
    """Largest |logprob difference| over shared top-k tokens, up to the first divergence
    (inf when a logprob is NaN on one side only)."""
    subject_tokens: tuple[int, ...]
    """Tokens from the engine under test."""
    reference_tokens: tuple[int, ...]
    """Tokens it should produce."""
    subject_text: str | None = None
    """``subject_tokens`` decoded by the checkpoint's own tokenizer (text prompts only)."""
    reference_text: str | None = None
    """``reference_tokens`` decoded the same way."""


@dataclass(frozen=True)
class ControlOutcome:
    """The planted difference B' (one checkpoint tensor scaled): was it seen, and where?"""

    checkpoint_tensor: str
    """Checkpoint name of the scaled tensor."""
    expected_modules: tuple[str, ...]
    """Model modules that tensor loads into (through vLLM's packed-module mapping)."""
    changed: tuple[str, ...]
    """Every census entry that differs between warm B' and warm B."""
    localized: tuple[str, ...]
    """The changed entries that belong to an expected module."""
    max_logprob_shift: float
    """Largest |logprob difference| between warm B' and warm B outputs."""
    tokens_moved: bool
    """Outputs moved beyond tolerance + noise: the token check can see a 1-tensor change."""
    first_kernel_input: str | None = None
    """First recorded kernel input that differs between warm B' and warm B (None when the
    scaled weight lives only inside an opaque kernel handle, as oneDNN's on CPU)."""

    @property
    def detected(self) -> bool:
        return bool(self.localized)


@dataclass(frozen=True)
class ConsumedDiff:
    """One kernel input of the recorded forward, warm vs cold B."""

    op_index: int
    """Position of the op in the subject's recorded forward (reference's if missing there)."""
    op: str
    """Op name."""
    arg: int
    """Argument position."""
    module: str
    """Module whose forward ran the op."""
    tensor: str
    """Census name or ``unregistered@...`` (prefixed ``rank<N>:`` when several ranks were observed)."""
    status: TensorStatus
    """OK, STALE, CORRUPT, REBOUND, MISSING, EXTRA or NOISY, as for census tensors."""
    name: str = ""
    """The name alone, without the rank prefix."""


@dataclass(frozen=True)
class GraphReadOutcome:
    """Under CUDA graphs: whether captured graphs were shown to leave a moved tensor's old storage
    unread, over every observation of a path that probed them (``harness.records.GraphRead``)."""

    tensor: str
    """Census name as shown (``rank<N>:`` with more than one rank)."""
    status: Literal["read", "unread", "unchecked"]
    """``unread`` only if every probe of it said so; ``read`` if any showed a read."""
    evidence: str
    """What showed it."""


@dataclass(frozen=True)
class HookRun:
    """Whether one post-load hook ran during a path's refit, and what it left stale."""

    module: str
    """Module path (``<model>`` for the model)."""
    kind: str
    """quant_method, module or model."""
    runs: int
    """Calls during the path's first refit to B."""
    stale_derived: tuple[str, ...]
    """Non-parameter tensors under this module that the refit left STALE."""


@dataclass(frozen=True)
class EncoderCacheComparison:
    """What a vision-language engine's encoder cache did across a refit, against cold B's."""

    kept: int
    """Entries the engine held when its observation after the refit began: image embeddings
    computed before the refit, still servable (0: the refit emptied the cache)."""
    compared: int
    """Images whose embeddings both the engine after the refit and cold B held (and a second
    cold B, if observed, held identically)."""
    stale: tuple[str, ...]
    """Hashes of those images whose embeddings differ from cold B's: served from before the refit."""


@dataclass(frozen=True)
class PathComparison:
    """Everything compared for one path; the verdict is judged from this alone."""

    path: str
    """Reload path name."""
    tensors: tuple[TensorDiff, ...]
    """Per-tensor outcomes of every check, model order within each check."""
    tokens: tuple[TokenDiff, ...]
    """Per-prompt outcomes of every check."""
    control: ControlOutcome | None
    """Positive-control outcome (None when the subject never reached it)."""
    errors: tuple[str, ...]
    """Arm errors that affect this path."""
    missing_observations: tuple[str, ...]
    """Labels that should have been observed and were not."""
    consumed: tuple[ConsumedDiff, ...] = ()
    """Kernel inputs of the recorded forward after refit to B, in op order."""
    hooks: tuple[HookRun, ...] = ()
    """Post-load hooks and whether this path's refit ran them."""
    notes: tuple[str, ...] = ()
    """Checks that were not run for this path, and why."""
    cache_hits: int | None = None
    """Prompt tokens the prefix cache served in the observation after the refit to B
    (None where the engine does not report them)."""
    graph_reads: tuple[GraphReadOutcome, ...] = ()
    """Moved tensors probed under CUDA graphs (``harness.arm.process.probe_graph_reads``)."""
    graphs_probed: bool = False
    """Whether any of the path's observations probed its captured graphs."""

    @property
    def graph_unread(self) -> frozenset[str]:
        """Tensors shown unread at their old storage by every captured graph."""
        return frozenset(g.tensor for g in self.graph_reads if g.status == "unread")

    in_flight: tuple[InFlightRequest, ...] = ()
    """Requests that were generating while the refit to B ran (paths that refit under
    ``/pause``), followed to their end."""
    in_flight_sources: tuple[str, ...] = ()
    """For each request of ``in_flight`` drained or queued by a gated refit (``pause_mode`` ``wait``),
    in order, whose greedy tokens it made: ``A`` (the subject's cold start), ``B`` (cold B), ``A=B``
    (the two agree on that prompt), or ``neither`` (it mixed weights, or is not whole)."""
    acceptance: tuple[float, float] | None = None
    """A speculative-decoding engine's draft acceptance rates, ``(after the refit to B, cold B)``,
    when both were counted and the two cold starts on B agreed on theirs; None otherwise."""
    encoder_cache: EncoderCacheComparison | None = None
    """A vision-language engine's encoder cache after the refit to B against cold B's; None for
    text prompts."""


class Digested(Protocol):
    """What the classifier reads of a census tensor or a recorded kernel input."""

    @property
    def digest(self) -> str: ...
    @property
    def dtype(self) -> str: ...
    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def nan_count(self) -> int | None: ...


def _same(a: Digested, b: Digested) -> bool:
    # A NaN is a difference even where both sides hold NaN bytes.
    return (
        a.digest == b.digest
        and a.dtype == b.dtype
        and tuple(a.shape) == tuple(b.shape)
        and a.nan_count == 0
        and b.nan_count == 0
    )


def classify(
    subject: Digested | None,
    reference: Digested | None,
    witness: Digested | None = None,
    *,
    moved: bool = False,
    noisy: bool = False,
) -> TensorStatus:
    """The one status ladder for census tensors and kernel inputs alike. ``witness`` is the
    value before the refit: equal to it and not to the reference is STALE; equal to both
    is UNJUDGEABLE, since such a tensor could never have shown a refit that missed it."""
    if subject is None:
        return TensorStatus.MISSING
    if reference is None:
        return TensorStatus.EXTRA
    if noisy:
        return TensorStatus.NOISY
    if _same(subject, reference):
        if moved:
            return TensorStatus.REBOUND
        return TensorStatus.UNJUDGEABLE if witness is not None and _same(witness, reference) else TensorStatus.OK
    if witness is not None and _same(subject, witness):
        return TensorStatus.STALE
    return TensorStatus.CORRUPT


def _by_name(obs: Observation) -> dict[str, TensorRecord]:
    """Census records by the name a report shows (``rank<N>:`` first with more than one rank)."""
    return {obs.shown_name(t): t for t in obs.tensors}


def compare_tensors(
    check: Check,
    subject: Observation,
    reference: Observation,
    witness: Observation | None = None,
    before: Observation | None = None,
    noisy: frozenset[str] = frozenset(),
) -> tuple[TensorDiff, ...]:
    """Judge every tensor of ``subject`` against ``reference``.

    ``witness`` is the value before the refit (STALE = equals it and not the reference);
    ``before`` is the same engine before the refit (REBOUND = address changed).
    """
    subj, ref = _by_name(subject), _by_name(reference)
    wit = _by_name(witness) if witness else {}
    prev = _by_name(before) if before else {}
    names = list(ref) + [n for n in subj if n not in ref]
    diffs = []
    for name in names:
        s, r, w, p = subj.get(name), ref.get(name), wit.get(name), prev.get(name)
        moved = bool(s and p and s.kind != "kernel" and s.address != p.address and s.address and p.address)
        status = classify(s, r, w, moved=moved, noisy=name in noisy)
        rec = s or r
        assert rec is not None  # the name came from one side
        diffs.append(
            TensorDiff(
                check=check,
                tensor=name,
                kind=rec.kind,
                status=status,
                subject_digest=s.digest if s else None,
                reference_digest=r.digest if r else None,
                witness_digest=w.digest if w else None,
                address_moved=moved,
                name=rec.name,
                rank=rec.rank,
            )
        )
    return tuple(diffs)


def compare_outputs(check: Check, subject: Observation, reference: Observation) -> tuple[TokenDiff, ...]:
    ref = {o.prompt: o for o in reference.outputs}
    diffs = []
    for s in subject.outputs:
        r = ref.get(s.prompt)
        if r is None:
            continue
        first = next((i for i, (a, b) in enumerate(zip(s.token_ids, r.token_ids)) if a != b), None)
        if first is None and len(s.token_ids) != len(r.token_ids):
            first = min(len(s.token_ids), len(r.token_ids))
        horizon = (first + 1) if first is not None else len(s.logprobs)
        worst = 0.0
        for pos_s, pos_r in list(zip(s.logprobs, r.logprobs))[:horizon]:
            rmap = dict(pos_r)
            for tok, lp in pos_s:
                if tok in rmap:
                    worst = max(worst, _abs_diff(lp, rmap[tok]))
        diffs.append(
            TokenDiff(
                check=check,
                prompt=s.prompt,
                first_divergence=first,
                max_logprob_diff=worst,
                subject_tokens=tuple(s.token_ids),
                reference_tokens=tuple(r.token_ids),
                subject_text=s.text,
                reference_text=r.text,
            )
        )
    return tuple(diffs)


def _abs_diff(a: float, b: float) -> float:
    if math.isnan(a) and math.isnan(b):
        return math.inf  # NaN counts as a difference
    if math.isnan(a) or math.isnan(b):
        return math.inf
    return abs(a - b)


def control_targets(
    checkpoint_tensor: str, packed_modules_mapping: tuple[tuple[str, tuple[str, ...]], ...]
) -> tuple[str, ...]:
    """Model modules a checkpoint tensor loads into: its own module, and the fused module
    that packs it (``...q_proj.weight`` -> ``...q_proj`` and ``...qkv_proj``)."""
    module, _, _ = checkpoint_tensor.rpartition(".")
    parent, _, leaf = module.rpartition(".")
    targets = [module]
    for packed, parts in packed_modules_mapping:
        if leaf in parts:
            targets.append(f"{parent}.{packed}" if parent else packed)
    return tuple(dict.fromkeys(targets))


def compare_control(
    checkpoint_tensor: str,
    control: Observation,
    baseline: Observation,
    logprob_floor: float,
    noise: Observation | None = None,
    reference: Observation | None = None,
    noisy: frozenset[str] = frozenset(),
) -> ControlOutcome:
    """``control`` is warm B', ``baseline`` warm B in the same engine: only the planted
    difference separates them. Tensors and kernel inputs that differ between the two cold
    references (``noisy``; ``noise`` vs ``reference``) carry no information and are skipped:
    an opaque kernel handle rebuilt by the reload must not count as seeing the control."""
    diffs = compare_tensors("refit", control, baseline, noisy=noisy)
    changed = tuple(
        d.tensor for d in diffs if d.status not in (TensorStatus.OK, TensorStatus.REBOUND, TensorStatus.NOISY)
    )
    targets = control_targets(checkpoint_tensor, control.model.packed_modules_mapping)
    bare = {o.shown_name(t): t.name for o in (baseline, control) for t in o.tensors}
    localized = tuple(n for n in changed if any(bare[n].startswith(t + ".") for t in targets))
    token_diffs = compare_outputs("refit", control, baseline)
    shift = max((d.max_logprob_diff for d in token_diffs), default=0.0)
    moved = any(d.first_divergence is not None for d in token_diffs) or shift > logprob_floor
    ref_inputs = _consumed_by_key(reference)
    noisy_inputs = {
        k for k, d in _consumed_by_key(noise).items() if (r := ref_inputs.get(k)) is not None and r.digest != d.digest
    }
    base = _consumed_by_key(baseline)
    first = next(
        (
            control.shown_name(c)
            for k, c in _consumed_by_key(control).items()
            if k not in noisy_inputs and k in base and base[k].digest != c.digest
        ),
        None,
    )
    return ControlOutcome(
        checkpoint_tensor=checkpoint_tensor,
        expected_modules=targets,
        changed=changed,
        localized=localized,
        max_logprob_shift=shift,
        tokens_moved=moved,
        first_kernel_input=first,
    )


def noisy_tensors(reference: ArmResult | None, noise: ArmResult | None) -> frozenset[str]:
    """Tensors on which two cold starts on B disagree."""
    r, n = _first_obs(reference), _first_obs(noise)
    if r is None or n is None:
        return frozenset()
    return frozenset(d.tensor for d in compare_tensors("noise", n, r) if d.status is not TensorStatus.OK)


def _first_obs(arm: ArmResult | None) -> Observation | None:
    return arm.observations[0] if arm and arm.observations else None


def noise_logprob_floor(reference: ArmResult | None, noise: ArmResult | None) -> dict[int, TokenDiff]:
    r, n = _first_obs(reference), _first_obs(noise)
    if r is None or n is None:
        return {}
    return {d.prompt: d for d in compare_outputs("noise", n, r)}


ConsumedKey = tuple[str, str, int, int]


def _consumed_by_key(obs: Observation | None) -> dict[ConsumedKey, ConsumedTensor]:
    """Align recorded forwards by (module, op, arg, occurrence), robust to ops added elsewhere."""
    out: dict[ConsumedKey, ConsumedTensor] = {}
    counts: dict[tuple[str, str, int], int] = {}
    for c in obs.consumed if obs else ():
        base = (c.module, c.op, c.arg)
        counts[base] = counts.get(base, 0) + 1
        out[base + (counts[base],)] = c
    return out


def _common_steps(
    subj: dict[ConsumedKey, ConsumedTensor], ref: dict[ConsumedKey, ConsumedTensor]
) -> tuple[dict[ConsumedKey, ConsumedTensor], dict[ConsumedKey, ConsumedTensor]]:
    """Both recordings cut to the occurrences both made of each (module, op, arg) that both ran.
    Measured: the recorded prefill is one engine step on one side and two on the other, as the
    scheduler happens to split it (an engine core of its own, under load); every weight is read in
    each step, so the common steps judge them all. An op only one side ran stays MISSING or EXTRA."""
    seen_s: dict[tuple[str, str, int], int] = {}
    seen_r: dict[tuple[str, str, int], int] = {}
    for key in subj:
        seen_s[key[:3]] = max(seen_s.get(key[:3], 0), key[3])
    for key in ref:
        seen_r[key[:3]] = max(seen_r.get(key[:3], 0), key[3])

    def keep(key: ConsumedKey) -> bool:
        s, r = seen_s.get(key[:3], 0), seen_r.get(key[:3], 0)
        return not (s and r) or key[3] <= min(s, r)

    return {k: v for k, v in subj.items() if keep(k)}, {k: v for k, v in ref.items() if keep(k)}


def _same_state(recording: dict[ConsumedKey, ConsumedTensor], key: ConsumedKey) -> ConsumedTensor | None:
    """``key``'s entry in a recording, else that (module, op, arg) at the last step the recording
    made: every engine step reads the same state, and a recording may hold fewer steps than the
    two it is held against (measured: the noise floor's prefill in one step, the reference's and
    the subject's in two, a oneDNN handle's pointer bytes then unjudged in the second: CORRUPT)."""
    found = recording.get(key)
    if found is not None or key[3] == 1:
        return found
    return next((recording[key[:3] + (k,)] for k in range(key[3] - 1, 0, -1) if key[:3] + (k,) in recording), None)


def compare_consumed(
    subject: Observation,
    reference: Observation,
    witness: Observation | None,
    before: Observation | None,
    noise: Observation | None,
    noise_reference: Observation | None = None,
) -> tuple[ConsumedDiff, ...]:
    """Every kernel input of the subject's recorded forward against the reference's. An input
    on which ``noise`` and ``noise_reference`` (two cold starts on the same weights; by default
    ``reference`` itself) disagree is NOISY."""
    subj, ref = _common_steps(_consumed_by_key(subject), _consumed_by_key(reference))
    wit, prev, noisy = _consumed_by_key(witness), _consumed_by_key(before), _consumed_by_key(noise)
    floor = _consumed_by_key(noise_reference) if noise_reference is not None else ref
    diffs = []
    for key in list(subj) + [k for k in ref if k not in subj]:
        s, r = subj.get(key), ref.get(key)
        w, p, n, f = (_same_state(d, key) for d in (wit, prev, noisy, floor))
        moved = s is not None and p is not None and p.address != s.address and (p.rank, p.name) == (s.rank, s.name)
        status = classify(s, r, w, moved=moved, noisy=n is not None and f is not None and n.digest != f.digest)
        c = s if s is not None else r
        assert c is not None and reference is not None  # the key came from one side
        shown = subject.shown_name(c) if s is not None else reference.shown_name(c)
        diffs.append(
            ConsumedDiff(
                op_index=c.op_index, op=c.op, arg=c.arg, module=c.module, tensor=shown, status=status, name=c.name
            )
        )
    return tuple(sorted(diffs, key=lambda d: d.op_index))


def hook_runs(before: Observation | None, after: Observation, refit: tuple[TensorDiff, ...]) -> tuple[HookRun, ...]:
    """Which post-load hooks ran between two observations of one engine, and which
    derived (non-parameter) tensors under each hooked module the refit left STALE."""
    earlier = {(h.module, h.kind): h.calls for h in before.hooks} if before else {}
    stale = [d.tensor for d in refit if d.status is TensorStatus.STALE and d.kind not in ("parameter", "buffer")]
    runs = []
    for h in after.hooks:
        prefix = "" if h.module == "<model>" else h.module + "."
        runs.append(
            HookRun(
                module=h.module,
                kind=h.kind,
                runs=h.calls - earlier.get((h.module, h.kind), 0),
                stale_derived=tuple(t for t in stale if t.startswith(prefix)),
            )
        )
    return tuple(runs)


def segment_observations(subject: ArmResult, path: str) -> tuple[dict[str, Observation], Observation | None]:
    """The path's own observations by stage, and the observation taken just before its
    segment began: the value a stale tensor keeps."""
    own: dict[str, Observation] = {}
    before: Observation | None = None
    for obs in subject.observations:
        if obs.label.path == path:
            own[obs.label.stage] = obs
        elif not own:
            before = obs
    return own, before


def compare_path(
    path: str,
    subject: ArmResult,
    reference: ArmResult | None,
    noise: ArmResult | None,
    control_tensor: str,
    logprob_atol: float,
    expected: tuple[str, ...],
    same_mode: bool = True,
    same_engine: bool = True,
    refit_reference: ArmResult | None = None,
) -> PathComparison:
    """All checks for one path, from the arms' records. ``expected`` lists the stages the
    plan said this path's segment would observe.
    ``same_mode`` is False when the subject runs compiled and the reference eager: their
    recorded op sequences are different programs, so kernel inputs are not compared.
    ``same_engine`` is False when the path starts a new engine at every refit: addresses
    and post-load hook counts then belong to different processes and are not compared.
    ``refit_reference``: a cold B in the subject's own mode, when that is not the run's; the
    refit is compared with it, while the noise floor stays the run's reference/noise pair."""
    errors = tuple(
        f"{a.arm}: {a.error}"
        for a in (reference, noise, refit_reference, subject)
        if a is not None and a.status == "error"
    )
    if reference is None or _first_obs(reference) is None:
        errors += ("reference arm (cold B) produced no observation",)
    obs, before = segment_observations(subject, path)
    missing = tuple(label for label in expected if label not in obs)
    ref = _first_obs(reference)
    noisy = noisy_tensors(reference, noise)
    noise_tokens = noise_logprob_floor(reference, noise)
    moved_from = before if same_engine else None  # addresses are comparable within one engine only
    tensors: list[TensorDiff] = []
    tokens: list[TokenDiff] = []
    noise_obs = _first_obs(noise)
    if ref is not None and noise_obs is not None:
        tensors += compare_tensors("noise", noise_obs, ref)
        tokens += noise_tokens.values()
    cold_b = _first_obs(refit_reference) if refit_reference is not None else ref
    if refit_reference is not None and cold_b is None:
        errors += (f"{refit_reference.arm} (cold B in the subject's mode) produced no observation",)
    if cold_b is not None and "warm_B" in obs:
        tensors += compare_tensors("refit", obs["warm_B"], cold_b, witness=before, before=moved_from, noisy=noisy)
        tokens += compare_outputs("refit", obs["warm_B"], cold_b)
    if "warm_B" in obs and "warm_B_again" in obs:
        tensors += compare_tensors(
            "idempotency",
            obs["warm_B_again"],
            obs["warm_B"],
            before=obs["warm_B"] if same_engine else None,
            noisy=noisy,
        )
        tokens += compare_outputs("idempotency", obs["warm_B_again"], obs["warm_B"])
    cold_a = subject.observation(ObservationLabel("cold_A"))
    if cold_a is not None and "warm_A" in obs:
        tensors += compare_tensors(
            "round_trip", obs["warm_A"], cold_a, witness=obs.get("warm_B_control"), before=moved_from, noisy=noisy
        )
        tokens += compare_outputs("round_trip", obs["warm_A"], cold_a)
    consumed: tuple[ConsumedDiff, ...] = ()
    hooks: tuple[HookRun, ...] = ()
    notes: tuple[str, ...] = ()
    if ref is not None and "warm_B" in obs:
        if same_mode and cold_b is not None:
            # Against the refit's own reference (a trainer step's cold start); the noise floor stays the run's pair.
            consumed = compare_consumed(
                obs["warm_B"], cold_b, witness=before, before=moved_from, noise=_first_obs(noise), noise_reference=ref
            )
        else:
            notes = (
                "kernel inputs not compared: the subject runs compiled and the reference eager, so their "
                "recorded op sequences are different programs (tensors and tokens are still compared)",
            )
        if same_engine:
            hooks = hook_runs(before, obs["warm_B"], tuple(d for d in tensors if d.check == "refit"))
        else:
            notes += ("addresses and post-load hook runs not compared: the path starts a new engine at every refit",)
    control = None
    if "warm_B_control" in obs and "warm_B" in obs:
        floor = logprob_atol + max((d.max_logprob_diff for d in noise_tokens.values()), default=0.0)
        control = compare_control(
            control_tensor,
            obs["warm_B_control"],
            obs["warm_B"],
            floor,
            noise=_first_obs(noise),
            reference=ref,
            noisy=noisy,
        )
    probed = [o for o in obs.values() if o.graphs_probed]
    return PathComparison(
        path=path,
        graph_reads=graph_read_outcomes(probed),
        graphs_probed=bool(probed),
        tensors=tuple(tensors),
        tokens=tuple(tokens),
        control=control,
        errors=errors,
        missing_observations=missing,
        consumed=consumed,
        hooks=hooks,
        notes=notes,
        cache_hits=cache_hits(obs.get("warm_B")),
        in_flight=obs["warm_B"].in_flight if "warm_B" in obs else (),
        in_flight_sources=gated_sources(
            obs["warm_B"].in_flight if "warm_B" in obs else (),
            next((o for o in subject.observations if o.label.stage == "cold_A"), None),
            cold_b,
        ),
        acceptance=acceptance_rates(obs.get("warm_B"), cold_b, noise_obs),
        encoder_cache=compare_encoder_caches(obs.get("warm_B"), cold_b, noise_obs),
    )


def compare_encoder_caches(
    warm: Observation | None, cold: Observation | None, noise: Observation | None
) -> EncoderCacheComparison | None:
    """The engine's encoder cache after the refit against cold B's, image by image; an image a
    second cold B embedded otherwise is no evidence. None unless both recorded theirs."""
    if warm is None or cold is None or warm.encoder_cache is None or cold.encoder_cache is None:
        return None
    reference = {e.mm_hash: e.digest for e in cold.encoder_cache}
    if noise is not None and noise.encoder_cache is not None:
        again = {e.mm_hash: e.digest for e in noise.encoder_cache}
        reference = {h: d for h, d in reference.items() if again.get(h, d) == d}
    both = [e for e in warm.encoder_cache if e.mm_hash in reference]
    return EncoderCacheComparison(
        kept=warm.encoder_cache_kept or 0,
        compared=len(both),
        stale=tuple(e.mm_hash for e in both if e.digest != reference[e.mm_hash]),
    )


def gated_sources(
    requests: tuple[InFlightRequest, ...], cold_a: Observation | None, cold_b: Observation | None
) -> tuple[str, ...]:
    """Whose greedy tokens each request of a gated refit made (``PathComparison.in_flight_sources``):
    its whole output against the cold starts' outputs for its prompt."""
    made = {
        side: {o.prompt: o.token_ids for o in observation.outputs} if observation else {}
        for side, observation in (("A", cold_a), ("B", cold_b))
    }
    sources = []
    for r in requests:
        if r.pause_mode != "wait":
            continue
        whole = r.tokens_before_pause + r.tokens_after_resume
        found = [side for side in ("A", "B") if made[side].get(r.prompt) == whole]
        sources.append("=".join(found) or "neither")
    return tuple(sources)


def acceptance_rates(
    warm: Observation | None, cold: Observation | None, noise: Observation | None
) -> tuple[float, float] | None:
    """``(warm B's, cold B's)`` draft acceptance rates, where both were counted and a second cold B,
    if observed, accepted exactly as the first (else the rate is no evidence: None)."""
    rates = [o.acceptance_rate if o is not None else None for o in (warm, cold)]
    if rates[0] is None or rates[1] is None:
        return None
    if noise is not None and noise.acceptance_rate is not None and noise.acceptance_rate != rates[1]:
        return None
    return rates[0], rates[1]


def graph_read_outcomes(observations: list[Observation]) -> tuple[GraphReadOutcome, ...]:
    """One outcome per moved tensor over the probed observations: ``read`` beats ``unchecked``
    beats ``unread``, so a tensor is unread only if every probe showed it so."""
    rank = {"read": 2, "unchecked": 1, "unread": 0}
    worst: dict[str, GraphReadOutcome] = {}
    for o in observations:
        for g in o.graph_reads:
            name = o.shown_name(g)
            if name not in worst or rank[g.status] > rank[worst[name].status]:
                worst[name] = GraphReadOutcome(name, g.status, g.evidence)
    return tuple(worst[n] for n in sorted(worst))


def cache_hits(observation: Observation | None) -> int | None:
    """Prompt tokens served from the prefix cache in one observation's generation."""
    counts = [o.cached_tokens for o in observation.outputs] if observation else []
    known = [c for c in counts if c is not None]
    return sum(known) if counts and len(known) == len(counts) else None


def one_digest(arms: Iterable[ArmResult], what: str) -> str | None:
    """The digest algorithm the arms recorded (None: none recorded one). Digests of different
    algorithms never match, so comparing them would call every tensor CORRUPT: refused, exit 2,
    with the records left as they are."""
    used: dict[str, str] = {}  # algorithm -> the first arm that used it
    for arm in arms:
        algorithm = dict(arm.environment).get("digest")
        if algorithm:  # an arm that failed before recording its environment digested nothing
            used.setdefault(algorithm, arm.arm)
    if len(used) > 1:
        raise CompareError(
            f"{what}: the arms digested tensors with different algorithms ("
            + ", ".join(f"{arm}: {algorithm}" for algorithm, arm in used.items())
            + "), and digests of different algorithms cannot be compared; run them again with one --digest"
        )
    return next(iter(used), None)

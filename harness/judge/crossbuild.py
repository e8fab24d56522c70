"""Two builds side by side: base vs pr, with base2 (base run again) as the noise floor.

Pure: works from the records of finished runs (``pipeline.evaluate``), never imports vLLM or
torch. Every difference between base and pr is set against the same measure between base and
base2 (and, for values, against the cold-vs-cold noise inside each run). A difference that the
floor shows too is "no measurable difference", never a gain or a loss.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from harness.cpu_isa import describe_cpu, same_dispatch
from harness.errors import CompareError
from harness.judge import exit_codes
from harness.judge.diff import TensorStatus, compare_outputs, compare_tensors, one_digest
from harness.judge.evaluation import Evaluation
from harness.judge.verdict import FAILING_STATUSES, UNEARNED_PASS, VerdictStatus
from harness.records import ArmResult, Observation

Outcome = Literal["identical", "no measurable difference", "differs", "only in base", "only in pr", "not measured"]
NO_DIFFERENCE = "no measurable difference"
VERDICTS = tuple(s.value for s in VerdictStatus)
# A verdict moving from the left set to the right one is a regression when nothing was expected:
# from one that exits 0 to one that does not.
BAD_VERDICTS = frozenset(s.value for s in exit_codes.BAD)
GOOD_VERDICTS = frozenset(VERDICTS) - BAD_VERDICTS | {UNEARNED_PASS}
FIXED_FROM = frozenset({"FAIL", "XFAIL"})
"""Verdicts on base that a PASS on pr fixes (an XFAIL is a known vLLM issue that pr no longer has)."""


@dataclass(frozen=True)
class BuildFacts:
    """Provenance of one run, as its arms recorded it."""

    label: str
    """Role in the comparison: ``base``, ``pr`` or ``base2``."""
    build: str
    """Build name the run was made with (``--build NAME=...``), or the directory name."""
    directory: str
    """Run directory."""
    vllm: str
    """vLLM version the arms imported."""
    vllm_git_sha: str
    """vLLM commit, when the build records one (source builds); empty for PyPI wheels."""
    torch: str
    """torch version."""
    torch_git_sha: str
    """torch commit."""
    python_executable: str
    """Interpreter the arms ran under."""
    device: str
    """Device the arms ran on."""
    cpu: str
    """The CPU as vLLM saw it (``harness.cpu_isa.describe_cpu``): its kernels depend on it."""
    harness_git_sha: str
    """Commit of the harness that ran."""
    started: str
    """UTC start of the run."""


@dataclass(frozen=True)
class BuildExpectation:
    """An expected verdict for the cells of one build (``base=FAIL``, ``pr:reload_weights=PASS``)."""

    build: str
    """Label it applies to: ``base``, ``pr`` or ``base2``."""
    cells: str
    """Glob over path names (``*``: every path both runs judged)."""
    verdict: str
    """Expected verdict."""


@dataclass(frozen=True)
class ExpectationOutcome:
    """Whether one expectation held."""

    expectation: BuildExpectation
    """What was expected."""
    actual: tuple[tuple[str, str], ...]
    """(path, verdict) of each cell it covered."""
    met: bool
    """Every covered cell had the expected verdict (and at least one was covered)."""
    implied: bool = False
    """No expectation was given: this is the implied "no cell regressed on pr"."""


@dataclass(frozen=True)
class VerdictRow:
    """One cell (reload path) across builds."""

    path: str
    """Reload path."""
    base: str | None
    """Verdict on base (None: not run there)."""
    pr: str | None
    """Verdict on pr."""
    base2: str | None
    """Verdict on base2 (None: no noise run, or not run there)."""
    outcome: str
    """``same``, ``changed``, ``regressed`` (good on base, bad on pr), ``fixed in vLLM X`` (FAIL
    or XFAIL on base, PASS on pr, whose different vLLM is X: what a release fixed), ``fixed`` (the
    same, on one vLLM: what the PR or the fixed twin fixed), ``unstable`` (base and
    base2 disagree), ``only in base`` or ``only in pr``."""
    base_reason: str
    """First reason on base."""
    pr_reason: str
    """First reason on pr."""


@dataclass(frozen=True)
class TokenRow:
    """Greedy tokens of one prompt on cold B: pr vs base, against base2 vs base."""

    prompt: int
    """Prompt index."""
    first_divergence: int | None
    """First generated token where pr differs from base (None: identical)."""
    max_logprob_diff: float
    """Largest |logprob difference| up to that point."""
    floor_first_divergence: int | None
    """The same between base2 and base (None: identical, or no base2)."""
    floor_logprob_diff: float
    """Largest |logprob difference| base2 vs base (or, without base2, cold B twice inside base)."""
    floor_source: str
    """``base2`` or ``cold B twice in base`` (no base2 given)."""
    outcome: str
    """``identical``, ``no measurable difference`` or ``differs``."""
    base_tokens: tuple[int, ...]
    """Tokens on base."""
    pr_tokens: tuple[int, ...]
    """Tokens on pr."""


@dataclass(frozen=True)
class TensorStatusChange:
    """A tensor whose warm-vs-cold status changed between base and pr for one path and check."""

    path: str
    """Reload path."""
    check: str
    """refit, idempotency or round_trip."""
    tensor: str
    """Census name."""
    kind: str
    """Census kind."""
    base: str
    """Status on base (``-`` when absent there)."""
    pr: str
    """Status on pr (``-`` when absent there)."""
    base2: str | None
    """Status on base2, when there is one."""
    decides: bool
    """A judged status that fails a verdict (STALE, CORRUPT, MISSING, EXTRA) on one side."""


@dataclass(frozen=True)
class ValueRow:
    """One census tensor of cold B (the reference arm) whose value differs between base and pr."""

    tensor: str
    """Census name."""
    kind: str
    """Census kind."""
    layer: str
    """``layer N``, ``embed``, ``head`` or ``other``: where it sits in the model."""
    base_absmax: float | None
    """Largest |value| on base."""
    pr_absmax: float | None
    """Largest |value| on pr."""
    relative_change: float | None
    """|pr - base| / |base| of that largest |value|: a readable size (the digest decides)."""
    outcome: str
    """``differs``, ``no measurable difference`` (also differs base vs base2 or cold vs cold),
    ``only in base`` or ``only in pr``."""


@dataclass(frozen=True)
class HookRow:
    """Post-load hooks (mounting points) of one class, counted on cold B in each build."""

    owner: str
    """Class whose ``process_weights_after_loading`` it is (or a module-path pattern in old records)."""
    kind: str
    """quant_method, module or model."""
    base: int
    """Hooks of this class on base."""
    pr: int
    """On pr."""
    base_runs_on_refit: int
    """Of those, how many ran during base's first ``reload_weights``-style refit (max over paths)."""
    pr_runs_on_refit: int
    """The same on pr."""
    outcome: str
    """``same`` or ``changed``."""


@dataclass(frozen=True)
class TimingRow:
    """Wall time of one kind of arm (engine start included), per build: a coarse speed measure."""

    arm: str
    """Arm name (``reference``, ``noise``, ``subject-...``)."""
    base_seconds: float | None
    """On base."""
    pr_seconds: float | None
    """On pr."""
    base2_seconds: float | None
    """On base2."""
    delta: float | None
    """pr - base, seconds."""
    band: float | None
    """|base2 - base|: the run-to-run spread."""
    outcome: str
    """``no measurable difference`` (|delta| <= band), ``slower``, ``faster``, ``not measured``, or
    ``not comparable (machine loaded)`` when beyond the band on a machine with more load than CPUs."""


@dataclass(frozen=True)
class ThroughputRow:
    """Generation throughput at one point (cold B, or a path after its refit), per build."""

    point: str
    """``cold_B`` or a reload path."""
    base_median: float | None
    """tokens/s on base (median)."""
    pr_median: float | None
    """On pr."""
    base2_median: float | None
    """On base2."""
    band_low: float | None
    """Lowest sample of base and base2 together: the floor's band."""
    band_high: float | None
    """Highest sample of base and base2 together."""
    outcome: str
    """``no measurable difference`` (pr's median inside the band), ``slower``, ``faster`` or ``not measured``."""
    slower_than_cold: str
    """Builds whose refit engine is slower than their own cold B beyond its floor, e.g. ``pr``."""


@dataclass(frozen=True)
class AccuracyRow:
    """Exact-match accuracy at one point (cold B, the damaged copy of B, or a path after its refit), per build."""

    point: str
    """``cold_B``, ``cold_B_damaged`` or a reload path."""
    base_accuracy: float | None
    """Fraction correct on base (mean over the point's arms: cold B is measured twice)."""
    pr_accuracy: float | None
    """On pr."""
    base2_accuracy: float | None
    """On base2."""
    delta: float | None
    """pr - base."""
    band_low: float | None
    """Lowest fraction of base's and base2's arms at this point: the floor's band."""
    band_high: float | None
    """Highest of them."""
    outcome: str
    """``no measurable difference`` (pr inside the band), ``lower``, ``higher``, ``not measured``, or
    ``no discriminating power`` (in base or pr, the damaged arm scored no lower than cold B)."""
    differs_from_cold: str
    """Builds whose refit engine's accuracy differs from their own cold B beyond its floor, e.g. ``pr``."""


@dataclass(frozen=True)
class BuildComparison:
    """Everything the comparison report shows."""

    builds: tuple[BuildFacts, ...]
    """base, pr and (if given) base2."""
    verdicts: tuple[VerdictRow, ...]
    """Per cell."""
    tokens: tuple[TokenRow, ...]
    """Per prompt, cold B."""
    status_changes: tuple[TensorStatusChange, ...]
    """Tensors whose status changed, deciding ones first."""
    values: tuple[ValueRow, ...]
    """Cold-B tensor values that differ between builds."""
    layer_change: tuple[tuple[str, float, float | None], ...]
    """(layer, largest relative |max| change pr vs base, the same base2 vs base) per layer."""
    hooks: tuple[HookRow, ...]
    """Mounting points by class."""
    timings: tuple[TimingRow, ...]
    """Arm wall times."""
    expectations: tuple[ExpectationOutcome, ...]
    """Explicit expectations, or the implied one (no cell regressed)."""
    notes: tuple[str, ...]
    """Things a reviewer must know (no base2, different checkpoints...)."""
    command: str
    """Command line that made the comparison."""
    throughput: tuple[ThroughputRow, ...] = ()
    """The throughput probe, when the runs had ``--throughput``."""
    accuracy: tuple[AccuracyRow, ...] = ()
    """The accuracy probe, when the runs had ``--accuracy``."""

    @property
    def exit_code(self) -> int:
        return exit_codes.for_expectations(e.met for e in self.expectations)

    def build(self, label: str) -> BuildFacts | None:
        return next((b for b in self.builds if b.label == label), None)


def parse_expectation(text: str) -> BuildExpectation:
    """``base=FAIL`` or ``pr:reload_weights=PASS``."""
    left, sep, verdict = text.partition("=")
    build, _, cells = left.partition(":")
    verdict = verdict.strip().upper()
    if not sep or build.strip() not in ("base", "pr", "base2") or verdict not in VERDICTS:
        raise CompareError(
            f"--expect takes NAME=VERDICT or NAME:PATH_GLOB=VERDICT with NAME base, pr or base2 (or a "
            f"--build name) and VERDICT one of {', '.join(VERDICTS)}; got {text!r}"
        )
    return BuildExpectation(build=build.strip(), cells=cells.strip() or "*", verdict=verdict)


def facts_of(label: str, ev: Evaluation, directory: Path) -> BuildFacts:
    env: dict[str, str] = {}
    for arm in ev.arms:  # every arm records the same; the first that has it wins
        for k, v in arm.environment:
            env.setdefault(k, v)
    build = ev.record.spec.build
    return BuildFacts(
        label=label,
        build=build.name if build else env.get("build", directory.name),
        directory=str(directory),
        vllm=env.get("vllm", "?"),
        vllm_git_sha=env.get("vllm_git_sha", ""),
        torch=env.get("torch", "?"),
        torch_git_sha=env.get("torch_git_sha", ""),
        python_executable=env.get("python_executable", build.python if build else ""),
        device=env.get("device", "?"),
        cpu=describe_cpu(run_cpu(ev)),
        harness_git_sha=ev.record.git_sha,
        started=ev.record.started,
    )


def run_cpu(ev: Evaluation):
    """The CPU a run's vLLM saw: its reference arm's record, any arm's, else the run record's."""
    arms = sorted((a for a in ev.arms if a.cpu is not None), key=lambda a: a.role != "reference")
    return arms[0].cpu if arms else ev.record.cpu


def cpu_notes(runs: dict[str, Evaluation | None], allow_mismatch: bool) -> list[str]:
    """Two builds measured on CPUs that take different vLLM kernel branches cannot be compared:
    a verdict, a value or a hook may differ by the instruction set alone (docs/isa.md). Refused
    (``CompareError``), unless allowed, when it is then a note; a run that did not record its
    CPU is a note."""
    cpus = {label: run_cpu(ev) for label, ev in runs.items() if ev is not None}
    unknown = [label for label, cpu in cpus.items() if cpu is None]
    if unknown:
        return [
            f"{', '.join(unknown)} recorded no CPU capabilities (an older harness): a difference in vLLM's CPU "
            "kernel branches between the builds cannot be ruled out"
        ]
    base = cpus["base"]
    other = {label: cpu for label, cpu in cpus.items() if label != "base" and not same_dispatch(base, cpu)}
    if not other:
        return []
    text = f"base was measured on {describe_cpu(base)}; " + "; ".join(
        f"{label} on {describe_cpu(cpu)}" for label, cpu in other.items()
    )
    if not allow_mismatch:
        raise CompareError(
            f"the runs were measured on CPUs that take different vLLM kernel branches ({text}): their verdicts "
            "may differ by the instruction set alone; measure both builds on one machine kind, or pass "
            "--allow-cpu-mismatch to compare them anyway"
        )
    return [f"the builds were measured on different CPUs ({text}): differences may come from the instruction set"]


def model_notes(runs: dict[str, Evaluation | None], allow_mismatch: bool) -> list[str]:
    """Two runs of different models or dtypes cannot be compared: every difference would be
    the model's, not the build's. Refused (``CompareError``), unless allowed, when it is then a note."""
    seen = {
        label: (ev.record.checkpoints.a, ev.record.spec.engine.dtype) for label, ev in runs.items() if ev is not None
    }
    base = seen["base"]
    other = {label: s for label, s in seen.items() if s != base}
    if not other:
        return []
    text = f"base ran {base[0]} in {base[1]}; " + "; ".join(
        f"{label} ran {m} in {d}" for label, (m, d) in other.items()
    )
    if not allow_mismatch:
        raise CompareError(
            f"the runs are of different models or dtypes ({text}): every difference would be the model's, not the "
            "build's; run both builds on one model and dtype, or pass --allow-model-mismatch to compare them anyway"
        )
    return [f"the runs are of different models or dtypes ({text}): differences may come from the model"]


def compare_builds(
    base: Evaluation,
    pr: Evaluation,
    base2: Evaluation | None = None,
    dirs: tuple[Path, Path, Path | None] = (Path("base"), Path("pr"), None),
    expectations: tuple[BuildExpectation, ...] = (),
    command: str = "",
    allow_cpu_mismatch: bool = False,
    allow_model_mismatch: bool = False,
) -> BuildComparison:
    one_digest([*base.arms, *pr.arms, *(base2.arms if base2 else ())], "base, pr" + (" and base2" if base2 else ""))
    runs = {"base": base, "pr": pr, "base2": base2}
    notes: list[str] = model_notes(runs, allow_model_mismatch) + cpu_notes(runs, allow_cpu_mismatch)
    if base.record.checkpoints.b != pr.record.checkpoints.b:
        notes.append(
            f"base and pr refit to different checkpoints B ({base.record.checkpoints.b} vs "
            f"{pr.record.checkpoints.b}): value and token differences may come from the weights"
        )
    if base.record.spec.engine != pr.record.spec.engine:
        notes.append(
            f"base and pr ran with different engine settings: {base.record.spec.engine} vs {pr.record.spec.engine}"
        )
    loads = {label: load for label, ev in (("base", base), ("pr", pr), ("base2", base2)) if (load := machine_load(ev))}
    if any(v > 1.0 for v in loads.values()):
        notes.append(
            "the machine was loaded while arms ran (1-minute load average per CPU: "
            + ", ".join(f"{k} {v:.1f}" for k, v in loads.items())
            + "): wall times and throughput outside the floor are reported as not comparable, not as a "
            "gain or loss"
        )
    if base.record.spec.accuracy != pr.record.spec.accuracy:
        notes.append("base and pr ran different --accuracy items (or none): their accuracy is not compared")
    if base2 is None:
        notes.append(
            "no base2 run (--noise): the floor is the cold-vs-cold noise inside base only, so run-to-run "
            "differences (timings, verdict flakiness) cannot be told from real ones"
        )
    builds = [facts_of("base", base, dirs[0]), facts_of("pr", pr, dirs[1])]
    if base2 is not None:
        builds.append(facts_of("base2", base2, dirs[2] or Path("base2")))
    verdicts = verdict_rows(base, pr, base2)
    return BuildComparison(
        builds=tuple(builds),
        verdicts=verdicts,
        tokens=token_rows(base, pr, base2),
        status_changes=status_changes(base, pr, base2),
        values=value_rows(base, pr, base2),
        layer_change=layer_changes(base, pr, base2),
        hooks=hook_rows(base, pr),
        timings=timing_rows(base, pr, base2),
        expectations=check_expectations(verdicts, expectations),
        notes=tuple(notes),
        command=command,
        throughput=throughput_rows(base, pr, base2),
        accuracy=accuracy_rows(base, pr, base2),
    )


# --- verdicts ------------------------------------------------------------------------------


def _verdicts(ev: Evaluation | None) -> dict[str, tuple[str, str]]:
    if ev is None:
        return {}
    return {v.path: (v.shown, v.reasons[0] if v.reasons else "") for v in ev.verdicts}


def _vllm_of(ev: Evaluation) -> str:
    return next((dict(a.environment).get("vllm") for a in ev.arms if a.environment), None) or "unknown"


def verdict_rows(base: Evaluation, pr: Evaluation, base2: Evaluation | None) -> tuple[VerdictRow, ...]:
    b, p, b2 = _verdicts(base), _verdicts(pr), _verdicts(base2)
    base_vllm, pr_vllm = _vllm_of(base), _vllm_of(pr)
    rows = []
    for path in list(b) + [x for x in p if x not in b]:
        vb, vp, v2 = b.get(path, (None, ""))[0], p.get(path, (None, ""))[0], b2.get(path, (None, ""))[0]
        if vb is None or vp is None:
            outcome = "only in pr" if vb is None else "only in base"
        elif v2 is not None and v2 != vb:
            outcome = "unstable"
        elif vb == vp:
            outcome = "same"
        elif vb in GOOD_VERDICTS and vp in BAD_VERDICTS:
            outcome = "regressed"
        elif vb in FIXED_FROM and vp == "PASS":
            # Only a different vLLM can be what fixed it; on one vLLM the fix is the PR's (or a twin's).
            outcome = f"fixed in vLLM {pr_vllm}" if pr_vllm != base_vllm else "fixed"
        else:
            outcome = "changed"
        rows.append(
            VerdictRow(
                path=path,
                base=vb,
                pr=vp,
                base2=v2,
                outcome=outcome,
                base_reason=b.get(path, (None, ""))[1],
                pr_reason=p.get(path, (None, ""))[1],
            )
        )
    return tuple(rows)


def check_expectations(
    rows: tuple[VerdictRow, ...], expectations: tuple[BuildExpectation, ...]
) -> tuple[ExpectationOutcome, ...]:
    """Explicit expectations cover the cells both base and pr ran. Without any, the implied
    one is that no cell regressed from base to pr."""
    shared = [r for r in rows if r.base is not None and r.pr is not None]
    if not expectations:
        regressed = tuple((r.path, f"{r.base} -> {r.pr}") for r in shared if r.outcome == "regressed")
        implied = BuildExpectation(build="pr", cells="*", verdict="no cell worse than on base")
        return (ExpectationOutcome(implied, regressed, not regressed, implied=True),)
    out = []
    for e in expectations:
        covered = tuple(
            (r.path, getattr(r, e.build, None) or "-") for r in shared if fnmatch.fnmatchcase(r.path, e.cells)
        )
        out.append(ExpectationOutcome(e, covered, bool(covered) and all(v == e.verdict for _, v in covered)))
    return tuple(out)


# --- tokens --------------------------------------------------------------------------------


def _arm(ev: Evaluation | None, role: str) -> ArmResult | None:
    return next((a for a in ev.arms if a.role == role), None) if ev else None


def _cold(ev: Evaluation | None, role: str = "reference") -> Observation | None:
    arm = _arm(ev, role)
    return arm.observations[0] if arm and arm.observations else None


def token_rows(base: Evaluation, pr: Evaluation, base2: Evaluation | None) -> tuple[TokenRow, ...]:
    b, p = _cold(base), _cold(pr)
    if b is None or p is None:
        return ()
    b2, noise = (_cold(base2) if base2 is not None else None), _cold(base, "noise")
    if b2 is not None:
        floor, source = {d.prompt: d for d in compare_outputs("noise", b2, b)}, "base2"
    elif noise is not None:
        floor, source = {d.prompt: d for d in compare_outputs("noise", noise, b)}, "cold B twice in base"
    else:
        floor, source = {}, "none"
    rows = []
    for d in compare_outputs("refit", p, b):
        f = floor.get(d.prompt)
        f_div = f.first_divergence if f else None
        f_lp = f.max_logprob_diff if f else 0.0
        if d.first_divergence is None and d.max_logprob_diff == 0.0:
            outcome = "identical"
        elif (
            d.first_divergence is None or (f_div is not None and d.first_divergence >= f_div)
        ) and d.max_logprob_diff <= f_lp:
            outcome = NO_DIFFERENCE
        else:
            outcome = "differs"
        rows.append(
            TokenRow(
                prompt=d.prompt,
                first_divergence=d.first_divergence,
                max_logprob_diff=d.max_logprob_diff,
                floor_first_divergence=f_div,
                floor_logprob_diff=f_lp,
                floor_source=source,
                outcome=outcome,
                base_tokens=d.reference_tokens,
                pr_tokens=d.subject_tokens,
            )
        )
    return tuple(rows)


# --- tensors -------------------------------------------------------------------------------


def _statuses(ev: Evaluation | None) -> dict[tuple[str, str, str], tuple[str, str]]:
    if ev is None:
        return {}
    return {
        (c.path, d.check, d.tensor): (d.status.value, d.kind)
        for c in ev.comparisons
        for d in c.tensors
        if d.check != "noise"
    }


_DECIDING = {s.value for s in FAILING_STATUSES}  # tensor statuses that decide a verdict


def status_changes(base: Evaluation, pr: Evaluation, base2: Evaluation | None) -> tuple[TensorStatusChange, ...]:
    """Tensors whose status differs between base and pr, for paths both ran."""
    b, p, b2 = _statuses(base), _statuses(pr), _statuses(base2)
    shared_paths = {k[0] for k in b} & {k[0] for k in p}
    rows = []
    for key in list(b) + [k for k in p if k not in b]:
        if key[0] not in shared_paths:
            continue
        sb, kind = b.get(key, ("-", ""))
        sp, kind_p = p.get(key, ("-", ""))
        if sb == sp:
            continue
        rows.append(
            TensorStatusChange(
                path=key[0],
                check=key[1],
                tensor=key[2],
                kind=kind or kind_p,
                base=sb,
                pr=sp,
                base2=b2[key][0] if key in b2 else None,
                decides=sb in _DECIDING or sp in _DECIDING,
            )
        )
    return tuple(sorted(rows, key=lambda r: (not r.decides, r.path, r.check)))


_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def layer_of(bare: str) -> str:
    """The layer a census name (without a rank prefix) belongs to."""
    m = _LAYER.search(bare)
    if m:
        return f"layer {int(m.group(1))}"
    if "embed" in bare:
        return "embed"
    if bare.startswith("lm_head") or ".norm." in f".{bare}" or bare.startswith("model.norm"):
        return "head"
    return "other"


def _differing(a: Observation | None, b: Observation | None) -> set[str]:
    if a is None or b is None:
        return set()
    return {d.tensor for d in compare_tensors("noise", a, b) if d.status is not TensorStatus.OK}


def _rel(a: float | None, b: float | None) -> float | None:
    if a is None or b is None:
        return None
    return abs(b - a) / max(abs(a), 1e-30)


def value_rows(base: Evaluation, pr: Evaluation, base2: Evaluation | None) -> tuple[ValueRow, ...]:
    """Cold-B census of base vs pr; the floor is base2 vs base plus cold-vs-cold in each run."""
    b, p = _cold(base), _cold(pr)
    if b is None or p is None:
        return ()
    floor = _differing(_cold(base2), b) | _differing(_cold(base, "noise"), b) | _differing(_cold(pr, "noise"), p)
    bt, pt = ({o.shown_name(t): t for t in o.tensors} for o in (b, p))
    rows = []
    for d in compare_tensors("noise", p, b):
        if d.status is TensorStatus.OK:
            continue
        rb, rp = bt.get(d.tensor), pt.get(d.tensor)
        if d.status is TensorStatus.MISSING:
            outcome = "only in base"
        elif d.status is TensorStatus.EXTRA:
            outcome = "only in pr"
        else:
            outcome = NO_DIFFERENCE if d.tensor in floor else "differs"
        rows.append(
            ValueRow(
                tensor=d.tensor,
                kind=d.kind,
                layer=layer_of(d.name or d.tensor),
                base_absmax=rb.absmax if rb else None,
                pr_absmax=rp.absmax if rp else None,
                relative_change=_rel(rb.absmax if rb else None, rp.absmax if rp else None),
                outcome=outcome,
            )
        )
    order = {"differs": 0, "only in base": 1, "only in pr": 1, NO_DIFFERENCE: 2}
    return tuple(sorted(rows, key=lambda r: order[r.outcome]))


def layer_changes(
    base: Evaluation, pr: Evaluation, base2: Evaluation | None
) -> tuple[tuple[str, float, float | None], ...]:
    """Per layer, the largest relative change of a tensor's largest |value|, pr vs base and
    base2 vs base, over tensors present in both (cold B). Tensors on which two cold starts
    inside a run already disagree (opaque kernel handles) carry no information and are left out."""
    b, p, b2 = _cold(base), _cold(pr), _cold(base2)
    if b is None or p is None:
        return ()
    noisy = (
        _differing(_cold(base, "noise"), b) | _differing(_cold(pr, "noise"), p) | _differing(_cold(base2, "noise"), b2)
    )

    def per_layer(other: Observation | None) -> dict[str, float]:
        if other is None:
            return {}
        ot = {other.shown_name(t): t for t in other.tensors}
        out: dict[str, float] = {}
        for t in b.tensors:
            name = b.shown_name(t)
            o = ot.get(name)
            if o is None:
                continue
            change = 0.0 if o.digest == t.digest or name in noisy else _rel(t.absmax, o.absmax)
            layer = layer_of(t.name)
            out[layer] = max(out.get(layer, 0.0), change or 0.0)
        return out

    main, floor = per_layer(p), per_layer(b2)

    def key(layer: str):
        return (
            (0, -1)
            if layer == "embed"
            else (1, int(layer.split()[1]))
            if layer.startswith("layer ")
            else (2, 0)
            if layer == "head"
            else (3, 0)
        )

    return tuple((layer, main[layer], floor.get(layer) if b2 is not None else None) for layer in sorted(main, key=key))


# --- hooks ---------------------------------------------------------------------------------


def _owner(module: str, owner: str) -> str:
    return owner or re.sub(r"\.\d+\.", ".*.", module)  # older records: the path pattern stands in for the class


def hook_rows(base: Evaluation, pr: Evaluation) -> tuple[HookRow, ...]:
    def census(ev: Evaluation) -> tuple[dict[tuple[str, str], int], dict[tuple[str, str], int]]:
        obs = _cold(ev)
        counts: dict[tuple[str, str], int] = {}
        for h in obs.hooks if obs else ():
            key = (_owner(h.module, h.owner), h.kind)
            counts[key] = counts.get(key, 0) + 1
        ran: dict[tuple[str, str], int] = {}
        subject = _arm(ev, "subject")
        owners: dict[tuple[str, str], str] = {
            (h.module, h.kind): h.owner
            for h in (subject.observations[0].hooks if subject and subject.observations else ())
        }
        for c in ev.comparisons:
            per: dict[tuple[str, str], int] = {}
            for run in c.hooks:
                if run.runs > 0:
                    owned = (_owner(run.module, owners.get((run.module, run.kind), "")), run.kind)
                    per[owned] = per.get(owned, 0) + 1
            for k, n in per.items():
                ran[k] = max(ran.get(k, 0), n)
        return counts, ran

    (cb, rb), (cp, rp) = census(base), census(pr)
    rows = []
    for key in sorted(set(cb) | set(cp)):
        rows.append(
            HookRow(
                owner=key[0],
                kind=key[1],
                base=cb.get(key, 0),
                pr=cp.get(key, 0),
                base_runs_on_refit=rb.get(key, 0),
                pr_runs_on_refit=rp.get(key, 0),
                outcome="same" if (cb.get(key, 0), rb.get(key, 0)) == (cp.get(key, 0), rp.get(key, 0)) else "changed",
            )
        )
    return tuple(sorted(rows, key=lambda r: r.outcome != "changed"))


def machine_load(ev: Evaluation | None) -> float | None:
    """Highest 1-minute load average per CPU an arm of the run recorded at its start (None in older records)."""
    loads = []
    for a in ev.arms if ev else ():
        env = dict(a.environment)
        try:
            loads.append(float(env["load_average"]) / max(1, int(env.get("cpus", "1"))))
        except (KeyError, ValueError):
            continue
    return max(loads) if loads else None


def _loaded(*evs: Evaluation | None) -> bool:
    return any((load or 0.0) > 1.0 for load in map(machine_load, evs))


LOADED = "not comparable (machine loaded)"


# --- timings -------------------------------------------------------------------------------


def timing_rows(base: Evaluation, pr: Evaluation, base2: Evaluation | None) -> tuple[TimingRow, ...]:
    def seconds(ev: Evaluation | None) -> dict[str, float]:
        return {a.arm: a.seconds for a in ev.arms if a.status == "ok"} if ev else {}

    b, p, b2 = seconds(base), seconds(pr), seconds(base2)
    rows = []
    for arm in list(b) + [a for a in p if a not in b]:
        sb, sp, s2 = b.get(arm), p.get(arm), b2.get(arm)
        delta = sp - sb if sb is not None and sp is not None else None
        band = abs(s2 - sb) if s2 is not None and sb is not None else None
        if delta is None or band is None:
            outcome = "not measured" if delta is None else "no floor (no base2)"
        elif abs(delta) <= band:
            outcome = NO_DIFFERENCE
        elif _loaded(base, pr, base2):
            outcome = LOADED
        else:
            outcome = "slower" if delta > 0 else "faster"
        rows.append(
            TimingRow(
                arm=arm, base_seconds=sb, pr_seconds=sp, base2_seconds=s2, delta=delta, band=band, outcome=outcome
            )
        )
    return tuple(rows)


def throughput_rows(base: Evaluation, pr: Evaluation, base2: Evaluation | None) -> tuple[ThroughputRow, ...]:
    from harness.judge.throughput import points

    runs = {"base": base, "pr": pr, "base2": base2}
    per = {label: {p.point: p for p in points(ev.arms)} if ev else {} for label, ev in runs.items()}
    rows = []
    for point in list(per["base"]) + [x for x in per["pr"] if x not in per["base"]]:
        b, p, b2 = per["base"].get(point), per["pr"].get(point), per["base2"].get(point)
        floor = [x for q in (b, b2) if q for x in q.samples]
        lo, hi = (min(floor), max(floor)) if floor else (None, None)
        if p is None or b is None or lo is None or hi is None:
            outcome = "not measured"
        elif lo <= p.median <= hi:
            outcome = NO_DIFFERENCE
        elif _loaded(base, pr, base2):
            outcome = LOADED
        else:
            outcome = "slower" if p.median < lo else "faster"
        slower = ", ".join(label for label, q in (("base", b), ("base2", b2), ("pr", p)) if q and q.slower_than_cold)
        rows.append(
            ThroughputRow(
                point=point,
                base_median=b.median if b else None,
                pr_median=p.median if p else None,
                base2_median=b2.median if b2 else None,
                band_low=lo,
                band_high=hi,
                outcome=outcome,
                slower_than_cold=slower,
            )
        )
    return tuple(rows)


def accuracy_rows(base: Evaluation, pr: Evaluation, base2: Evaluation | None) -> tuple[AccuracyRow, ...]:
    from harness.judge.accuracy import NO_POWER, judge_run

    if base.record.spec.accuracy != pr.record.spec.accuracy:
        return ()
    runs = {"base": base, "pr": pr, "base2": base2}
    judged = {label: judge_run(ev.arms, ev.record.spec.accuracy) if ev else None for label, ev in runs.items()}
    per: dict[str, dict[str, list]] = {}
    for label, j in judged.items():
        for judged_point in j.points if j else ():
            per.setdefault(label, {}).setdefault(judged_point.point, []).append(judged_point)
    base_points, pr_points = per.get("base", {}), per.get("pr", {})
    no_power = any(j is not None and j.points and not j.discriminates for j in judged.values())

    def mean(points) -> float | None:
        return sum(p.accuracy for p in points) / len(points) if points else None

    rows = []
    for point in list(base_points) + [x for x in pr_points if x not in base_points]:
        b, p, b2 = base_points.get(point), pr_points.get(point), per.get("base2", {}).get(point)
        floor = [q.accuracy for q in (b or []) + (b2 or [])]
        lo, hi = (min(floor), max(floor)) if floor else (None, None)
        mb, mp = mean(b), mean(p)
        if mb is None or mp is None or lo is None or hi is None:
            outcome = "not measured"
        elif no_power:
            outcome = NO_POWER
        elif lo <= mp <= hi:
            outcome = NO_DIFFERENCE
        else:
            outcome = "lower" if mp < lo else "higher"
        differs = ", ".join(
            label for label, q in (("base", b), ("base2", b2), ("pr", p)) if q and any(x.flagged for x in q)
        )
        rows.append(
            AccuracyRow(
                point=point,
                base_accuracy=mb,
                pr_accuracy=mp,
                base2_accuracy=mean(b2),
                delta=None if mb is None or mp is None else mp - mb,
                band_low=lo,
                band_high=hi,
                outcome=outcome,
                differs_from_cold=differs,
            )
        )
    return tuple(rows)

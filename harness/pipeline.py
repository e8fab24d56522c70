"""spec -> plan -> engine arms -> observations -> comparisons -> verdicts -> reports.

``execute`` runs the engines and stores every arm's records; ``evaluate`` reads only
what is on disk, so ``refit-harness report DIR`` re-judges a run without vLLM.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from harness import checkpoints, store
from harness.checkpoints import CheckpointSet
from harness.compare import PathComparison, compare_path
from harness.engine.fanout import FanoutSpec
from harness.plan import ArmPlan, PathNeeds, Plan, make_plan, sabotaged_twin
from harness.records import ArmResult
from harness.spec import RunSpec, shared_prefix_prompts
from harness.verdict import Verdict, VerdictStatus, judge, judge_sabotage, rebound_fails, skipped, with_sabotage

Progress = Callable[[str], None]


class UsageError(ValueError):
    """Bad input from the user: one clear line, exit code 2."""


@dataclass(frozen=True)
class RunRecord:
    """What was asked and where things are: the root record of a report directory."""

    spec: RunSpec
    """The run's spec."""
    checkpoints: CheckpointSet
    """Resolved A, B and B'."""
    plan: Plan
    """Arms and skipped paths."""
    git_sha: str
    """Commit of the harness that ran."""
    started: str
    """UTC start time, ISO 8601."""


@dataclass(frozen=True)
class Evaluation:
    """Everything a report shows, derived from records on disk."""

    record: RunRecord
    """The run's root record."""
    arms: tuple[ArmResult, ...]
    """Results of the arms that have run."""
    comparisons: tuple[PathComparison, ...]
    """One per path that had a subject arm."""
    verdicts: tuple[Verdict, ...]
    """One per requested path, in request order."""

    @property
    def exit_code(self) -> int:
        statuses = {v.status for v in self.verdicts}
        if VerdictStatus.ERROR in statuses:
            return 2
        if statuses & {VerdictStatus.FAIL, VerdictStatus.INCONCLUSIVE, VerdictStatus.XPASS}:
            return 1
        return 0


def validate(spec: RunSpec) -> None:
    """Reject bad input before any engine starts."""
    from harness.paths import PATHS
    from harness.registry import UnknownName

    for p in spec.paths:
        try:
            PATHS.get(p)
        except UnknownName as exc:
            raise UsageError(str(exc)) from None
    vocab = checkpoints.vocab_size(spec.model)
    too_big = [t for ids in spec.prompts.token_ids or () for t in ids if vocab and t >= vocab]
    if too_big:
        raise UsageError(f"prompt token id {too_big[0]} is outside the model's vocabulary ({vocab})")


def resolve_prompts(spec: RunSpec) -> RunSpec:
    """The spec with its prompts made concrete: derived from the model's vocabulary when
    the user gave none, so the default prompts fit any checkpoint."""
    if spec.prompts.token_ids is not None:
        return spec
    vocab = checkpoints.vocab_size(spec.model) or 256
    return replace(spec, prompts=replace(spec.prompts, token_ids=shared_prefix_prompts(vocab)))


def prepare(spec: RunSpec, out: Path, progress: Progress) -> RunRecord:
    from harness.paths import PATHS

    validate(spec)
    progress("preparing checkpoints A, B and B' (positive control)")
    try:
        cs = checkpoints.prepare(spec.model, spec.target, spec.perturb, spec.control, sabotage=spec.sabotage)
    except checkpoints.CheckpointError as exc:
        raise UsageError(str(exc)) from None
    classes = {p: PATHS.get(p) for p in spec.paths}
    unavailable = {p: r for p, cls in classes.items() if (r := cls.unavailable_reason())}
    needs = {p: PathNeeds(cls.requirements, cls.refit_targets, cls.sabotage_targets) for p, cls in classes.items()}
    # The record keeps the spec as asked; the plan carries the resolved prompts.
    record = RunRecord(spec=spec, checkpoints=cs, plan=make_plan(resolve_prompts(spec), cs, needs, unavailable),
                       git_sha=_git_sha(), started=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    store.dump(record, out / "run.json", "run_record")
    return record


def execute(spec: RunSpec, out: Path, progress: Progress, fan: FanoutSpec | None = None,
            resume: bool = False) -> Evaluation:
    """Run every arm not already finished in ``out``; ``fan`` None runs them one by one here."""
    from harness.engine.runner import arm_files, run_arm

    record = prepare(spec, out, progress)
    arms = record.plan.arms
    number = {arm.name: i for i, arm in enumerate(arms, 1)}
    todo = []
    for arm in arms:
        if resume and _finished(arm_files(out, arm)[1]):
            progress(f"[{number[arm.name]}/{len(arms)}] {arm.name}: already finished, kept")
        else:
            todo.append(arm)

    def started(arm: ArmPlan) -> None:
        progress(f"[{number[arm.name]}/{len(arms)}] {arm.name}: cold start on {arm.cold_label.removeprefix('cold_')}"
                 + (f", then {len(arm.steps) - 1} steps through {', '.join(arm.paths)}" if arm.paths else "")
                 + f" (log: {arm_files(out, arm)[2]})")

    def finished(arm: ArmPlan, result: ArmResult) -> None:
        progress(f"[{number[arm.name]}/{len(arms)}] {arm.name}: {result.status} in {result.seconds:.0f} s"
                 + (f" - {result.error}" if result.error else ""))

    if fan is None:
        from harness.engine.fanout import cpu_thread_env

        env = cpu_thread_env(1, spec.engine.tensor_parallel_size)
        for arm in todo:
            started(arm)
            finished(arm, run_arm(arm, out, env))
    elif todo:
        from harness.engine.fanout import run_arms

        for arm, result in run_arms(todo, out, fan, started):
            finished(arm, result)
    return evaluate(out)


def _finished(result_file: Path) -> bool:
    try:
        return store.load(ArmResult, result_file, "arm_result").status == "ok"
    except store.SchemaError:
        return False


def evaluate(out: Path) -> Evaluation:
    """Judge a run from its directory alone."""
    from harness.engine.runner import arm_files
    from harness.paths import PATHS

    record = store.load(RunRecord, out / "run.json", "run_record")
    results: dict[str, ArmResult] = {}
    for arm in record.plan.arms:
        result_file = arm_files(out, arm)[1]
        if result_file.exists():
            results[arm.name] = store.load(ArmResult, result_file, "arm_result")
    reference, noise = results.get("reference"), results.get("noise")
    comparisons, verdicts = [], []
    skipped_paths = {s.path: s.reason for s in record.plan.skipped}
    ref_arm = next((a for a in record.plan.arms if a.role == "reference"), None)
    for path in record.spec.paths:
        if path in skipped_paths:
            verdicts.append(skipped(path, skipped_paths[path]))
            continue
        arm = record.plan.subject_of(path)
        subject = results.get(arm.name) if arm else None
        if subject is None:
            verdicts.append(Verdict(path, VerdictStatus.ERROR, ("subject arm never ran",)))
            continue
        cls = PATHS.get(path)
        device = dict(subject.environment).get("device", "cpu")
        # The path's own engine mode decides whether a moved address matters (a compiled
        # path in an eager run captures graphs all the same).
        mode = arm.requirements.mode or arm.engine.mode
        same_mode = ref_arm is not None and mode == (ref_arm.requirements.mode or ref_arm.engine.mode)
        fail_on_rebound = rebound_fails(record.spec.judge, mode, device)

        def compared(owner: str):
            return compare_path(owner, subject, reference, noise, record.checkpoints.control_tensor,
                                record.spec.judge.logprob_atol, _labels(arm, owner), same_mode=same_mode,
                                same_engine=not arm.requirements.restarts)

        c = compared(path)
        comparisons.append(c)
        verdict = judge(c, record.spec.judge, fail_on_rebound, known=cls.known_issue(device),
                        require_cache_hits=cls.needs_cache_hits)
        if record.spec.sabotage:
            twin = compared(sabotaged_twin(path))
            comparisons.append(twin)
            outcome = judge_sabotage(twin, judge(twin, record.spec.judge, fail_on_rebound), cls.sabotage,
                                     cls.sabotage_evidence, record.checkpoints.control_tensor,
                                     _packed_mapping(subject))
            verdict = with_sabotage(verdict, outcome)
        verdicts.append(verdict)
    return Evaluation(record=record, arms=tuple(results.values()), comparisons=tuple(comparisons),
                      verdicts=tuple(verdicts))


def _labels(arm: ArmPlan, owner: str) -> tuple[str, ...]:
    """Labels the plan said ``owner`` (a path or its sabotaged twin) would observe, without the prefix."""
    return tuple(s.argument.split("/", 1)[1] for s in arm.steps
                 if s.action == "observe" and s.argument.startswith(f"{owner}/"))


def _packed_mapping(subject: ArmResult) -> tuple[tuple[str, tuple[str, ...]], ...]:
    return subject.observations[0].model.packed_modules_mapping if subject.observations else ()


def _git_sha() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent, timeout=5).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"

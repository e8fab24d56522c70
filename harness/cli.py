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
import sys
import time
import traceback
import uuid
from pathlib import Path

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
    run.add_argument("--control-tensor", default=ControlSpec.tensor, help="checkpoint tensor scaled in B'")
    run.add_argument("--mode", choices=("eager", "compiled"), default="eager")
    run.add_argument("--tp", type=_positive_int, default=1, help="tensor-parallel size")
    run.add_argument("--seed", type=int, default=PerturbSpec.seed, help="perturbation seed for B")
    run.add_argument("--arm-timeout", type=_positive_float, default=RunSpec.arm_timeout_s,
                     help="seconds per engine arm")
    run.add_argument("--rebound", choices=("auto", "fail", "warn"), default=JudgePolicy.rebound,
                     help="does a kernel input whose address moved fail? auto: only compiled on a GPU")
    run.add_argument("--resume", metavar="DIR", help="finish the run in DIR (its own spec), keeping finished arms")
    run.add_argument("--executor", choices=("ray", "local"), default="ray",
                     help="ray: arms as Ray actors, independent ones at the same time; local: one by one here")
    run.add_argument("--ray-address", help="join this Ray cluster instead of starting a local one")
    run.add_argument("--allow-remote-ray", action="store_true",
                     help="allow a --ray-address off this machine (its Ray runs the engines)")
    run.add_argument("--max-parallel", type=_positive_int, help="at most this many arms at once")

    sub.add_parser("paths", help="list reload paths and where they run")
    sub.add_parser("list", help="list registered scenarios and their cells")
    report = sub.add_parser("report", help="re-judge and re-render a report directory from its records")
    report.add_argument("dir")
    model = sub.add_parser("make-model", help="write the embedded tiny Qwen3 (or a planted-bug fixture) and print its path")
    model.add_argument("--architecture", default=None, help="e.g. StaleQKNormQwen3ForCausalLM")
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
                "list": cmd_list}[args.command](args)
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
    from harness.pipeline import RunRecord, UsageError, evaluate, execute
    from harness.report import write_reports

    try:
        check_ray_address(args.ray_address, args.allow_remote_ray)
    except ValueError as exc:
        return _fail(str(exc))
    fan = None if args.executor == "local" else FanoutSpec(address=args.ray_address, max_concurrent=args.max_parallel)
    if args.scenario:
        return run_scenario(args, fan)
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
    try:
        evaluation = execute(spec, out, _progress, fan=fan, resume=bool(args.resume))
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
    if code != 2:
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
                   engine=EngineSpec(mode=args.mode, tensor_parallel_size=args.tp),
                   perturb=PerturbSpec(seed=args.seed), control=ControlSpec(tensor=args.control_tensor),
                   judge=JudgePolicy(rebound=args.rebound), arm_timeout_s=args.arm_timeout)


def run_scenario(args: argparse.Namespace, fan) -> int:
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
    groups = expand(scenario, tuple(args.only), tuple(args.skip))
    if not groups:
        return _fail(f"no cell of scenario {scenario.name!r} matches --only {args.only} / --skip {args.skip}")
    out = _set_out(Path(args.out or args.resume or Path("reports") / f"{scenario.name}-{time.strftime('%Y%m%d-%H%M%S')}"))
    if args.resume and (out / "run.json").exists():
        return _fail(f"cannot resume {out} as scenario {scenario.name!r}: it holds a single run; "
                     f"resume it without -s (refit-harness run --resume {out})")
    results = []
    for group in groups:
        group = resolve_model(group, args.model)
        _progress(f"cell group {group.id}: {', '.join(group.spec.paths)}")
        try:
            evaluation = execute(group.spec, out / group.id, _progress, fan=fan, resume=bool(args.resume))
        except UsageError as exc:
            return _fail(str(exc))
        except KeyboardInterrupt as exc:
            def write(group=group):
                if (out / group.id / "run.json").exists():
                    ev = evaluate(out / group.id)
                    write_reports(ev, out / group.id)
                    results.append((group, ev))
                return write_matrix(out, matrix_summary(scenario.name, results))
            return _interrupted(exc, write)
        write_reports(evaluation, out / group.id)
        results.append((group, evaluation))
    summary = matrix_summary(scenario.name, results)
    index = write_matrix(out, summary)
    for cell, c in summary["cells"].items():
        _progress(f"{cell}: {c['verdict']}")
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
    return 0


def cmd_paths(args: argparse.Namespace) -> int:
    from harness.paths import PATHS

    for name in PATHS.names():
        cls = PATHS.get(name)
        reason = cls.unavailable_reason()
        where = "cpu+gpu" if cls.device == "any" else "gpu only"
        print(f"{name:28} {where:9} {'available' if reason is None else 'unavailable here'}\n    {cls.exercises}")
        for known in cls.known_issues:
            print(f"    known issue on {known.device} (XFAIL while it holds): {known.reason}")
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

    print(checkpoints.tiny_qwen3(architecture=args.architecture))
    return 0


if __name__ == "__main__":
    sys.exit(main())

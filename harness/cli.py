"""``refit-harness``: the only place failures become exit codes.

Exit 0: every path PASS, SKIPPED or XFAIL (a known issue that still holds); 1: any FAIL,
INCONCLUSIVE or XPASS (a known issue gone); 2: bad usage or an infrastructure error (an arm
crashed or timed out). Exit 2 prints one line.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from harness.spec import ControlSpec, EngineSpec, JudgePolicy, PerturbSpec, RunSpec


def _progress(message: str) -> None:
    print(f"[refit-harness {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _fail(message: str) -> int:
    print(f"refit-harness: error: {message}", file=sys.stderr)
    return 2


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
    run.add_argument("--tp", type=int, default=1, help="tensor-parallel size")
    run.add_argument("--seed", type=int, default=PerturbSpec.seed, help="perturbation seed for B")
    run.add_argument("--arm-timeout", type=float, default=RunSpec.arm_timeout_s, help="seconds per engine arm")
    run.add_argument("--rebound", choices=("auto", "fail", "warn"), default=JudgePolicy.rebound,
                     help="does a kernel input whose address moved fail? auto: only compiled on a GPU")
    run.add_argument("--resume", metavar="DIR", help="finish the run in DIR (its own spec), keeping finished arms")
    run.add_argument("--executor", choices=("ray", "local"), default="ray",
                     help="ray: arms as Ray actors, independent ones at the same time; local: one by one here")
    run.add_argument("--ray-address", help="join this Ray cluster instead of starting a local one")
    run.add_argument("--max-parallel", type=int, help="at most this many arms at once")

    sub.add_parser("paths", help="list reload paths and where they run")
    sub.add_parser("list", help="list registered scenarios and their cells")
    report = sub.add_parser("report", help="re-judge and re-render a report directory from its records")
    report.add_argument("dir")
    model = sub.add_parser("make-model", help="write the embedded tiny Qwen3 (or a planted-bug fixture) and print its path")
    model.add_argument("--architecture", default=None, help="e.g. StaleQKNormQwen3ForCausalLM")
    model.add_argument("--family", default=None, help="a zoo family instead, e.g. mamba2 (see harness/zoo.py)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return {"run": cmd_run, "paths": cmd_paths, "report": cmd_report, "make-model": cmd_make_model,
                "list": cmd_list}[args.command](args)
    except KeyboardInterrupt:
        return _fail("interrupted; finished arms are kept on disk (use --resume)")


def cmd_run(args: argparse.Namespace) -> int:
    from harness import store
    from harness.engine.fanout import FanoutSpec
    from harness.pipeline import RunRecord, UsageError, execute
    from harness.report import write_reports

    fan = None if args.executor == "local" else FanoutSpec(address=args.ray_address, max_concurrent=args.max_parallel)
    if args.scenario:
        return run_scenario(args, fan)
    if args.resume:
        out = Path(args.resume)
        try:
            spec = store.load(RunRecord, out / "run.json", "run_record").spec
        except store.SchemaError as exc:
            return _fail(f"cannot resume {out}: {exc}")
    else:
        spec, out = spec_from_args(args), Path(args.out) if args.out else Path("reports") / time.strftime("%Y%m%d-%H%M%S")
    try:
        evaluation = execute(spec, out, _progress, fan=fan, resume=bool(args.resume))
    except UsageError as exc:
        return _fail(str(exc))
    files = write_reports(evaluation, out)
    for v in evaluation.verdicts:
        _progress(f"{v.path}: {v.status.value}" + (f" - {v.reasons[0]}" if v.reasons else ""))
    print(f"report: {files['index.html'].resolve()}")
    return evaluation.exit_code


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
                   engine=EngineSpec(mode=args.mode, tensor_parallel_size=args.tp, dtype=args.dtype or "float32"),
                   perturb=PerturbSpec(seed=args.seed), control=ControlSpec(tensor=args.control_tensor),
                   judge=JudgePolicy(rebound=args.rebound), arm_timeout_s=args.arm_timeout)


def run_scenario(args: argparse.Namespace, fan) -> int:
    from dataclasses import replace

    from harness.pipeline import UsageError, execute
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
    out = Path(args.out or args.resume or Path("reports") / f"{scenario.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    results = []
    for group in groups:
        group = resolve_model(group, args.model)
        _progress(f"cell group {group.id}: {', '.join(group.spec.paths)}")
        try:
            evaluation = execute(group.spec, out / group.id, _progress, fan=fan, resume=bool(args.resume))
        except UsageError as exc:
            return _fail(str(exc))
        write_reports(evaluation, out / group.id)
        results.append((group, evaluation))
    summary = matrix_summary(scenario.name, results)
    index = write_matrix(out, summary)
    for cell, c in summary["cells"].items():
        _progress(f"{cell}: {c['verdict']}")
    print(f"report: {index.resolve()}")
    return summary["exit_code"]


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

    out = Path(args.dir)
    if not (out / "run.json").is_file():
        return _fail(f"{out} is not a report directory (no run.json)")
    try:
        evaluation = evaluate(out)
    except SchemaError as exc:
        return _fail(str(exc))
    files = write_reports(evaluation, out)
    print(f"report: {files['index.html'].resolve()}")
    return evaluation.exit_code


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

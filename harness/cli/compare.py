"""``refit-harness compare BASE PR``: two finished runs compared from their records."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.cli.common import progress
from harness.errors import UsageError


def add_parsers(sub) -> None:
    compare = sub.add_parser("compare", help="compare two runs (base, pr) from their records; writes a report")
    compare.set_defaults(handler=cmd_compare)
    compare.add_argument("base", help="run directory of the base build")
    compare.add_argument("pr", help="run directory of the build under review")
    compare.add_argument("--noise", metavar="RUN_BASE2", help="base run again: the run-to-run noise floor")
    compare.add_argument(
        "--expect",
        action="append",
        default=[],
        metavar="NAME[:PATH_GLOB]=VERDICT",
        help="expected verdict per build (base, pr, base2)",
    )
    compare.add_argument(
        "--allow-cpu-mismatch",
        action="store_true",
        help="compare runs measured on CPUs that take different vLLM kernel branches (refused by default: "
        "see docs/isa.md); the comparison then says so",
    )
    compare.add_argument("--out", required=True, help="report directory")


def cmd_compare(args: argparse.Namespace) -> int:
    from harness.orchestrate.matrix import compare_runs

    for d in (Path(d) for d in (args.base, args.pr, args.noise) if d):
        if not (d / "run.json").is_file():
            raise UsageError(f"{d} is not a run directory (no run.json)")
    return compare_runs(
        Path(args.base),
        Path(args.pr),
        Path(args.noise) if args.noise else None,
        Path(args.out),
        args.expect,
        progress,
        allow_cpu_mismatch=args.allow_cpu_mismatch,
    )

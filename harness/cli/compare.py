"""``refit-harness compare BASE PR``: two finished runs compared from their records."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.cli.common import progress
from harness.run_dir import INDEX_HTML


def add_parsers(sub) -> None:
    compare = sub.add_parser("compare", help="compare two runs (base, pr) from their records; writes a report")
    compare.set_defaults(handler=cmd_compare)
    compare.add_argument(
        "base",
        help=f"the base build's run, or scenario directory (as 'run' printed it: the directory or its {INDEX_HTML})",
    )
    compare.add_argument("pr", help="the same of the build under review; two scenarios are compared group by group")
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
    compare.add_argument(
        "--allow-model-mismatch",
        action="store_true",
        help="compare runs of different models or dtypes (refused by default: every difference would be the "
        "model's); the comparison then says so",
    )
    compare.add_argument("--out", required=True, help="report directory")


def cmd_compare(args: argparse.Namespace) -> int:
    from harness.judge import exit_codes
    from harness.orchestrate.directories import comparable_pairs
    from harness.orchestrate.matrix import compare_runs

    pairs = comparable_pairs(args.base, args.pr, args.noise)
    out = Path(args.out)
    codes = []
    for group, base, pr, noise in pairs:
        if group:
            progress(f"cell group {group}")
        codes.append(
            compare_runs(
                base,
                pr,
                noise,
                out / group if len(pairs) > 1 else out,
                args.expect,
                progress,
                allow_cpu_mismatch=args.allow_cpu_mismatch,
                allow_model_mismatch=args.allow_model_mismatch,
            )
        )
    if len(pairs) > 1:
        from harness.report.compare_page import write_group_index

        index = write_group_index(out, [(g, code) for (g, *_), code in zip(pairs, codes)])
        print(f"comparison: {index.resolve()}")
    return exit_codes.combined(codes)

"""``refit-harness report DIR``: re-judge and re-render a run directory from its records."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.cli.common import exit_for, set_out
from harness.errors import UsageError


def add_parsers(sub) -> None:
    report = sub.add_parser("report", help="re-judge and re-render a report directory from its records")
    report.set_defaults(handler=cmd_report)
    report.add_argument("dir", nargs="+", help="a run directory; with --grid, one or more scenario run directories")
    report.add_argument(
        "--grid",
        action="store_true",
        help="print the scenario runs' group x path verdict grids as Markdown (with where they came from), for the docs",
    )


def cmd_report(args: argparse.Namespace) -> int:
    from harness.judge.evaluate import evaluate
    from harness.report import write_reports

    if args.grid:
        from harness.report.grids import grids_markdown

        print(grids_markdown([Path(d) for d in args.dir]), end="")
        return 0
    if len(args.dir) > 1:
        raise UsageError("report takes one run directory (several only with --grid)")
    out = set_out(Path(args.dir[0]))
    if not (out / "run.json").is_file():
        raise UsageError(f"{out} is not a report directory (no run.json)")
    evaluation = evaluate(out)
    files = write_reports(evaluation, out)
    print(f"report: {files['index.html'].resolve()}")
    return exit_for(evaluation.exit_code, [v.path for v in evaluation.verdicts if v.status.value == "ERROR"], out)

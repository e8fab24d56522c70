"""``refit-harness report DIR``: re-judge and re-render a run directory from its records."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.cli.common import exit_for, set_out
from harness.errors import UsageError
from harness.run_dir import INDEX_HTML


def add_parsers(sub) -> None:
    report = sub.add_parser("report", help="re-judge and re-render a report directory from its records")
    report.set_defaults(handler=cmd_report)
    report.add_argument(
        "dir",
        nargs="+",
        help="the directory 'run' printed (a run, a scenario such as make run's, or a run of several builds) or "
        f"its {INDEX_HTML}; with --grid, one or more scenario run directories",
    )
    report.add_argument(
        "--out",
        metavar="DIR",
        help="write the re-rendered reports into this new directory and leave DIR as it is (default: in place)",
    )
    report.add_argument(
        "--grid",
        action="store_true",
        help="print the scenario runs' group x path verdict grids as Markdown (with where they came from), for the docs",
    )


def cmd_report(args: argparse.Namespace) -> int:
    from harness.cli.common import progress
    from harness.orchestrate.directories import rejudge

    if args.grid:
        from harness.report.grids import grids_markdown

        print(grids_markdown([Path(d) for d in args.dir]), end="")
        return 0
    if len(args.dir) > 1:
        raise UsageError("report takes one run directory (several only with --grid)")
    out = Path(args.out) if args.out else None
    if out is not None and out.exists() and any(out.iterdir()):
        raise UsageError(f"--out {out}: not empty; give a new directory")
    from harness.orchestrate.directories import directory_of

    code, index, errors = rejudge(args.dir[0], out, progress)
    set_out(index.parent)
    print(f"report: {index.resolve()}")
    return exit_for(code, errors, directory_of(args.dir[0]))  # a rerun (--resume) is of the records' directory

"""``refit-harness``: the only place failures become exit codes. One module per command.

Exit 0: every path PASS, SKIPPED or XFAIL (a known issue that still holds); 1: any FAIL,
INCONCLUSIVE or XPASS (a known issue gone); 2: bad usage or an infrastructure error (an arm
crashed or timed out, an unreadable record or checkpoint, Ray failing, the run cancelled by
Ctrl-C, SIGTERM or SIGHUP, a full disk). Exit 2 prints one line, ``refit-harness: error: ...``;
an unexpected exception's traceback goes to ``<out>/harness.log``, never to the terminal.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import uuid

from harness.cli.common import Parser, log_traceback, one_line
from harness.errors import HarnessError

COMMANDS = ("run", "review", "build", "compare", "report", "listing", "make_model", "recall_page", "preflight")
"""Modules of ``harness.cli``, one per command (``listing`` has two: ``paths`` and ``list``);
each has ``add_parsers(subparsers)``, which sets ``handler`` on the parsers it adds."""


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="refit-harness", description=__doc__.splitlines()[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for name in COMMANDS:
        importlib.import_module(f"harness.cli.{name}").add_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from harness.orchestrate import interrupts
    from harness.settings import RUN_MARKER

    args = build_parser().parse_args(argv)
    interrupts.install()
    # Every process this run starts inherits the marker: arms, engines, servers, Ray workers.
    os.environ.setdefault(RUN_MARKER, uuid.uuid4().hex)
    try:
        return args.handler(args)
    except HarnessError as exc:
        where = f" ({log_traceback()})" if exc.keeps_traceback else ""
        print(f"refit-harness: error: {' '.join(str(exc).split())}{where}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt as exc:
        how = getattr(exc, "signal_name", None) or interrupts.last_signal or "Ctrl-C"
        print(
            f"refit-harness: error: interrupted ({how}); finished arms are kept on disk (use --resume)", file=sys.stderr
        )
        return 2
    except Exception as exc:  # the one place unexpected exceptions become exit code 2
        print(f"refit-harness: error: {one_line(exc)} ({log_traceback()})", file=sys.stderr)
        return 2

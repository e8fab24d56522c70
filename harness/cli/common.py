"""What every command shares: progress lines, argument types, the run directory the traceback
log goes to, and how an interrupted run writes its report."""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from harness.errors import HarnessError
from harness.judge import exit_codes
from harness.run_dir import RunDir


class RunInterrupted(HarnessError):
    """Ctrl-C, SIGTERM or SIGHUP ended the run; what finished is on disk."""


def progress(message: str) -> None:
    print(f"[refit-harness {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0 or value != value or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, not {text}")
    return value


positive_int.__name__ = "int"  # argparse names the type in its message
positive_float.__name__ = "float"


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2 (argparse prints usage too)
        self.exit(2, f"refit-harness: error: {message}\n")


# Where the current command writes: its traceback log goes there.
_out_dir: Path | None = None


def set_out(out: Path) -> Path:
    """Name the directory this command writes (its ``harness.log`` takes any traceback)."""
    global _out_dir
    _out_dir = out
    return out


def one_line(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.errno == 28:  # ENOSPC
        return f"no space left on the device ({exc.filename or 'writing the report'}); nothing was left half-written"
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:500]}" if text else type(exc).__name__


def log_traceback() -> str:
    """Append the current exception's traceback to ``<out>/harness.log``; say where it went."""
    text = f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] refit-harness {' '.join(sys.argv[1:])}\n{traceback.format_exc()}\n"
    if _out_dir is None:
        return "no traceback written: no output directory yet"
    try:
        _out_dir.mkdir(parents=True, exist_ok=True)
        with open(RunDir(_out_dir).harness_log, "a") as log:
            log.write(text)
    except OSError as exc:
        return f"traceback not written to {RunDir(_out_dir).harness_log}: {exc.strerror or exc}"
    return f"traceback in {RunDir(_out_dir).harness_log}"


def interrupted(exc: KeyboardInterrupt, write: Callable[[], Path]) -> int:
    """Ctrl-C, SIGTERM or SIGHUP: the arms are already stopped (their ``finally`` blocks ran);
    write the report of what finished, then raise ``RunInterrupted`` (exit 2)."""
    from harness.orchestrate import interrupts

    interrupts.hold()
    how = getattr(exc, "signal_name", None) or interrupts.last_signal or "Ctrl-C"
    try:
        index = write()
    except Exception as report_exc:  # nothing finished, or the records are damaged
        raise RunInterrupted(
            f"interrupted ({how}); no report written ({one_line(report_exc)}); "
            f"finished arms are kept on disk (use --resume)"
        ) from None
    print(f"report: {index.resolve()}")
    raise RunInterrupted(f"interrupted ({how}); the report shows what finished: {index}; --resume finishes the run")


def exit_for(code: int, errored: list[str], out: Path) -> int:
    """An exit 2 from ERROR verdicts says so in its one line too."""
    if code != exit_codes.INFRASTRUCTURE:
        return code
    print(
        f"refit-harness: error: infrastructure error in {len(errored)} path(s) ({', '.join(errored[:4])}"
        + (", ..." if len(errored) > 4 else "")
        + f"); the report says why; --resume {out} runs them again",
        file=sys.stderr,
    )
    return code

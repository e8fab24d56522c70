"""SIGTERM and SIGHUP behave like Ctrl-C.

A CI runner cancels a job with SIGTERM (and a closed terminal sends SIGHUP). Both raise
``Interrupted`` (a ``KeyboardInterrupt``) in the main thread, so the same ``finally``
blocks that stop arms on Ctrl-C run, and the CLI writes the report of what finished.
"""

from __future__ import annotations

import signal


class Interrupted(KeyboardInterrupt):
    """The run was cancelled by a signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signal_name = signal.Signals(signum).name


last_signal: str | None = None
"""Name of the last signal that interrupted the run (Ray may re-raise a plain KeyboardInterrupt)."""


def _raise(signum, frame) -> None:
    global last_signal
    last_signal = signal.Signals(signum).name
    raise Interrupted(signum)


def install() -> None:
    """Route SIGTERM and SIGHUP to ``Interrupted`` (main thread only, where Python runs handlers)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _raise)


def hold() -> None:
    """While the report of an interrupted run is written, ignore further signals: it takes
    a second, and a second SIGTERM from an impatient runner must not truncate it."""
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)

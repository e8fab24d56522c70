"""A live view of a run on a terminal: arms done of all, the step each running arm is on (the
last line of its log), and an ETA from the steps measured so far. Plain lines elsewhere."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from harness.plan import ArmPlan
from harness.records import ArmResult


def wanted() -> bool:
    """A live view only where a person watches: stderr is a terminal."""
    return sys.stderr.isatty()


class LiveArms:
    """``ArmEvents`` for ``harness.orchestrate.execute.execute``, drawn with rich. Each arm
    counts its cold start and its steps (one log line each, ``[arm] step``), so the bar
    moves during an arm, and rich's ETA comes from the measured rate."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True, log_path=False)
        self.bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("steps ·"),
            TimeElapsedColumn(),
            TextColumn("· ETA"),
            TimeRemainingColumn(),
            TextColumn("{task.fields[step]}"),
            console=self.console,
        )
        self._task = self.bar.add_task("arms 0/0", total=0, step="")
        self._logs: dict[str, Path] = {}
        self._seen: dict[str, tuple[int, str, int]] = {}  # arm -> (steps, last step, bytes read)
        self._running: dict[str, ArmPlan] = {}
        self._done: dict[str, int] = {}
        self._arms = 0
        self._finished = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._poller = threading.Thread(target=self._poll, daemon=True)

    def __enter__(self) -> LiveArms:
        self.bar.start()
        self._poller.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        self._poller.join(timeout=2)
        self.bar.stop()

    def say(self, message: str) -> None:
        """A progress line, printed above the bar."""
        self.console.log(message)

    def planned(self, arms: list[ArmPlan], logs: dict[str, Path]) -> None:
        with self._lock:
            self._logs = dict(logs)
            self._arms, self._finished = len(arms), 0
            self._done = {a.name: 0 for a in arms}
            self.bar.reset(self._task, total=sum(1 + len(a.steps) for a in arms), completed=0)
            self._describe()

    def started(self, arm: ArmPlan) -> None:
        with self._lock:
            self._running[arm.name] = arm

    def finished(self, arm: ArmPlan, result: ArmResult) -> None:
        with self._lock:
            self._running.pop(arm.name, None)
            self._finished += 1
            self._done[arm.name] = 1 + len(arm.steps)  # an arm that failed early has nothing left to do
            self._describe()

    def _describe(self) -> None:
        self.bar.update(
            self._task, description=f"arms {self._finished}/{self._arms}", completed=sum(self._done.values())
        )

    def _poll(self) -> None:
        while not self._stop.wait(1.0):
            with self._lock:
                current = ""
                for name, arm in self._running.items():
                    steps, last = self._read_steps(name)
                    if steps:
                        self._done[name] = min(steps, len(arm.steps)) + 1  # the cold start is done
                        current = f"{name}: {last}"
                    else:
                        current = current or f"{name}: cold start"
                self.bar.update(self._task, step=current[-70:], completed=sum(self._done.values()))

    def _read_steps(self, name: str) -> tuple[int, str]:
        """How many steps an arm has logged (``[arm] step`` lines), and the last one; reads
        only what the log gained since the last look."""
        log = self._logs.get(name)
        count, last, offset = self._seen.get(name, (0, "", 0))
        if log is not None and log.is_file():
            try:
                with open(log, "rb") as fh:
                    fh.seek(offset)
                    chunk = fh.read()
            except OSError:
                chunk = b""
            whole = chunk[: chunk.rfind(b"\n") + 1]  # a line still being written waits for the next look
            prefix = f"[{name}] "
            for line in whole.decode(errors="replace").splitlines():
                if line.startswith(prefix):
                    count, last = count + 1, line[len(prefix) :]
            self._seen[name] = (count, last, offset + len(whole))
        return count, last

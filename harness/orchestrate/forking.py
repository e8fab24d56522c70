"""Start arms by forking a warm interpreter instead of a fresh ``python`` (CPU runs).

A fresh arm spends 9-12 s of its 13 s importing vLLM and torch on the 2-core CI machine; a
forked one starts its engine at once (``harness.arm.zygote``). The parent still never imports
vLLM: it starts the zygote as ``python -m harness.arm.zygote SOCKET`` and asks it for arms.

An arm is forked only when a fresh process would be the same program, so the numerics cannot
differ. The zygote runs the arm's own interpreter (a named build's launcher too) with the arm's
environment less ``PER_ARM_ENV``, which nothing reads before the arm's own code runs: one zygote
per (interpreter, environment), so whatever is read at import time (thread placement and
``OMP_NUM_THREADS`` when torch loads, a build's ``PYTHONPATH`` and patches) is the arm's own.
Never forked:

- an arm with a CPU-ISA override (``prepare_arm`` masks torch's view of the CPU before vLLM
  imports its kernel library);
- on CUDA (CUDA runs go through Ray, and CUDA does not survive a fork);
- anything, with ``REFIT_HARNESS_FORK_ARMS=0``.

The noise floor is what two independent cold starts differ in, and that includes state that
holds addresses (oneDNN's packed handlers). Forked siblings share one address layout, so two
arms forked from one zygote agree on it where two fresh ones do not (measured: with the noise arm
forked beside the reference, the stock reload_weights cell FAILs on
``qkv_proj.cpu_linear<closure>.handler.handler_tensor``). So the floor's arms (``FRESH_ROLES``)
fork from a zygote of their own, the *floor zygote*: a separate interpreter, started fresh, with
its own address layout and hash seed, so a floor arm is as independent of the reference as a
fresh process (the stock cell judges that handler NOISY again), and a scenario's cell groups pay
one vLLM import for all their floors instead of one each.

Everything else starts as before; so does every arm after its zygote failed to start. A process
keeps its zygotes for all its runs (a scenario's cell groups run one after another in the CLI)
and ends them when it exits; a zygote also ends by itself when its parent dies.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from harness.cpu_isa import NATIVE
from harness.device import cuda_available
from harness.plan import ArmPlan
from harness.settings import ARMS_LANE, FLOOR_LANE, FORK_ARMS_ENV, SCRATCH_ENV

FRESH_ROLES = frozenset({"noise", "lora_noise"})
"""The noise floor's roles: forked from the floor zygote, never beside the reference."""

# Variables set per arm that nothing reads before the arm's own code runs.
PER_ARM_ENV = frozenset({SCRATCH_ENV, "VLLM_ENABLE_V1_MULTIPROCESSING"})
ZYGOTE_MODULE = "harness.arm.zygote"
_READY_TIMEOUT_S = 180.0


class ForkedArm:
    """An arm the zygote forked, with the part of ``subprocess.Popen`` that the runner uses."""

    def __init__(self, conn: socket.socket) -> None:
        self._conn = conn
        self._buffer = b""
        self.returncode: int | None = None
        self.pid = int(self._message(None)["pid"])

    def _message(self, timeout: float | None) -> dict:
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired("forked arm", timeout or 0.0)
            self._conn.settimeout(left)
            try:
                chunk = self._conn.recv(4096)
            except TimeoutError:
                raise subprocess.TimeoutExpired("forked arm", timeout or 0.0) from None
            if not chunk:
                # The waiter died with the arm's group: killed, as SIGKILL would say.
                return {"exit": -signal.SIGKILL}
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = int(self._message(timeout)["exit"])
            self._conn.close()
        return self.returncode


class ArmForker:
    """One zygote for the arms that share an interpreter and ``base_env``, and the noise floor's
    or everyone else's (``floor``); started at the first."""

    def __init__(self, python: str, base_env: dict[str, str], log_dir: Path, floor: bool = False) -> None:
        self.python = python
        self.base_env = base_env
        self.log_dir = log_dir
        self.floor = floor
        """Forks only the noise floor's arms (``FRESH_ROLES``), and only they fork from it."""
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._socket: Path | None = None
        self._failed: str | None = None

    def can_fork(self, arm: ArmPlan) -> bool:
        if os.environ.get(FORK_ARMS_ENV, "1") == "0" or self._failed:
            return False
        return (
            (arm.role in FRESH_ROLES) == self.floor
            and arm.engine.cpu_isa == NATIVE
            # vLLM reads VLLM_RELOAD_MODE in its own processes; a zygote that imported vLLM under
            # the default must not be the parent of an arm with another mode
            and not arm.engine.reload_env()
            and not cuda_available()
        )

    def launch(self, arm_argv: list[str], log_file: Path, env: dict[str, str]) -> ForkedArm | None:
        """The forked arm, or None when the zygote cannot be had (the caller starts it fresh)."""
        path = self._ready()
        if path is None:
            return None
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(str(path))
            request = {
                "plan": arm_argv[0],
                "result": arm_argv[1],
                "log": str(log_file),
                # Only what differs from the zygote's own: a build's launcher adds to the
                # environment it starts the zygote with (PYTHONPATH, its markers), and those stay.
                "env": {k: v for k, v in env.items() if self.base_env.get(k) != v},
                "cwd": os.getcwd(),
            }
            conn.sendall(json.dumps(request).encode() + b"\n")
            return ForkedArm(conn)
        except (OSError, ValueError, KeyError) as exc:
            conn.close()
            self._failed = f"the zygote did not answer: {exc}"
            return None

    def _ready(self) -> Path | None:
        with self._lock:
            if self._failed:
                return None
            if self._proc is None:
                self._start()
            assert self._proc is not None and self._socket is not None
            deadline = time.monotonic() + _READY_TIMEOUT_S
            while not self._socket.exists():
                if self._proc.poll() is not None or time.monotonic() > deadline:
                    self._failed = f"the zygote ended before it was ready (code {self._proc.poll()})"
                    return None
                time.sleep(0.05)
            return self._socket

    def _start(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        # A short path of our own: a Unix socket's name is limited to 108 bytes.
        self._socket = Path(tempfile.mkdtemp(prefix="refit-zygote-")) / "s"
        lane = FLOOR_LANE if self.floor else ARMS_LANE
        with open(self.log_dir / f"{lane}.log", "w") as log:
            self._proc = subprocess.Popen(
                [self.python, "-m", ZYGOTE_MODULE, str(self._socket), lane],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.base_env,
            )

    def close(self) -> None:
        with self._lock:
            if self._proc is not None:
                with contextlib.suppress(ProcessLookupError):
                    self._proc.kill()
                self._proc.wait()
            if self._socket is not None:
                self._socket.unlink(missing_ok=True)
                with contextlib.suppress(OSError):
                    self._socket.parent.rmdir()


# (interpreter, environment, floor) -> forker
_SHARED: dict[tuple[str, tuple[tuple[str, str], ...], bool], ArmForker] = {}
_SHARED_LOCK = threading.Lock()


def forker_for(python: str, env: dict[str, str], log_dir: Path, arm: ArmPlan | None = None) -> ArmForker:
    """This process's forker for ``arm`` (the floor zygote's for a noise-floor arm) run by
    ``python`` with ``env``; the first run to ask keeps the zygote's log."""
    base = {k: v for k, v in env.items() if k not in PER_ARM_ENV}
    floor = arm is not None and arm.role in FRESH_ROLES
    key = (python, tuple(sorted(base.items())), floor)
    with _SHARED_LOCK:
        if key not in _SHARED:
            _SHARED[key] = ArmForker(python, base, log_dir, floor)
        return _SHARED[key]


@atexit.register
def close_shared() -> None:
    with _SHARED_LOCK:
        for forker in _SHARED.values():
            forker.close()
        _SHARED.clear()

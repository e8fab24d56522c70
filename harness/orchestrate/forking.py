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

**A zygote pool** (``REFIT_HARNESS_ZYGOTE_POOL``, made by ``zygote_pool``) shares zygotes across
CLI processes: a test suite or a script that starts many runs pays two preloads per interpreter
and environment instead of two per run (measured on the AVX2 EPYC: 14.5 s of a core each, and a
whole ``make test`` started 98). A pooled zygote is keyed as above, less the variables that
differ per run and that nothing reads before the arm's code (``PER_RUN_ENV``), and it lives until
the pool's owner ends. A cancelled run finds its arms by the marker in ``/proc/PID/environ``,
which a forked process reads from its zygote's start: so a pooled zygote starts with a
placeholder marker of the same length, and each arm writes its own run's marker over it
(``harness.arm.zygote``), so the zygote itself belongs to no run.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from harness.cpu_isa import NATIVE
from harness.device import cuda_available
from harness.plan import ArmPlan
from harness.settings import (
    ARMS_LANE,
    FLOOR_LANE,
    FORK_ARMS_ENV,
    MARKER_PLACEHOLDER,
    POOL_OWNER_FILE,
    RUN_MARKER,
    SCRATCH_ENV,
    ZYGOTE_POOL_ENV,
)

FRESH_ROLES = frozenset({"noise", "lora_noise"})
"""The noise floor's roles: forked from the floor zygote, never beside the reference."""

# Variables set per arm that nothing reads before the arm's own code runs.
PER_ARM_ENV = frozenset({SCRATCH_ENV, "VLLM_ENABLE_V1_MULTIPROCESSING"})
# Variables that differ between the runs one pooled zygote serves; the arm gets its own.
PER_RUN_ENV = frozenset({RUN_MARKER, "PYTEST_CURRENT_TEST"})
POOL_SIZE = 4
"""Live zygotes a pool keeps (about 600 MB of resident memory each, measured); starting another
ends the least recently used."""
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

    @property
    def lane(self) -> str:
        return FLOOR_LANE if self.floor else ARMS_LANE

    def _ready(self) -> Path | None:
        with self._lock:
            if self._failed:
                return None
            if self._proc is None:
                # A short path of our own: a Unix socket's name is limited to 108 bytes.
                self._socket = Path(tempfile.mkdtemp(prefix="refit-zygote-")) / "s"
                self._proc = self._start(self.log_dir / f"{self.lane}.log", self.base_env, [])
            return self._wait_ready()

    def _wait_ready(self) -> Path | None:
        assert self._proc is not None and self._socket is not None
        deadline = time.monotonic() + _READY_TIMEOUT_S
        while not self._socket.exists():
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self._failed = f"the zygote ended before it was ready (code {self._proc.poll()})"
                return None
            time.sleep(0.05)
        return self._socket

    def _start(self, log_file: Path, env: dict[str, str], more_args: list[str]) -> subprocess.Popen:
        assert self._socket is not None
        log_file.parent.mkdir(parents=True, exist_ok=True)
        with open(log_file, "w") as log:
            return subprocess.Popen(
                [self.python, "-m", ZYGOTE_MODULE, str(self._socket), self.lane, *more_args],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                # A pooled zygote outlives this run: out of its process group.
                start_new_session=bool(more_args),
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


class PooledForker(ArmForker):
    """A forker whose zygote lives in a pool (``zygote_pool``): found there when another
    process started it, started there (and left running) otherwise."""

    def __init__(self, python: str, base_env: dict[str, str], log_dir: Path, floor: bool, pool: Path) -> None:
        super().__init__(python, base_env, log_dir, floor)
        self.pool = pool
        key = json.dumps([python, sorted(base_env.items()), floor])
        self.name = f"{self.lane}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"
        """The zygote's files in the pool: ``NAME.s`` (socket), ``NAME.pid``, ``NAME.log``."""
        self._socket = pool / f"{self.name}.s"

    def _ready(self) -> Path | None:
        with self._lock:
            if self._failed:
                return None
            assert self._socket is not None
            pid_file = self.pool / f"{self.name}.pid"
            with _locked(self.pool / f"{self.name}.lock"):
                if not (self._socket.exists() and zygote_alive(_read_pid(pid_file))):
                    _end_least_used(self.pool, keep=POOL_SIZE - 1)
                    self._socket.unlink(missing_ok=True)
                    env = {**self.base_env, RUN_MARKER: MARKER_PLACEHOLDER}
                    self._proc = self._start(self.pool / f"{self.name}.log", env, [str(self.pool)])
                    pid_file.write_text(str(self._proc.pid))
                    if self._wait_ready() is None:
                        return None
                pid_file.touch()  # used: the last to be ended
            return self._socket

    def close(self) -> None:
        """The pool's zygotes end with the pool, not with this run."""


@contextlib.contextmanager
def zygote_pool() -> Iterator[Path]:
    """A zygote pool owned by this process, in ``REFIT_HARNESS_ZYGOTE_POOL`` while the block runs:
    every ``refit-harness`` started meanwhile (with this environment) shares its zygotes. On exit,
    or when this process dies, they end."""
    # A short path: the sockets' names are limited to 108 bytes.
    pool = Path(tempfile.mkdtemp(prefix="refit-pool-"))
    (pool / POOL_OWNER_FILE).write_text(str(os.getpid()))
    before = os.environ.get(ZYGOTE_POOL_ENV)
    os.environ[ZYGOTE_POOL_ENV] = str(pool)
    try:
        yield pool
    finally:
        if before is None:
            os.environ.pop(ZYGOTE_POOL_ENV, None)
        else:
            os.environ[ZYGOTE_POOL_ENV] = before
        _end_least_used(pool, keep=0)
        shutil.rmtree(pool, ignore_errors=True)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path`` (two runs of one pool asking for one zygote at once)."""
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _read_pid(pid_file: Path) -> int | None:
    try:
        return int(pid_file.read_text())
    except (OSError, ValueError):
        return None


def zygote_alive(pid: int | None) -> bool:
    """A live zygote (not a zombie, and not another process that got its pid)."""
    if pid is None:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z" and ZYGOTE_MODULE.encode() in cmdline


def _end_least_used(pool: Path, keep: int) -> None:
    """End the pool's live zygotes but the ``keep`` most recently used. The zygote only: a waiter
    it forked still serves its arm to another run of the pool, and ends with that arm."""
    live = []
    for pid_file in pool.glob("*.pid"):
        pid = _read_pid(pid_file)
        if pid is not None and zygote_alive(pid):
            live.append((pid_file.stat().st_mtime, pid))
    for _, pid in sorted(live)[: max(0, len(live) - keep)]:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


# (interpreter, environment, floor) -> forker
_SHARED: dict[tuple[str, tuple[tuple[str, str], ...], bool], ArmForker] = {}
_SHARED_LOCK = threading.Lock()


def forker_for(python: str, env: dict[str, str], log_dir: Path, arm: ArmPlan | None = None) -> ArmForker:
    """This process's forker for ``arm`` (the floor zygote's for a noise-floor arm) run by
    ``python`` with ``env``; the first run to ask keeps the zygote's log. In a zygote pool, the
    pool's (a marker of another length than the placeholder's cannot be written over it)."""
    pool = os.environ.get(ZYGOTE_POOL_ENV)
    pooled = bool(pool) and len(env.get(RUN_MARKER, "")) == len(MARKER_PLACEHOLDER)
    base = {k: v for k, v in env.items() if k not in PER_ARM_ENV and not (pooled and k in PER_RUN_ENV)}
    floor = arm is not None and arm.role in FRESH_ROLES
    key = (python, tuple(sorted(base.items())), floor)
    with _SHARED_LOCK:
        if key not in _SHARED:
            _SHARED[key] = (
                PooledForker(python, base, log_dir, floor, Path(pool))
                if pooled and pool
                else ArmForker(python, base, log_dir, floor)
            )
        return _SHARED[key]


@atexit.register
def close_shared() -> None:
    with _SHARED_LOCK:
        for forker in _SHARED.values():
            forker.close()
        _SHARED.clear()

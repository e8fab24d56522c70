"""Run each arm in its own process group with a timeout, asv-style.

The parent never imports vLLM: it writes the arm's plan to disk, starts
``python -m harness.arm.process``, waits, and reads the result back. Whatever
happens, the whole process group (engine core and workers included) is killed after.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from harness import store
from harness.builds import venvs as builds
from harness.orchestrate.forking import ForkedArm, forker_for
from harness.plan import ArmPlan
from harness.records import ArmResult
from harness.run_dir import ArmFiles, RunDir
from harness.settings import RUN_MARKER, SCRATCH_ENV

ARM_MODULE = "harness.arm.process"  # an arm runs as `python -m ARM_MODULE PLAN RESULT`


def run_arm(
    arm: ArmPlan,
    workdir: Path,
    extra_env: dict[str, str] | None = None,
    key: str = "",
    fork: bool = False,
) -> ArmResult:
    """Run one arm to its end and store its result. ``fork``: start it from a warm interpreter
    where that is the same program (``harness.orchestrate.forking``)."""
    files = RunDir(workdir).arm(arm)
    store.dump(arm, files.plan, "arm_plan")
    files.result.unlink(missing_ok=True)
    shutil.rmtree(files.scratch, ignore_errors=True)
    files.scratch.mkdir(parents=True)
    started = time.monotonic()
    try:
        returncode, timed_out = _run_process(arm, workdir, _arm_env(arm, files.scratch, extra_env), fork)
    finally:
        shutil.rmtree(files.scratch, ignore_errors=True)
    seconds = round(time.monotonic() - started, 2)
    result = replace(_outcome(arm, files, returncode, timed_out, seconds), key=key)
    store.dump(result, files.result, "arm_result")
    return result


def _arm_env(arm: ArmPlan, scratch: Path, extra_env: dict[str, str] | None) -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", **{SCRATCH_ENV: str(scratch.resolve())}, **(extra_env or {}))
    # A named build: its interpreter, with the harness made importable there (see harness.builds.venvs).
    env.update(builds.build_env(arm.build))
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if arm.engine.engine_core_process else "0"
    return env


def _run_process(arm: ArmPlan, workdir: Path, env: dict[str, str], fork: bool) -> tuple[int | None, bool]:
    """Start the arm's process (forked or fresh) in a group of its own, wait up to its timeout,
    then kill the group: (its exit code, whether it timed out)."""
    files = RunDir(workdir).arm(arm)
    pid_file = files.plan.with_name(f"{arm.name}.pid")
    python = arm.build.python if arm.build and arm.build.python else sys.executable
    with open(files.log, "w") as log:
        argv = [str(files.plan), str(files.result)]
        forker = forker_for(python, env, RunDir(workdir).arms_dir, arm) if fork else None
        forked = forker.launch(argv, files.log, env) if forker and forker.can_fork(arm) else None
        proc = forked or subprocess.Popen(
            [python, "-m", ARM_MODULE, *argv],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
        timed_out = False
        try:
            # The arm's process group id, for a CLI that must stop arms it did not start
            # itself (arms under Ray actors) when the run is cancelled.
            store.write_atomic(pid_file, str(proc.pid))
            proc.wait(timeout=arm.timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            kill_group(proc)
            pid_file.unlink(missing_ok=True)
    return proc.returncode, timed_out


def _outcome(arm: ArmPlan, files: ArmFiles, returncode: int | None, timed_out: bool, seconds: float) -> ArmResult:
    """The arm's result from what its process recorded and how it ended."""
    recorded, log_file = _read_result(files.result), files.log
    if timed_out:
        result = _as_error(arm, recorded, f"timed out after {arm.timeout_s:.0f} s (log: {log_file})", seconds)
    elif recorded is None:
        result = _as_error(
            arm,
            None,
            f"arm process exited with code {returncode} before writing a result; {_last_words(log_file)}",
            seconds,
        )
    elif returncode != 0 and (recorded.status == "ok" or (recorded.error or "").startswith("arm stopped")):
        # Killed (or exited) between two saves: the record only says where it was.
        result = _as_error(arm, recorded, f"arm process exited with code {returncode}", seconds)
    else:
        result = recorded
    if result.status == "error":
        # Stored, so the report (which reads only the disk) says what the parent saw.
        result = replace(result, error=with_root_cause(result.error or "", log_file))
    return result


class SerialExecutor:
    """Arms one at a time, each run to its end from this thread (``--executor local``, or a
    single arm): the ``Executor`` of ``harness.orchestrate.schedule`` with no scheduling of its own."""

    def __init__(self, workdir: Path, env: dict[str, str], keys: dict[str, str], fork: bool = False) -> None:
        self.workdir = workdir
        self.env = env
        self.keys = keys
        self.fork = fork

    def __enter__(self) -> SerialExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        """Nothing runs past ``launch``: ``run_arm`` kills its arm's group itself."""

    def order(self, arms: list[ArmPlan]) -> list[ArmPlan]:
        return list(arms)  # the plan's

    def has_room(self, arm: ArmPlan) -> bool:
        return False

    def launch(self, arm: ArmPlan) -> ArmResult:
        # Looked up at call time: tests stand a stub in for the arm process.
        return run_arm(arm, self.workdir, self.env, self.keys.get(arm.name, ""), self.fork)

    def running(self) -> bool:
        return False

    def wait(self) -> list[tuple[ArmPlan, ArmResult]]:
        return []


def store_error(arm: ArmPlan, workdir: Path, message: str, key: str = "") -> ArmResult:
    """Record an arm that could not run (cancelled, or its Ray actor died)."""
    result_file = RunDir(workdir).arm(arm).result
    result = replace(_as_error(arm, _read_result(result_file), message, 0.0), key=key)
    store.dump(result, result_file, "arm_result")
    return result


def kill_recorded_groups(workdir: Path) -> list[int]:
    """Kill the process group of every arm of this run still recorded as running.

    The arm itself may already be gone (it dies with its parent), leaving its engine core
    and workers in the group, so the group is killed when any member still carries this
    run's marker: a pid file left by a crash never takes down an unrelated process group.
    """
    killed = []
    for pid_file in (workdir / "arms").glob("*.pid"):
        try:
            pgid = int(pid_file.read_text().strip())
        except (OSError, ValueError):
            pgid = None
        if pgid and run_processes(pgid):
            try:
                os.killpg(pgid, signal.SIGKILL)
                killed.append(pgid)
            except (ProcessLookupError, PermissionError):
                pass
        pid_file.unlink(missing_ok=True)
    return killed


def run_processes(pgid: int | None = None, marker: str | None = None) -> list[int]:
    """Pids of live processes carrying this run's marker (``RUN_MARKER`` in their
    environment), optionally only those in process group ``pgid``."""
    marker = marker or os.environ.get(RUN_MARKER)
    if not marker:
        return []
    needle = f"{RUN_MARKER}={marker}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if pgid is not None:
                stat = (entry / "stat").read_text()
                fields = stat[stat.rindex(")") + 2 :].split()
                if fields[0] == "Z" or int(fields[2]) != pgid:
                    continue
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except (OSError, ValueError, IndexError):
            continue
    return found


def kill_group(proc: subprocess.Popen | ForkedArm) -> None:
    """Kill the arm and everything it spawned (vLLM's engine core and workers, a ``vllm
    serve`` and its engine core: all stay in the arm's process group)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def _read_result(path: Path) -> ArmResult | None:
    if not path.exists():
        return None
    try:
        return store.load(ArmResult, path, "arm_result")
    except store.SchemaError:
        return None


def _as_error(arm: ArmPlan, recorded: ArmResult | None, message: str, seconds: float) -> ArmResult:
    observations = recorded.observations if recorded else ()
    if recorded and recorded.error:
        message = f"{message}; {recorded.error}"
    return ArmResult(
        arm=arm.name,
        role=arm.role,
        paths=arm.paths,
        status="error",
        error=message,
        observations=observations,
        seconds=seconds,
        environment=recorded.environment if recorded else (),
        failed_path=recorded.failed_path if recorded else None,
        failed_step=recorded.failed_step if recorded else None,
        measurements=recorded.measurements if recorded else (),
        completions=recorded.completions if recorded else (),
    )


# vLLM's own logger line for an exception raised in an engine process, e.g.
# "(Worker pid=1) ERROR 11-30 03:46:22 [multiproc_executor.py:953] ValueError: Missing keys ..."
_ENGINE_EXCEPTION = re.compile(r"\bERROR\b.*?\] ((?:\w+\.)*\w*(?:Error|Exception)\b: .+)$")


def with_root_cause(error: str, log_file: Path) -> str:
    """vLLM ends a failed engine start or RPC with "see root cause above": the cause is only
    in the engine processes' log. Quote the first exception those processes logged."""
    if "root cause" not in error:
        return error
    try:
        lines = log_file.read_text(errors="replace").splitlines()
    except OSError:
        return error
    cause = next((m.group(1) for line in lines if (m := _ENGINE_EXCEPTION.search(line))), None)
    return f"{error}; root cause in the engine log: {cause[:600]}" if cause and cause not in error else error


# A C++ exception nothing caught (one thrown in a kernel's OpenMP region): std::terminate prints
# its message, torch a backtrace after it, and the process aborts, so the log's last lines are
# stack frames and the message is above them.
# (A line may carry a prefix of its process's name, as Ray's workers print them.)
_NATIVE_ABORT = re.compile(
    r"^[^\n]*terminate called after throwing an instance of '[^']+'\n[^\n]*what\(\):\s*(?P<what>.+)$", re.M
)
_RAISED_AT = re.compile(r"^[^\n]*Exception raised from (?P<where>.+?) \(most recent call first\)", re.M)


def _last_words(path: Path) -> str:
    """What an arm's log says of a death without a result: a native exception's message (and
    where it was raised) where one aborted the process, else the log's last lines."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "last log lines: (no log)"
    aborts = list(_NATIVE_ABORT.finditer(text))
    if not aborts:
        last = [ln for ln in text.splitlines() if ln.strip()][-3:]
        return f"last log lines: {' | '.join(last)[-600:]}"
    raised = _RAISED_AT.search(text, aborts[-1].end())
    where = f" (raised from {raised['where']})" if raised else ""
    return f"native code aborted: {aborts[-1]['what'].strip()}{where}"

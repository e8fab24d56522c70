"""Which arms are forked from a warm interpreter (``harness.orchestrate.forking``), and from
which one, without starting one: the rules that keep a forked arm the same program as a fresh
one."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from harness.orchestrate import forking
from harness.orchestrate.forking import (
    PER_ARM_ENV,
    PER_RUN_ENV,
    ZYGOTE_MODULE,
    ArmForker,
    PooledForker,
    forker_for,
)
from harness.settings import (
    FORK_ARMS_ENV,
    MARKER_PLACEHOLDER,
    POOL_OWNER_FILE,
    RUN_MARKER,
    SCRATCH_ENV,
    ZYGOTE_POOL_ENV,
)
from tests.unit.run_dirs import write_run

BASE = {"PATH": "/usr/bin", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


@pytest.fixture
def arms(tmp_path, monkeypatch):
    monkeypatch.delenv(FORK_ARMS_ENV, raising=False)
    monkeypatch.delenv(ZYGOTE_POOL_ENV, raising=False)
    monkeypatch.setattr(forking, "cuda_available", lambda: False)
    monkeypatch.setattr(forking, "_SHARED", {})  # never this process's real zygotes
    return {a.name: a for a in write_run(tmp_path).plan.arms}


def arm_env(scratch: str = "/tmp/s", **more: str) -> dict[str, str]:
    return {**BASE, SCRATCH_ENV: scratch, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", **more}


def test_one_zygote_per_interpreter_and_import_time_environment(tmp_path, arms):
    first = forker_for(sys.executable, arm_env(), tmp_path)
    # What differs per arm is read after the arm starts: the same zygote serves both.
    assert forker_for(sys.executable, arm_env("/tmp/other", VLLM_ENABLE_V1_MULTIPROCESSING="1"), tmp_path) is first
    assert PER_ARM_ENV == {SCRATCH_ENV, "VLLM_ENABLE_V1_MULTIPROCESSING"}
    assert first.base_env == BASE  # the zygote starts with neither
    # What is read at import time is the zygote's own: thread counts, a build's interpreter.
    assert forker_for(sys.executable, arm_env(OMP_NUM_THREADS="2"), tmp_path) is not first
    assert forker_for(sys.executable, arm_env(ATEN_CPU_CAPABILITY="avx2"), tmp_path) is not first
    other_build = forker_for("/opt/other-build/bin/python", arm_env(), tmp_path)
    assert other_build is not first and other_build.python == "/opt/other-build/bin/python"


def test_reference_and_subjects_fork_and_the_noise_floor_only_from_its_own_zygote(tmp_path, arms, monkeypatch):
    forker = ArmForker(sys.executable, BASE, tmp_path)
    assert forker.can_fork(arms["reference"]) and forker.can_fork(arms["subject-reload_weights"])
    # Two arms forked from one zygote share one address layout: the floor never forks beside
    # the reference, only from a zygote of its own, which forks nothing else.
    assert not forker.can_fork(arms["noise"])
    floor = forker_for(sys.executable, arm_env(), tmp_path, arms["noise"])
    assert floor.floor and floor is not forker_for(sys.executable, arm_env(), tmp_path, arms["reference"])
    assert floor.can_fork(arms["noise"])
    assert not floor.can_fork(arms["reference"]) and not floor.can_fork(arms["subject-reload_weights"])
    assert forker_for(sys.executable, arm_env("/tmp/other"), tmp_path, arms["noise"]) is floor
    subject = arms["subject-reload_weights"]
    lowered = dataclasses.replace(subject, engine=dataclasses.replace(subject.engine, cpu_isa="avx2"))
    assert not forker.can_fork(lowered)  # the ISA mask must come before vLLM imports its kernels
    monkeypatch.setattr(forking, "cuda_available", lambda: True)
    assert not forker.can_fork(subject)


def test_the_switch_and_a_failed_zygote_start_every_arm_fresh(tmp_path, arms, monkeypatch):
    subject = arms["subject-reload_weights"]
    monkeypatch.setenv(FORK_ARMS_ENV, "0")
    assert not ArmForker(sys.executable, BASE, tmp_path).can_fork(subject)
    monkeypatch.delenv(FORK_ARMS_ENV)
    # A zygote that dies before it is ready: launch says so (None) and no arm asks it again.
    broken = ArmForker(sys.executable, BASE, tmp_path)
    monkeypatch.setattr(forking, "ZYGOTE_MODULE", "harness.no_such_module")
    try:
        assert broken.launch(["p", "r"], tmp_path / "arm.log", arm_env()) is None
        assert not broken.can_fork(subject)
        assert "ended before it was ready" in (broken._failed or "")
    finally:
        broken.close()
    assert "No module named harness.no_such_module" in (tmp_path / "zygote.log").read_text()


def test_in_a_pool_the_runs_share_a_zygote_and_a_marker_of_another_length_keeps_its_own(tmp_path, arms, monkeypatch):
    monkeypatch.setenv(ZYGOTE_POOL_ENV, str(tmp_path))
    run_a = arm_env(**{RUN_MARKER: "a" * 32, "PYTEST_CURRENT_TEST": "one"})
    pooled = forker_for(sys.executable, run_a, tmp_path)
    assert isinstance(pooled, PooledForker) and not PER_RUN_ENV & pooled.base_env.keys()
    # Another run, another test: the same zygote, found in the pool by the same name.
    run_b = arm_env(**{RUN_MARKER: "b" * 32, "PYTEST_CURRENT_TEST": "two"})
    assert forker_for(sys.executable, run_b, tmp_path) is pooled
    assert PooledForker(sys.executable, dict(pooled.base_env), tmp_path, False, tmp_path).name == pooled.name
    assert forker_for(sys.executable, arm_env(OMP_NUM_THREADS="2", **{RUN_MARKER: "a" * 32}), tmp_path) is not pooled
    # Its arms could not write a shorter marker over the placeholder: the run keeps its own.
    short = forker_for(sys.executable, arm_env(**{RUN_MARKER: "short"}), tmp_path)
    assert not isinstance(short, PooledForker) and short.base_env[RUN_MARKER] == "short"
    monkeypatch.setenv(ZYGOTE_POOL_ENV, "")
    assert not isinstance(forker_for(sys.executable, arm_env(**{RUN_MARKER: "c" * 32}), tmp_path), PooledForker)


def test_an_arm_writes_its_runs_marker_where_proc_shows_it():
    code = (
        "import os, sys\n"
        "from harness.arm.zygote import stamp_marker\n"
        f"assert stamp_marker({MARKER_PLACEHOLDER!r}, {'f' * 32!r})\n"
        f"assert not stamp_marker({MARKER_PLACEHOLDER!r}, {'e' * 32!r})  # written over: no longer there\n"
        "print(open(f'/proc/{os.getpid()}/environ', 'rb').read().decode(errors='replace'))\n"
        "stamp_marker('x', 'yy')\n"
    )
    env = {**os.environ, RUN_MARKER: MARKER_PLACEHOLDER}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert f"{RUN_MARKER}={'f' * 32}\0" in proc.stdout and MARKER_PLACEHOLDER not in proc.stdout, proc.stderr
    assert "cannot replace one of 1" in proc.stderr  # the last line: lengths must match


def test_a_pooled_arms_pid_is_answered_once_it_leads_its_group_and_carries_its_marker(tmp_path):
    # A zygote that serves without preloading (the arm's own work is not looked at): what the
    # runner records on the answer must already be what a cancelled run looks for.
    (tmp_path / POOL_OWNER_FILE).write_text(str(os.getpid()))
    path = str(tmp_path / "z.sock")
    serve = f"from pathlib import Path; from harness.arm.zygote import serve; serve({path!r}, 'zygote', Path({str(tmp_path)!r}))"
    env = {**os.environ, RUN_MARKER: MARKER_PLACEHOLDER}
    zygote = subprocess.Popen([sys.executable, "-c", serve], env=env, start_new_session=True)
    marker = "d" * 32
    request = {"log": str(tmp_path / "arm.log"), "cwd": str(tmp_path), "env": {RUN_MARKER: marker}}
    try:
        deadline = time.monotonic() + 60
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.05)
        for _ in range(3):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                conn.connect(path)
                conn.sendall(json.dumps({**request, "plan": "missing", "result": "missing"}).encode() + b"\n")
                arm = json.loads(conn.makefile().readline())["pid"]
                environ = Path(f"/proc/{arm}/environ").read_bytes().split(b"\0")
                leads = os.getpgid(arm) == arm
                os.killpg(arm, signal.SIGKILL)
            assert f"{RUN_MARKER}={marker}".encode() in environ and leads, (environ, leads)
    finally:
        os.killpg(zygote.pid, signal.SIGKILL)
        zygote.wait()


def test_a_full_pool_ends_its_least_recently_used_zygotes_only(tmp_path):
    # Each fake zygote has a waiter in its group, as a real one has while another run's arm runs.
    body = "import subprocess, time; subprocess.Popen(['sleep', '120']); time.sleep(120)"

    def fake_zygote(name: str, used: float) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-c", body, ZYGOTE_MODULE], start_new_session=True)
        pid_file = tmp_path / f"{name}.pid"
        pid_file.write_text(str(proc.pid))
        os.utime(pid_file, (used, used))
        return proc

    procs = {name: fake_zygote(name, used) for name, used in (("old", 1e9), ("new", 3e9), ("mid", 2e9))}
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    (tmp_path / "other.pid").write_text(str(other.pid))  # not a zygote (a reused pid): left alone
    try:
        # Until each fake zygote has started its waiter (a fixed pause was short under load).
        deadline = time.monotonic() + 60
        while not all(psutil.Process(p.pid).children() for p in procs.values()) and time.monotonic() < deadline:
            time.sleep(0.05)
        waiter = psutil.Process(procs["old"].pid).children()[0]
        forking._end_least_used(tmp_path, keep=1)
        assert [procs[n].wait(timeout=10) for n in ("old", "mid")] == [-signal.SIGKILL] * 2
        assert procs["new"].poll() is None and other.poll() is None
        assert waiter.is_running() and waiter.status() != psutil.STATUS_ZOMBIE  # its arm's run goes on
    finally:
        for proc in procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # the waiters too
            proc.wait()
        other.kill()
        other.wait()

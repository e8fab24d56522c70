"""Which arms are forked from a warm interpreter (``harness.orchestrate.forking``), and from
which one, without starting one: the rules that keep a forked arm the same program as a fresh
one."""

from __future__ import annotations

import dataclasses
import sys

import pytest

from harness.orchestrate import forking
from harness.orchestrate.forking import PER_ARM_ENV, ArmForker, forker_for
from harness.settings import FORK_ARMS_ENV, SCRATCH_ENV
from tests.unit.run_dirs import write_run

BASE = {"PATH": "/usr/bin", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


@pytest.fixture
def arms(tmp_path, monkeypatch):
    monkeypatch.delenv(FORK_ARMS_ENV, raising=False)
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

"""Which arms are forked from the warm interpreter (``harness.orchestrate.forking``), without
starting one: the rules that keep a forked arm the same program as a fresh one."""

from __future__ import annotations

import dataclasses
import sys

import pytest

from harness.orchestrate.forking import PER_ARM_ENV, ArmForker
from harness.settings import FORK_ARMS_ENV, SCRATCH_ENV
from tests.unit.run_dirs import write_run

BASE = {"PATH": "/usr/bin", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


@pytest.fixture
def arms(tmp_path, monkeypatch):
    monkeypatch.delenv(FORK_ARMS_ENV, raising=False)
    monkeypatch.setattr("harness.orchestrate.forking.cuda_available", lambda: False)
    return {a.name: a for a in write_run(tmp_path).plan.arms}


def arm_env(**more: str) -> dict[str, str]:
    return dict(BASE, **{SCRATCH_ENV: "/tmp/s", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}, **more)


def test_reference_and_subjects_fork_and_the_noise_floor_starts_fresh(tmp_path, arms):
    forker = ArmForker(BASE, tmp_path)
    assert forker.can_fork(arms["reference"], arm_env(), sys.executable)
    assert forker.can_fork(arms["subject-reload_weights"], arm_env(), sys.executable)
    # Two forked cold starts share one address layout: the floor must come from a fresh process.
    assert not forker.can_fork(arms["noise"], arm_env(), sys.executable)
    assert PER_ARM_ENV == {SCRATCH_ENV, "VLLM_ENABLE_V1_MULTIPROCESSING"}


def test_what_a_fresh_process_would_read_differently_is_never_forked(tmp_path, arms, monkeypatch):
    forker = ArmForker(BASE, tmp_path)
    subject = arms["subject-reload_weights"]
    # read when torch loads: thread counts, the ISA caps
    assert not forker.can_fork(subject, arm_env(OMP_NUM_THREADS="2"), sys.executable)
    assert not forker.can_fork(subject, arm_env(ATEN_CPU_CAPABILITY="avx2"), sys.executable)
    lowered = dataclasses.replace(subject, engine=dataclasses.replace(subject.engine, cpu_isa="avx2"))
    assert not forker.can_fork(lowered, arm_env(), sys.executable)
    # a named build has its own interpreter
    assert not forker.can_fork(subject, arm_env(), "/opt/other-build/bin/python")
    missing = dict(arm_env())
    del missing["PATH"]
    assert not forker.can_fork(subject, missing, sys.executable)
    monkeypatch.setattr("harness.orchestrate.forking.cuda_available", lambda: True)
    assert not forker.can_fork(subject, arm_env(), sys.executable)


def test_the_switch_and_a_failed_zygote_start_every_arm_fresh(tmp_path, arms, monkeypatch):
    subject = arms["subject-reload_weights"]
    monkeypatch.setenv(FORK_ARMS_ENV, "0")
    assert not ArmForker(BASE, tmp_path).can_fork(subject, arm_env(), sys.executable)
    monkeypatch.delenv(FORK_ARMS_ENV)
    # A zygote that dies before it is ready: launch says so (None) and no arm asks it again.
    broken = ArmForker(dict(BASE, PATH="/nonexistent"), tmp_path)
    monkeypatch.setattr("harness.orchestrate.forking.ZYGOTE_MODULE", "harness.no_such_module")
    try:
        assert broken.launch(["p", "r"], tmp_path / "arm.log", arm_env()) is None
        assert not broken.can_fork(subject, arm_env(PATH="/nonexistent"), sys.executable)
        assert "ended before it was ready" in (broken._failed or "")
    finally:
        broken.close()
    assert "No module named harness.no_such_module" in (tmp_path / "zygote.log").read_text()

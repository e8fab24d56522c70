"""The run's one scheduler (``harness.orchestrate.schedule``) without engines.

The cancel rule runs on each of the three executors (one at a time from here, processes of this
machine, Ray actors of a local Ray), each arm's "interpreter" a shell script standing in for
``python -m harness.arm.process`` under the real ``runner.run_arm``. Resume, reference reuse and
the store of a fresh reference are the scheduler's alone: there the arm process is a stub that
stores an ok result, as a real arm leaves it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util

import pytest

from harness import store
from harness.orchestrate import reference, runner, schedule
from harness.orchestrate.fanout import FanoutSpec, RayExecutor
from harness.orchestrate.processes import ProcessesExecutor
from harness.orchestrate.reference import ReferenceInputs
from harness.orchestrate.runner import SerialExecutor
from harness.orchestrate.schedule import arm_key, executor_for, run_queue
from harness.run_dir import RunDir
from harness.spec.build import BuildSpec
from tests.records import B, arm, obs
from tests.unit.run_dirs import write_run

CANCELLED = "cancelled: the reference arm (cold B) failed to start, so nothing could be judged: arm process exited"


def serial(workdir):
    return SerialExecutor(workdir, {}, {})


def processes(workdir):
    return ProcessesExecutor(workdir, FanoutSpec(arm_memory_bytes=1, max_concurrent=1, ray=False), {}, {})


def ray_actors(workdir):
    if importlib.util.find_spec("ray") is None:
        pytest.skip("Ray is not installed")
    fan = FanoutSpec(arm_memory_bytes=1 << 20, max_concurrent=1, stage_checkpoints=False)
    return RayExecutor(workdir, fan, {}, {})


class Results(dict):
    """Each arm's result by name, in the order they ended."""

    def ended(self, arm_plan, result) -> None:
        assert arm_plan.name not in self, f"{arm_plan.name} ended twice"
        self[arm_plan.name] = result


def failing_arms(tmp_path):
    """A subject, the reference and another subject, each one step long (so every executor's
    order is this one) and each failing to start: its "interpreter" exits 1 without a result."""
    script = tmp_path / "fake-python"
    script.write_text("#!/bin/sh\nexit 1\n")
    script.chmod(0o755)
    record = write_run(tmp_path / "run")
    for result in (tmp_path / "run" / "arms").glob("*.result.json"):
        result.unlink()
    by_name = {a.name: a for a in record.plan.arms}
    cold = by_name["reference"].steps
    fake = BuildSpec("fake", str(script))
    plan = [
        dataclasses.replace(by_name[name], build=fake, steps=cold[:1], timeout_s=60)
        for name in ("subject-reload_weights", "reference", "subject-http_reload")
    ]
    return plan, tmp_path / "run"


@pytest.mark.parametrize("executor", [serial, processes, ray_actors], ids=["serial", "processes", "ray"])
def test_a_reference_that_fails_to_start_cancels_the_arms_not_started_on_every_executor(tmp_path, executor):
    plan, workdir = failing_arms(tmp_path)
    started, results = [], Results()
    run_queue(plan, executor(workdir), workdir, {}, lambda a: started.append(a.name), results.ended)
    # A subject that fails cancels nothing; the reference that fails cancels the arm still queued.
    assert started == ["subject-reload_weights", "reference"]
    assert results["subject-reload_weights"].error.startswith("arm process exited with code 1")
    assert results["reference"].error.startswith("arm process exited with code 1")
    assert results["subject-http_reload"].error.startswith(CANCELLED), results["subject-http_reload"].error
    on_disk = store.load(type(results["reference"]), RunDir(workdir).arm(plan[2]).result, "arm_result")
    assert on_disk.error == results["subject-http_reload"].error  # the cancellation is a record too


def stub_arm_processes(monkeypatch, seen: list[str], on_start=None):
    """``runner.run_arm`` as a stub that stores an ok result (one cold-B observation), key stamped."""

    def stub(arm_plan, out, env, key="", fork=False):
        seen.append(arm_plan.name)
        if on_start is not None:
            on_start(arm_plan)
        result = dataclasses.replace(arm(arm_plan.name, arm_plan.role, obs("cold_B", B), paths=arm_plan.paths), key=key)
        store.dump(result, RunDir(out).arm(arm_plan).result, "arm_result")
        return result

    monkeypatch.setattr(runner, "run_arm", stub)


def run_schedule(record, out, resume=False, inputs=None, claims=None) -> list[str]:
    lines: list[str] = []
    with claims or contextlib.ExitStack() as held:
        schedule.schedule(record, inputs, out, lines.append, None, resume, held)
    return lines


@pytest.mark.parametrize("resume", [True, False])
def test_resume_keeps_the_arms_finished_with_the_same_key_and_runs_the_rest(tmp_path, monkeypatch, resume):
    out = tmp_path / "run"
    record = write_run(out)  # every arm's result on disk, measured with no key
    for name in ("noise", "subject-reload_weights"):
        a = next(a for a in record.plan.arms if a.name == name)
        kept = dataclasses.replace(arm(a.name, a.role, obs("cold_B", B), paths=a.paths), key=arm_key(a, record.git_sha))
        store.dump(kept, RunDir(out).arm(a).result, "arm_result")
    seen: list[str] = []
    stub_arm_processes(monkeypatch, seen)
    lines = run_schedule(record, out, resume=resume)
    if resume:
        assert seen == ["reference", "reference-http", "subject-http_reload"]
        assert "[2/5] noise: already finished, kept" in lines
        assert any(line.startswith("[1/5] reference: finished, but it was measured with another") for line in lines)
    else:
        assert seen == [a.name for a in record.plan.arms]


def cached_reference(tmp_path, monkeypatch, key: str):
    """A reference cache in ``tmp_path`` holding ``key``'s reference and noise (ok, 77 s each)."""
    cache = tmp_path / "cache"
    monkeypatch.setattr(schedule, "DEFAULT_CACHE", cache)
    for role in reference.CACHED_ROLES:
        cached = dataclasses.replace(arm(role, role, obs("cold_B", B)), seconds=77.0)
        store.dump(cached, reference.cached_result(key, role, cache), "arm_result")
    return cache


@pytest.mark.parametrize("reused", [True, False])
def test_reused_reference_arms_are_copied_from_the_cache_and_not_run(tmp_path, monkeypatch, reused):
    cache = cached_reference(tmp_path, monkeypatch, "k1")
    out = tmp_path / "run"
    record = write_run(out)
    for result in RunDir(out).arms_dir.glob("*.result.json"):
        result.unlink()
    plan = dataclasses.replace(record.plan, reused=reference.CACHED_ROLES if reused else ())
    record = dataclasses.replace(record, plan=plan, reference_key="k1")
    seen: list[str] = []
    stub_arm_processes(monkeypatch, seen)
    lines = run_schedule(record, out)
    by_name = {a.name: a for a in record.plan.arms}
    if reused:
        assert seen == ["reference-http", "subject-reload_weights", "subject-http_reload"]
        for role in reference.CACHED_ROLES:
            copied = RunDir(out).arm(by_name[role]).result.read_bytes()
            assert copied == reference.cached_result("k1", role, cache).read_bytes()
        assert "[1/5] reference: reused reference k1" in lines
    else:
        assert seen == list(by_name)
        assert not any("reused reference" in line for line in lines)


def test_a_fresh_reference_is_stored_and_its_claim_released_before_the_subjects_run(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setattr(schedule, "DEFAULT_CACHE", cache)
    out = tmp_path / "run"
    record = dataclasses.replace(write_run(out), reference_key="k2")
    inputs = ReferenceInputs(build=(), device="cpu", cpu=None, arm="{}", checkpoint_b="b", env=(), observation_code="c")
    released, at_subject_start = [], []
    claims = contextlib.ExitStack()
    claims.callback(lambda: released.append(True))

    def on_start(arm_plan) -> None:
        if arm_plan.role == "subject":
            at_subject_start.append((bool(released), reference.cached("k2", cache) is not None))

    seen: list[str] = []
    stub_arm_processes(monkeypatch, seen, on_start)
    lines = run_schedule(record, out, inputs=inputs, claims=claims)
    assert at_subject_start == [(True, True), (True, True)]
    assert "stored reference k2 for reuse" in lines and released == [True]


def test_an_interrupt_kills_the_run_and_sweeps_its_weight_copies(tmp_path, monkeypatch):
    out = tmp_path / "run"
    record = write_run(out)
    (RunDir(out).scratch_dir / "subject-x").mkdir(parents=True)

    def interrupted(arm_plan) -> None:
        raise KeyboardInterrupt

    stub_arm_processes(monkeypatch, [], interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_schedule(record, out)
    assert not RunDir(out).scratch_dir.exists()


def test_the_executor_is_chosen_once_per_run(tmp_path):
    arms_ = write_run(tmp_path).plan.arms
    local, many = FanoutSpec(ray=False), list(arms_)
    assert isinstance(executor_for(None, many, tmp_path, {}, {}), SerialExecutor)
    assert isinstance(executor_for(local, many, tmp_path, {}, {}), ProcessesExecutor)
    assert isinstance(executor_for(FanoutSpec(), many, tmp_path, {}, {}), RayExecutor)
    # One arm on this machine needs no scheduling; on a cluster it still goes there.
    assert isinstance(executor_for(FanoutSpec(), many[:1], tmp_path, {}, {}), SerialExecutor)
    assert isinstance(executor_for(FanoutSpec(address="auto"), many[:1], tmp_path, {}, {}), RayExecutor)
    assert executor_for(local, many, tmp_path, {}, {}).fork and not executor_for(None, many[:1], tmp_path, {}, {}).fork

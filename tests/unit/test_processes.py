"""The processes executor (``harness.orchestrate.processes``) under the run's scheduler
(``harness.orchestrate.schedule.run_queue``) without engines: each arm's "interpreter" is a shell
script standing in for ``python -m harness.arm.process``, run by the real ``runner.run_arm`` (own
process group, pid file, timeout, result record)."""

from __future__ import annotations

import dataclasses
import os
import time
import uuid

import pytest

from harness.cli.run import executor_is_ray
from harness.errors import UsageError
from harness.orchestrate.fanout import FanoutSpec
from harness.orchestrate.processes import ProcessesExecutor
from harness.orchestrate.runner import run_processes
from harness.orchestrate.schedule import run_queue
from harness.settings import RUN_MARKER
from harness.spec.build import BuildSpec
from tests.unit.run_dirs import write_run

FAN = FanoutSpec(arm_memory_bytes=1, ray=False)  # memory never the limit here: CPUs are


def arms(tmp_path, body: str, tp: dict[str, int] | None = None):
    """The four arms of a reload_weights + http_reload run, each running ``body`` (sh): the reference,
    the noise floor and the two subjects (http_reload's cold B of its own batch shapes left out: the
    scheduling is what these tests are about)."""
    script = tmp_path / "fake-python"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)
    record = write_run(tmp_path / "run")
    out = []
    for a in (a for a in record.plan.arms if a.role != "shape_reference"):
        engine = dataclasses.replace(a.engine, tensor_parallel_size=(tp or {}).get(a.name, 1))
        out.append(dataclasses.replace(a, build=BuildSpec("fake", str(script)), engine=engine, timeout_s=60))
    return out, tmp_path / "run"


def run_arms_here(plan, workdir, started) -> dict:
    """Each arm's result by name, ``plan`` run by the scheduler on the processes executor."""
    results: dict = {}
    executor = ProcessesExecutor(workdir, FAN, {}, {})
    run_queue(plan, executor, workdir, {}, started, lambda arm, result: results.setdefault(arm.name, result))
    return results


def intervals(log) -> dict[str, tuple[float, float]]:
    spans: dict[str, list[float]] = {}
    for line in log.read_text().splitlines():
        _, when, plan = line.split()
        spans.setdefault(plan.rsplit("/", 1)[-1].removesuffix(".plan.json"), []).append(float(when))
    return {name: (min(t), max(t)) for name, t in spans.items()}


def most_at_once(spans, weight=lambda name: 1) -> int:
    points = sorted({t for span in spans.values() for t in span})
    return max(sum(weight(n) for n, (s, e) in spans.items() if s <= t < e) for t in points)


@pytest.fixture
def two_cpus(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 2)


def test_arms_run_two_at_a_time_on_two_cpus_and_a_tp2_arm_alone(tmp_path, two_cpus):
    log = tmp_path / "log"
    body = f'echo "start $(date +%s.%N) $3" >> {log}; sleep 0.6; echo "end $(date +%s.%N) $3" >> {log}\n'
    plan, workdir = arms(tmp_path, body, tp={"subject-http_reload": 2})
    started = []
    results = run_arms_here(plan, workdir, started.append)
    assert set(results) == {a.name for a in plan} == {a.name for a in started}
    # No result file: the stand-in never writes one, which run_arm records as the arm's error.
    assert all(r.status == "error" and "before writing a result" in r.error for r in results.values())
    spans = intervals(log)
    assert set(spans) == set(results)
    assert most_at_once(spans) == 2  # independent arms at the same time, never more than the CPUs
    tp2 = spans["subject-http_reload"]
    assert all(e <= tp2[0] or s >= tp2[1] for n, (s, e) in spans.items() if n != "subject-http_reload")


# As vLLM 0.32 aborted W8A8 int8 in fp16 on an AMX Xeon (docs/findings/amx-int8-gemm-kills-the-engine.md).
NATIVE_ABORT_LOG = """[reference] observe cold_B
terminate called after throwing an instance of 'c10::Error'
  what():  scale_C: scalar path not implemented!
Exception raised from apply at /tmp/vllm/csrc/cpu/sgl-kernels/gemm_int8.cpp:21 (most recent call first):
""" + "".join(f"frame #{i}: <unknown function> + 0x9ef852 (0x7fa52bbef852 in libtorch_cpu.so)\n" for i in range(16))


@pytest.mark.parametrize("aborts", [True, False], ids=["native-abort", "plain-death"])
def test_an_arm_killed_by_a_native_abort_is_told_by_its_message_not_its_frames(tmp_path, two_cpus, aborts):
    log = tmp_path / "abort.log"
    log.write_text(NATIVE_ABORT_LOG if aborts else NATIVE_ABORT_LOG.replace("terminate called", "terminated"))
    plan, workdir = arms(tmp_path, f"cat {log}\nkill -ABRT $$\n")
    errors = {r.error for r in run_arms_here(plan[:1], workdir, lambda arm: None).values()}
    said = (
        "native code aborted: scale_C: scalar path not implemented! "
        "(raised from apply at /tmp/vllm/csrc/cpu/sgl-kernels/gemm_int8.cpp:21)"
    )
    assert len(errors) == 1 and "exited with code -6 before writing a result" in next(iter(errors)), errors
    if aborts:
        assert errors == {f"arm process exited with code -6 before writing a result; {said}"}
    else:  # no message of std::terminate: the last lines, frames and all
        assert "last log lines: frame #13" in next(iter(errors)) and said not in next(iter(errors))


def test_a_reference_that_fails_to_start_cancels_the_arms_not_started(tmp_path, two_cpus):
    # Longest first, the noise floor before the reference among equals: the slow subject and the
    # noise arm, then the reference in the first slot freed; the short subject is still queued
    # behind the slow one when the reference fails.
    body = 'case "$3" in *subject-reload_weights*) sleep 2;; *noise*) sleep 0.2;; esac; exit 1\n'
    plan, workdir = arms(tmp_path, body)
    cold = next(a for a in plan if a.name == "reference").steps
    plan = [dataclasses.replace(a, steps=cold[:1]) if a.name == "subject-http_reload" else a for a in plan]
    order = []
    results = run_arms_here(plan, workdir, lambda arm: order.append(arm.name))
    assert order == ["subject-reload_weights", "noise", "reference"]
    assert results["reference"].error.startswith("arm process exited with code 1")
    assert results["subject-http_reload"].error.startswith("cancelled: the reference arm (cold B) failed to start")


def test_a_cancelled_run_kills_its_running_arms_and_keeps_their_records(tmp_path, two_cpus, monkeypatch):
    marker = uuid.uuid4().hex
    monkeypatch.setenv(RUN_MARKER, marker)  # inherited by the arms: how their groups are found
    plan, workdir = arms(tmp_path, "sleep 60\n")
    seen = []

    def started(arm) -> None:
        seen.append(arm.name)
        if len(seen) == 2:
            time.sleep(0.5)  # both arms are up
            raise KeyboardInterrupt  # as Ctrl-C or the CLI's SIGTERM handler does

    begun = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        run_arms_here(plan, workdir, started)
    assert time.monotonic() - begun < 20, "the running arms were not killed"
    assert not run_processes(marker=marker), "an arm's process outlived the cancelled run"
    first = seen[0]
    assert (workdir / "arms" / f"{first}.result.json").is_file()
    assert not list((workdir / "arms").glob("*.pid"))


def test_the_default_executor_is_processes_on_a_cpu_and_ray_where_ray_is_needed():
    assert executor_is_ray("auto", None, ()) is False
    assert executor_is_ray("auto", "127.0.0.1:6379", ()) is True
    assert executor_is_ray("auto", None, (("refit_worker", 1.0),)) is True
    assert executor_is_ray("ray", None, ()) is True and executor_is_ray("processes", None, ()) is False
    with pytest.raises(UsageError, match="need --executor ray"):
        executor_is_ray("processes", "127.0.0.1:6379", ())


def test_arms_at_once_count_the_page_cache_the_kernel_gives_back(tmp_path, two_cpus, monkeypatch):
    """Measured here: 4.0 GiB free, 21.5 GiB available (page cache). Free pages alone allowed one
    arm at a time on this 2-core machine, every run and every cell group."""
    from harness.orchestrate import fanout

    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24730624 kB\nMemFree:         4198484 kB\nMemAvailable:   22496416 kB\n")
    assert fanout.available_memory(meminfo) == 22496416 * 1024
    (tmp_path / "no-meminfo").write_text("nothing here\n")
    assert fanout.available_memory(tmp_path / "no-meminfo") > 0  # free pages, where MemAvailable is missing
    monkeypatch.setattr(fanout, "available_memory", lambda: 22496416 * 1024)
    assert fanout.local_concurrency(FanoutSpec()) == 2  # 4 GiB an arm: the CPUs are the limit
    assert fanout.local_concurrency(FanoutSpec(max_concurrent=1)) == 1
    monkeypatch.setattr(fanout, "available_memory", lambda: 6 << 30)
    assert fanout.local_concurrency(FanoutSpec()) == 1  # memory for one arm only

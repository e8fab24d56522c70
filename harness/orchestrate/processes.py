"""Run independent arms at the same time on this machine, without Ray (``--executor processes``).

Each arm runs exactly as under a Ray actor: ``harness.orchestrate.runner.run_arm`` starts it
in a process group of its own with its timeout, and its plan, log and result land in the run
directory. What Ray adds on one machine is only the scheduling, and a local Ray costs 11-15 s
of daemons (GCS, raylet, dashboard and runtime-env agents, prestarted workers) before the first
arm, on this 2-core machine, for every run and every cell group of a scenario. Here a thread per
running arm waits on its process instead, and the same limits hold as on a local Ray:

- CPUs: an arm takes one CPU per tensor-parallel rank (Ray's ``num_cpus``), as many run at once
  as the machine's CPUs hold (an arm wider than the machine runs alone);
- memory: no more arms at once than free memory holds at ``FanoutSpec.arm_memory_bytes`` each
  (``harness.orchestrate.fanout.local_concurrency``), and at most ``max_concurrent``;
- order: longest first (noise arms first among equals, ``harness.orchestrate.forking``), and a
  reference that fails to start cancels the arms not started.

CPU machines only: on CUDA, Ray gives each arm its GPUs, so the CLI's default picks Ray there
(and for ``--ray-address`` or ``--ray-resource``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path

from harness.orchestrate.fanout import FanoutSpec, local_concurrency
from harness.orchestrate.forking import FRESH_ROLES
from harness.plan import ArmPlan
from harness.records import ArmResult


def cpus_of(arm: ArmPlan, cpus: int) -> int:
    """CPUs an arm holds while it runs: one per rank, at most the machine's."""
    return max(1, min(arm.engine.tensor_parallel_size, cpus))


def run_arms_here(
    arms: list[ArmPlan],
    workdir: Path,
    fan: FanoutSpec,
    started: Callable[[ArmPlan], None],
    env: dict[str, str],
    keys: dict[str, str] | None = None,
    fork: bool = False,
) -> Iterator[tuple[ArmPlan, ArmResult]]:
    """Yield (arm, result) as arms finish, every result on disk first (as ``fanout.run_arms``).
    When the caller stops (Ctrl-C, SIGTERM), the arms still running are killed, and their
    threads have stored what they saw before this returns."""
    from harness.orchestrate.runner import kill_recorded_groups, run_arm, store_error

    keys = keys or {}
    cpus = os.cpu_count() or 1
    at_once = local_concurrency(fan)
    # Longest first; among equals, the noise floor's (they fork from a zygote of their own), so
    # that its zygote imports vLLM beside the other one's preload instead of after it.
    queue = sorted(arms, key=lambda a: (len(a.steps), a.role in FRESH_ROLES), reverse=True)
    running: dict[Future, ArmPlan] = {}
    pool = ThreadPoolExecutor(max_workers=max(1, min(len(arms), cpus, at_once)), thread_name_prefix="arm")
    try:
        while queue or running:
            used = sum(cpus_of(a, cpus) for a in running.values())
            while queue and len(running) < at_once and (not running or used + cpus_of(queue[0], cpus) <= cpus):
                arm = queue.pop(0)
                started(arm)
                running[pool.submit(run_arm, arm, workdir, env, keys.get(arm.name, ""), fork)] = arm
                used += cpus_of(arm, cpus)
            done, _ = wait(list(running), return_when=FIRST_COMPLETED)
            for future in done:
                arm = running.pop(future)
                try:
                    result = future.result()
                except Exception as exc:  # run_arm stores its own errors; this is the harness's own failure
                    result = store_error(
                        arm, workdir, f"the arm could not be run: {type(exc).__name__}: {exc}", keys.get(arm.name, "")
                    )
                yield arm, result
                if arm.role == "reference" and not result.observations:
                    for queued in queue:
                        yield (
                            queued,
                            store_error(
                                queued,
                                workdir,
                                f"cancelled: the reference arm (cold B) failed to "
                                f"start, so nothing could be judged: {result.error}",
                                keys.get(queued.name, ""),
                            ),
                        )
                    queue.clear()
    finally:
        queue.clear()
        # The run was cancelled: kill its arms' process groups until every thread is back (an arm
        # started a moment ago may not have recorded its group yet).
        while running:
            kill_recorded_groups(workdir)
            done, _ = wait(list(running), timeout=1)
            for future in done:
                running.pop(future)
        pool.shutdown(wait=True, cancel_futures=True)

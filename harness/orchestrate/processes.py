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
- order: longest first (noise arms first among equals, ``harness.orchestrate.forking``); what an
  arm's end means (a reference that fails to start cancels the arms not started) is the
  scheduler's, as for every executor (``harness.orchestrate.schedule``).

CPU machines only: on CUDA, Ray gives each arm its GPUs, so the CLI's default picks Ray there
(and for ``--ray-address`` or ``--ray-resource``).
"""

from __future__ import annotations

import os
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path

from harness.orchestrate import runner
from harness.orchestrate.fanout import FanoutSpec, local_concurrency
from harness.orchestrate.forking import FRESH_ROLES
from harness.orchestrate.runner import kill_recorded_groups, store_error
from harness.plan import ArmPlan
from harness.records import ArmResult


def cpus_of(arm: ArmPlan, cpus: int) -> int:
    """CPUs an arm holds while it runs: one per rank, at most the machine's."""
    return max(1, min(arm.engine.tensor_parallel_size, cpus))


class ProcessesExecutor:
    """Arms as processes of this machine, a thread waiting on each: the ``Executor`` of
    ``harness.orchestrate.schedule`` for ``--executor processes``."""

    def __init__(
        self, workdir: Path, fan: FanoutSpec, env: dict[str, str], keys: dict[str, str], fork: bool = False
    ) -> None:
        self.workdir = workdir
        self.env = env
        self.keys = keys
        self.fork = fork
        self.cpus = os.cpu_count() or 1
        self.at_once = local_concurrency(fan)
        self._running: dict[Future, ArmPlan] = {}
        self._pool: ThreadPoolExecutor | None = None

    def __enter__(self) -> ProcessesExecutor:
        workers = max(1, min(self.cpus, self.at_once))
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="arm")
        return self

    def __exit__(self, *exc: object) -> None:
        """The run was cancelled: kill its arms' process groups until every thread is back (an arm
        started a moment ago may not have recorded its group yet); their threads have stored what
        they saw before this returns."""
        while self._running:
            kill_recorded_groups(self.workdir)
            done, _ = wait(list(self._running), timeout=1)
            for future in done:
                self._running.pop(future)
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def order(self, arms: list[ArmPlan]) -> list[ArmPlan]:
        # Longest first; among equals, the noise floor's (they fork from a zygote of their own), so
        # that its zygote imports vLLM beside the other one's preload instead of after it.
        return sorted(arms, key=lambda a: (len(a.steps), a.role in FRESH_ROLES), reverse=True)

    def has_room(self, arm: ArmPlan) -> bool:
        used = sum(cpus_of(a, self.cpus) for a in self._running.values())
        return len(self._running) < self.at_once and used + cpus_of(arm, self.cpus) <= self.cpus

    def launch(self, arm: ArmPlan) -> None:
        assert self._pool is not None, "launch() outside the executor's with block"
        key = self.keys.get(arm.name, "")
        # runner.run_arm looked up at call time: tests stand a stub in for the arm process.
        self._running[self._pool.submit(runner.run_arm, arm, self.workdir, self.env, key, self.fork)] = arm

    def running(self) -> bool:
        return bool(self._running)

    def wait(self) -> list[tuple[ArmPlan, ArmResult]]:
        done, _ = wait(list(self._running), return_when=FIRST_COMPLETED)
        ended = []
        for future in done:
            arm = self._running.pop(future)
            try:
                result = future.result()
            except Exception as exc:  # run_arm stores its own errors; this is the harness's own failure
                message = f"the arm could not be run: {type(exc).__name__}: {exc}"
                result = store_error(arm, self.workdir, message, self.keys.get(arm.name, ""))
            ended.append((arm, result))
        return ended

"""Run independent arms at the same time as Ray actors.

Each actor still runs its arm in an isolated subprocess with a timeout
(``harness.engine.runner``); Ray only decides where and how many at once. Resource
requests come from the spec: CPUs (and GPUs on CUDA) per tensor-parallel rank, and a
memory estimate that caps concurrency on small machines. ``address`` joins an existing
cluster; without it a local Ray starts and stops with the run.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from harness.paths.base import cuda_available
from harness.plan import ArmPlan
from harness.records import ArmResult


@dataclass(frozen=True)
class FanoutSpec:
    """How arms are spread over Ray."""

    address: str | None = None
    """Ray address to join (``ray://...`` or ``auto``); None starts a local Ray for this run."""
    arm_memory_bytes: int = 4 << 30
    """Memory one arm is expected to use (engine processes included); caps concurrency."""
    max_concurrent: int | None = None
    """Upper bound on arms at once; None lets CPUs and memory decide."""


def arm_resources(arm: ArmPlan, fan: FanoutSpec) -> dict:
    ranks = arm.engine.tensor_parallel_size
    res = {"num_cpus": ranks, "memory": fan.arm_memory_bytes}
    if cuda_available():
        res["num_gpus"] = ranks
    return res


def cpu_thread_env(concurrent: int, tensor_parallel_size: int) -> dict[str, str]:
    """OpenMP placement of CPU engines; every arm of a run gets the same, so numerics match.

    - TP > 1: vLLM's auto binding refuses several ranks on one NUMA node ("Not enough
      allowed NUMA nodes ... bind threads manually"), so the cores are split among ranks
      by hand, e.g. ``0|1`` for TP 2 on 2 cores.
    - Several arms at once: vLLM's auto binding would pin every arm to core 0.
    """
    if cuda_available() or "VLLM_CPU_OMP_THREADS_BIND" in os.environ:
        return {}
    cpus = os.cpu_count() or 1
    if tensor_parallel_size > 1:
        per_rank = max(1, cpus // tensor_parallel_size)
        spans = [(r * per_rank) % cpus for r in range(tensor_parallel_size)]
        return {"VLLM_CPU_OMP_THREADS_BIND": "|".join(f"{a}-{a + per_rank - 1}" if per_rank > 1 else str(a)
                                                      for a in spans)}
    if concurrent <= 1:
        return {}
    return {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": str(max(1, cpus // concurrent))}


def local_concurrency(fan: FanoutSpec) -> int:
    cpus = os.cpu_count() or 1
    try:
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        available = fan.arm_memory_bytes
    n = max(1, min(cpus, available // fan.arm_memory_bytes))
    return min(n, fan.max_concurrent) if fan.max_concurrent else n


class ArmActor:
    """One engine arm as a Ray actor. The engine itself still runs in the arm's own
    process group with a timeout, so a crash or hang cannot take the actor down with it."""

    def run(self, arm: ArmPlan, workdir: Path, env: dict[str, str]) -> ArmResult:
        from harness.engine.runner import run_arm

        return run_arm(arm, workdir, env)


def run_arms(arms: list[ArmPlan], workdir: Path, fan: FanoutSpec, started: Callable[[ArmPlan], None],
             env: dict[str, str]) -> Iterator[tuple[ArmPlan, ArmResult]]:
    """Yield (arm, result) as arms finish; every result is on disk before it is yielded.
    ``env`` (thread placement) is set for every arm alike."""
    import ray

    own_cluster = not ray.is_initialized()
    if own_cluster:
        if fan.address:
            ray.init(address=fan.address, log_to_driver=False)
        else:
            ray.init(num_cpus=os.cpu_count() or 1, include_dashboard=False, log_to_driver=False,
                     object_store_memory=256 << 20)
    try:
        actor_cls = ray.remote(max_restarts=0)(ArmActor)
        pending = {}
        # Longest first: a subject arm refits several times, a cold-B arm observes once, so a
        # subject beside the reference, then the noise arm, saves a round on two slots.
        for arm in sorted(arms, key=lambda a: len(a.steps), reverse=True):
            started(arm)
            actor = actor_cls.options(**arm_resources(arm, fan)).remote()
            pending[actor.run.remote(arm, workdir, env)] = (arm, actor)
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            arm, actor = pending.pop(done[0])
            result = ray.get(done[0])
            ray.kill(actor)
            yield arm, result
    finally:
        if own_cluster:
            ray.shutdown()

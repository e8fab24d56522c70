"""Run independent arms at the same time as Ray actors.

Each actor still runs its arm in an isolated subprocess with a timeout
(``harness.engine.runner``); Ray only decides where and how many at once. Resource
requests come from the spec: CPUs (and GPUs on CUDA) per tensor-parallel rank, and a
memory estimate that caps concurrency on small machines. ``address`` joins an existing
cluster; without it a local Ray starts and stops with the run.
"""

from __future__ import annotations

import os
import signal
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


class InfrastructureError(RuntimeError):
    """Ray (or another piece of the machinery, not an engine) failed: exit 2."""


def local_ray_options() -> dict:
    """``ray.init`` arguments for a Ray that belongs to this run alone.

    - ``address="local"``: always start a new instance; a bare ``ray.init()`` would join a
      ``ray start`` cluster found on the machine (or in ``RAY_ADDRESS``).
    - Node address 127.0.0.1, so that Ray's servers listen on loopback. Measured with Ray 2.60:
      ``_node_ip_address="127.0.0.1"`` alone is silently replaced by the host's address
      (``services.resolve_ip_for_localhost``), and the GCS, raylet and workers then listen on
      every interface (``::``); Ray keeps 127.0.0.1 only where it believes clusters are
      disabled (``ray_constants.ENABLE_RAY_CLUSTER``, from ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER``).
      With both, every Ray server of the run listens on 127.0.0.1 only.
    - Token authentication: Ray >= 2.52 has it, and the installed 2.60 turns it on for a new
      local cluster unless ``RAY_AUTH_MODE`` says otherwise (it logs "Token authentication is
      enabled"). Setting ``RAY_AUTH_MODE=token`` here, after ``import ray``, breaks the driver's
      own connection ("InvalidAuthToken": measured), so the default is left to Ray.
    """
    import ray._private.ray_constants as ray_constants

    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # for Ray processes importing it afresh
    ray_constants.ENABLE_RAY_CLUSTER = False  # read at call time by services.get_node_ip_address
    return {"address": "local", "_node_ip_address": "127.0.0.1", "include_dashboard": False}


def start_local_ray(ray) -> None:
    """A local Ray for this run. Ray waits a fixed 30 s for its raylet to register
    (``node.py``); on a loaded machine (seen here at load 20 on 2 cores) the raylet can take
    longer and the start fails. One more try costs nothing when the first one works."""
    options = dict(num_cpus=os.cpu_count() or 1, log_to_driver=False, object_store_memory=256 << 20,
                   **local_ray_options())
    try:
        ray.init(**options)
    except Exception as exc:  # noqa: BLE001 - Ray raises a bare Exception here
        if "timed out during startup" not in str(exc):
            raise
        ray.shutdown()
        ray.init(**options)


def check_ray_address(address: str | None, allow_remote: bool) -> None:
    """A Ray address off this machine runs our arms (and their engines) elsewhere, and Ray's
    control plane trusts whoever reaches it: joining one must be asked for explicitly."""
    import ipaddress
    import socket
    from urllib.parse import urlsplit

    if not address or address in ("auto", "local") or allow_remote:
        return
    host = urlsplit(address if "://" in address else f"ray://{address}").hostname or ""
    try:
        loopback = all(ipaddress.ip_address(info[4][0]).is_loopback
                       for info in socket.getaddrinfo(host, None))
    except (OSError, ValueError):
        loopback = False
    if not loopback:
        raise ValueError(f"--ray-address {address} is not on this machine; pass --allow-remote-ray to join it")


def restore_signal_handlers() -> None:
    """``ray.init`` replaces the driver's SIGTERM handler with ``sys.exit``; put ours back so
    a cancelled run still stops its arms and writes its report (see ``harness.cli``)."""
    from harness import interrupts

    interrupts.install()


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

    def run(self, arm: ArmPlan, workdir: Path, env: dict[str, str], key: str = "") -> ArmResult:
        from harness.engine.runner import run_arm

        return run_arm(arm, workdir, env, key)


def run_arms(arms: list[ArmPlan], workdir: Path, fan: FanoutSpec, started: Callable[[ArmPlan], None],
             keys: dict[str, str] | None = None) -> Iterator[tuple[ArmPlan, ArmResult]]:
    """Yield (arm, result) as arms finish; every result is on disk before it is yielded.
    ``keys`` stamps each result with what it was measured with (see ``--resume``)."""
    import ray

    from harness.engine.runner import store_error

    own_cluster = not ray.is_initialized()
    if own_cluster:
        try:
            if fan.address:
                ray.init(address=fan.address, log_to_driver=False)
            else:
                start_local_ray(ray)
        except SystemExit as exc:  # ray.init's own SIGTERM handler (sys.exit) fired before ours was back
            from harness.interrupts import Interrupted

            if exc.code == signal.SIGTERM:
                raise Interrupted(signal.SIGTERM) from None
            raise
        except Exception as exc:  # noqa: BLE001 - Ray raises many kinds; the run cannot go on
            raise InfrastructureError(f"Ray did not start ({'address ' + fan.address if fan.address else 'local'}): "
                                      f"{type(exc).__name__}: {str(exc)[:300]}") from exc
        restore_signal_handlers()
    try:
        concurrent = local_concurrency(fan) if not fan.address else len(arms)
        env = cpu_thread_env(min(concurrent, len(arms)), arms[0].engine.tensor_parallel_size)
        actor_cls = ray.remote(max_restarts=0)(ArmActor)
        # Longest first: a subject arm refits several times, a cold-B arm observes once, so a
        # subject beside the reference, then the noise arm, saves a round on two slots. Arms
        # wait here, not in Ray's queue, so the ones not started yet can be cancelled.
        queue = sorted(arms, key=lambda a: len(a.steps), reverse=True)
        pending = {}
        while queue or pending:
            while queue and len(pending) < concurrent:
                arm = queue.pop(0)
                started(arm)
                actor = actor_cls.options(**arm_resources(arm, fan)).remote()
                pending[actor.run.remote(arm, workdir, env, (keys or {}).get(arm.name, ""))] = (arm, actor)
            done, _ = ray.wait(list(pending), num_returns=1)
            arm, actor = pending.pop(done[0])
            try:
                result = ray.get(done[0])
            except ray.exceptions.RayError as exc:  # the actor (or its node) died under the arm
                result = store_error(arm, workdir, f"the Ray actor running this arm died: {type(exc).__name__}: "
                                                   f"{str(exc).splitlines()[0][:300]}", (keys or {}).get(arm.name, ""))
            ray.kill(actor)
            yield arm, result
            if arm.role == "reference" and not result.observations:
                for queued in queue:
                    yield queued, store_error(queued, workdir, f"cancelled: the reference arm (cold B) failed to "
                                                               f"start, so nothing could be judged: {result.error}",
                                              (keys or {}).get(queued.name, ""))
                queue.clear()
    finally:
        from harness.engine.runner import kill_recorded_groups

        kill_recorded_groups(workdir)  # arms still running (the run was cancelled): before their actors go
        if own_cluster:
            ray.shutdown()

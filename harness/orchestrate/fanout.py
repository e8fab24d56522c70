"""Run independent arms at the same time as Ray actors.

Each actor still runs its arm in an isolated subprocess with a timeout
(``harness.orchestrate.runner``); Ray only decides where and how many at once. Resource
requests come from the spec: CPUs (and GPUs on CUDA) per tensor-parallel rank, a
memory estimate that caps concurrency on small machines, and any custom resources that
pin arms to nodes. ``address`` joins an existing cluster; without it a local Ray starts
and stops with the run (``address="local"``: never someone else's cluster).

Nothing is read from a shared disk: an actor runs its arm in a scratch directory on its
own node and returns the result and the arm's log through Ray's object store; the parent
writes them into the report directory. Checkpoints reach a node in one of two ways
(``FanoutSpec.stage_checkpoints``):
- shared storage: the checkpoint directories are on a path every node sees (NFS, a
  mounted bucket); nothing is copied. The default for a local Ray.
- staging: the parent puts each checkpoint file into the object store in chunks, and the
  first arm on a node writes them under that node's stage directory
  (``REFIT_HARNESS_STAGE_DIR``, default ``<tmp>/refit-harness-stage``), keyed by content,
  so later arms on the node find them there. The default with ``--ray-address``. It costs
  object-store memory of one checkpoint set; with large models prefer shared storage.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from harness.device import cuda_available
from harness.errors import InfrastructureError
from harness.plan import ArmPlan
from harness.ray_local import init_local_ray
from harness.records import ArmResult
from harness.settings import STAGE_DIR_ENV
from harness.spec.transfer import arm_gpus


@dataclass(frozen=True)
class FanoutSpec:
    """How arms are spread over Ray (or over this machine's CPUs without it)."""

    address: str | None = None
    """Ray address to join (``ray://...`` or ``auto``); None starts a local Ray for this run."""
    arm_memory_bytes: int = 4 << 30
    """Memory one arm is expected to use (engine processes included); caps concurrency."""
    max_concurrent: int | None = None
    """Upper bound on arms at once; None lets CPUs and memory decide."""
    custom_resources: tuple[tuple[str, float], ...] = ()
    """Ray custom resources each arm requests, e.g. ``(("refit_worker", 1),)`` to pin arms to
    the nodes that offer it."""
    stage_checkpoints: bool | None = None
    """Copy checkpoints to each node through the object store; None: only when joining a cluster."""
    ray: bool = True
    """Arms as Ray actors; False: as processes of this machine, without Ray
    (``harness.orchestrate.processes``: same limits, none of a local Ray's start-up)."""


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
        loopback = all(ipaddress.ip_address(info[4][0]).is_loopback for info in socket.getaddrinfo(host, None))
    except (OSError, ValueError):
        loopback = False
    if not loopback:
        raise ValueError(f"--ray-address {address} is not on this machine; pass --allow-remote-ray to join it")


def restore_signal_handlers() -> None:
    """``ray.init`` replaces the driver's SIGTERM handler with ``sys.exit``; put ours back so
    a cancelled run still stops its arms and writes its report (see ``harness.cli.main``)."""
    from harness.orchestrate import interrupts

    interrupts.install()


def arm_resources(arm: ArmPlan, fan: FanoutSpec, cuda: bool | None = None) -> dict[str, Any]:
    """Ray resources of the actor running ``arm``. On CUDA it holds every GPU its engine and a
    transfer trainer need: the arm starts its own Ray for a Ray engine, and that Ray sees only
    the arm's GPUs (``harness.spec.transfer``); ``cuda``: None asks this machine."""
    ranks = arm.engine.tensor_parallel_size
    res: dict[str, Any] = {"num_cpus": ranks, "memory": fan.arm_memory_bytes}
    if fan.custom_resources:
        res["resources"] = dict(fan.custom_resources)
    if cuda_available() if cuda is None else cuda:
        res["num_gpus"] = arm_gpus(ranks, arm.requirements.weight_transfer_backend)
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
        return {
            "VLLM_CPU_OMP_THREADS_BIND": "|".join(f"{a}-{a + per_rank - 1}" if per_rank > 1 else str(a) for a in spans)
        }
    if concurrent <= 1:
        return {}
    return {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": str(max(1, cpus // concurrent))}


def available_memory(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """Bytes a new process can have without swapping: Linux's ``MemAvailable``, which counts the
    page cache the kernel gives back. Free pages alone (``SC_AVPHYS_PAGES``) are not that: on a
    machine whose page cache has filled (this one after an hour: 4 GiB free of 21.5 GiB available)
    they allowed one arm at a time where the CPUs hold two. None where neither can be read."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return None


def local_concurrency(fan: FanoutSpec) -> int:
    """Arms at once on this machine: its CPUs, what its available memory holds at
    ``fan.arm_memory_bytes`` each, and ``fan.max_concurrent``."""
    cpus = os.cpu_count() or 1
    available = available_memory()
    if available is None:
        available = fan.arm_memory_bytes
    n = max(1, min(cpus, available // fan.arm_memory_bytes))
    return min(n, fan.max_concurrent) if fan.max_concurrent else n


SCRATCH = "<arm scratch>"
_STAGE_CHUNK_BYTES = 64 << 20


class ArmActor:
    """One engine arm as a Ray actor. The engine itself still runs in the arm's own
    process group with a timeout, so a crash or hang cannot take the actor down with it."""

    def run(
        self, arm: ArmPlan, env: dict[str, str], staged: dict | None, workdir: Path | None, key: str = ""
    ) -> tuple[ArmResult, str]:
        """Run ``arm`` in ``workdir`` (a local Ray: the logs grow where the user looks) or, on a
        cluster (None), in a scratch directory on this node; return its result and log text.
        ``key`` stamps the result with what it was measured with (see ``--resume``)."""
        import shutil
        import tempfile
        from dataclasses import replace

        import ray

        from harness.orchestrate.runner import run_arm
        from harness.run_dir import RunDir

        if staged is not None:
            arm = replace(arm, checkpoints=stage_on_this_node(arm.checkpoints, staged))
        scratch = workdir or Path(tempfile.mkdtemp(prefix=f"refit-arm-{arm.name}-"))
        try:
            result = run_arm(arm, scratch, env, key)
            log = RunDir(scratch).arm(arm).log
            text = log.read_text(errors="replace") if log.exists() else ""
        finally:
            if workdir is None:
                shutil.rmtree(scratch, ignore_errors=True)
        node = ray.get_runtime_context().get_node_id()
        result = replace(
            result,
            environment=result.environment + (("ray_node", node),),
            error=result.error.replace(str(scratch), SCRATCH) if result.error else None,
        )
        return result, text


STAGED_CHECKPOINTS = ("a", "b", "b_control", "b_without_control", "b_damaged")
"""``CheckpointSet`` fields staged on a node, where set."""


def stage_refs(directory: str) -> tuple[str, dict[str, list]]:
    """(content fingerprint, {relative file: [object refs of its chunks]}) of a checkpoint
    directory, read one chunk at a time: the parent never holds a whole file."""
    import ray

    from harness.orchestrate.reference import content_fingerprint

    root = Path(directory)
    files = {}
    for f in sorted(p for p in root.rglob("*") if p.is_file()):
        with open(f, "rb") as fh:
            files[str(f.relative_to(root))] = [
                ray.put(chunk) for chunk in iter(lambda: fh.read(_STAGE_CHUNK_BYTES), b"")
            ]
    return content_fingerprint(root), files


def stage_on_this_node(cs, staged: dict):
    """Write the staged checkpoints under this node's stage directory (once per content)
    and return the checkpoint set pointing there."""
    import os
    import tempfile
    from dataclasses import replace

    import ray

    from harness.cache import cached_variant

    root = Path(os.environ.get(STAGE_DIR_ENV) or Path(tempfile.gettempdir()) / "refit-harness-stage")
    moved = {}
    for field, (fingerprint, files) in staged.items():

        def make(staging: Path, files=files) -> None:
            for name, chunks in files.items():
                (staging / name).parent.mkdir(parents=True, exist_ok=True)
                with open(staging / name, "wb") as fh:
                    for ref in chunks:
                        fh.write(ray.get(ref))

        # Once per content on a node: arms of concurrent runs wait for one writer, then reuse it.
        moved[field] = str(cached_variant(root / fingerprint, make))
    return replace(cs, **moved)


def run_arms(
    arms: list[ArmPlan],
    workdir: Path,
    fan: FanoutSpec,
    started: Callable[[ArmPlan], None],
    env: dict[str, str],
    keys: dict[str, str] | None = None,
) -> Iterator[tuple[ArmPlan, ArmResult]]:
    """Yield (arm, result) as arms finish; every result is on disk before it is yielded.
    ``env`` (thread placement) is set for every arm alike; ``keys`` stamps each result with
    what it was measured with (see ``--resume``)."""
    import ray

    from harness import store
    from harness.orchestrate.runner import store_error
    from harness.run_dir import RunDir

    own_cluster = not ray.is_initialized()
    if own_cluster:
        try:
            if fan.address:
                ray.init(address=fan.address, log_to_driver=False)
            else:
                init_local_ray(ray, num_cpus=os.cpu_count() or 1, log_to_driver=False, object_store_memory=256 << 20)
        except SystemExit as exc:  # ray.init's own SIGTERM handler (sys.exit) fired before ours was back
            from harness.orchestrate.interrupts import Interrupted

            if exc.code == signal.SIGTERM:
                raise Interrupted(signal.SIGTERM) from None
            raise
        except Exception as exc:
            raise InfrastructureError(
                f"Ray did not start ({'address ' + fan.address if fan.address else 'local'}): "
                f"{type(exc).__name__}: {str(exc)[:300]}"
            ) from exc
        restore_signal_handlers()
    try:
        stage = fan.address is not None if fan.stage_checkpoints is None else fan.stage_checkpoints
        staged = None
        if stage:
            cs = arms[0].checkpoints
            staged = {field: stage_refs(getattr(cs, field)) for field in STAGED_CHECKPOINTS if getattr(cs, field)}
        actor_cls = ray.remote(max_restarts=0)(ArmActor)
        # Longest first: a subject arm refits several times, a cold-B arm observes once, so a
        # subject beside the reference, then the noise arm, saves a round on two slots. Arms
        # wait here, not in Ray's queue, so the ones not started yet can be cancelled.
        concurrent = local_concurrency(fan) if not fan.address else len(arms)
        queue = sorted(arms, key=lambda a: len(a.steps), reverse=True)
        pending: dict[Any, tuple[ArmPlan, Any]] = {}
        node_gpus = max((n["Resources"].get("GPU", 0.0) for n in ray.nodes() if n.get("Alive")), default=0.0)
        while queue or pending:
            while queue and len(pending) < concurrent:
                arm = queue.pop(0)
                started(arm)
                store.dump(arm, RunDir(workdir).arm(arm).plan, "arm_plan")
                resources = arm_resources(arm, fan)
                if resources.get("num_gpus", 0) > node_gpus:
                    # Ray would keep an infeasible actor pending forever, and the run with it.
                    yield (
                        arm,
                        store_error(
                            arm,
                            workdir,
                            f"cannot be placed: the arm needs {resources['num_gpus']:g} GPUs on one node "
                            f"(engine TP {arm.engine.tensor_parallel_size} and its trainer); the largest node of the "
                            f"Ray cluster has {node_gpus:g}",
                            (keys or {}).get(arm.name, ""),
                        ),
                    )
                    continue
                actor: Any = actor_cls.options(**resources).remote()
                run = actor.run.remote(
                    arm, env, staged, None if fan.address else workdir, (keys or {}).get(arm.name, "")
                )
                pending[run] = (arm, actor)
            if not pending:
                continue
            done, _ = ray.wait(list(pending), num_returns=1)
            arm, actor = pending.pop(done[0])
            try:
                result, log = ray.get(done[0])
            except ray.exceptions.RayError as exc:  # the actor (or its node) died under the arm
                result, log = (
                    store_error(
                        arm,
                        workdir,
                        f"the Ray actor running this arm died: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}",
                        (keys or {}).get(arm.name, ""),
                    ),
                    None,
                )
            ray.kill(actor)
            files = RunDir(workdir).arm(arm)
            result_file, log_file = files.result, files.log
            if log is not None:
                log_file.write_text(log)
            if result.error:  # name the log the parent wrote, not the node's scratch copy
                result = replace(result, error=result.error.replace(SCRATCH, str(workdir)))
            store.dump(result, result_file, "arm_result")
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
                            (keys or {}).get(queued.name, ""),
                        ),
                    )
                queue.clear()
    finally:
        from harness.orchestrate.runner import kill_recorded_groups

        kill_recorded_groups(workdir)  # arms still running (the run was cancelled): before their actors go
        if own_cluster:
            ray.shutdown()

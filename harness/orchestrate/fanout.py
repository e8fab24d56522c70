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


def start_ray(fan: FanoutSpec) -> None:
    """Join ``fan.address``, or start a local Ray of this run's own; our signal handlers back after."""
    import ray

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


class RayExecutor:
    """Arms as Ray actors: the ``Executor`` of ``harness.orchestrate.schedule`` for ``--executor
    ray``. Arms wait in the scheduler's queue, not in Ray's, so the ones not started yet can be
    cancelled; every result (and log) is on disk before ``wait`` returns it."""

    def __init__(self, workdir: Path, fan: FanoutSpec, env: dict[str, str], keys: dict[str, str]) -> None:
        self.workdir = workdir
        self.fan = fan
        self.env = env
        """Thread placement, set for every arm alike."""
        self.keys = keys
        """Each arm's key, stamped on its result (see ``--resume``)."""
        self._pending: dict[Any, tuple[ArmPlan, Any]] = {}
        self._own_cluster = False
        self._staged: dict | None = None
        self._node_gpus = 0.0
        self._concurrent: int | None = 1
        self._actor_cls: Any = None
        self._staging = fan.address is not None if fan.stage_checkpoints is None else fan.stage_checkpoints

    def __enter__(self) -> RayExecutor:
        import ray

        self._own_cluster = not ray.is_initialized()
        if self._own_cluster:
            start_ray(self.fan)
        try:
            self._actor_cls = ray.remote(max_restarts=0)(ArmActor)
            # A cluster of its own size: as many at once as it places; here, what this machine holds.
            self._concurrent = None if self.fan.address else local_concurrency(self.fan)
            alive = [n for n in ray.nodes() if n.get("Alive")]
            self._node_gpus = max((n["Resources"].get("GPU", 0.0) for n in alive), default=0.0)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        import ray

        from harness.orchestrate.runner import kill_recorded_groups

        kill_recorded_groups(self.workdir)  # arms still running (the run was cancelled): before their actors go
        if self._own_cluster:
            ray.shutdown()

    def order(self, arms: list[ArmPlan]) -> list[ArmPlan]:
        # Longest first: a subject arm refits several times, a cold-B arm observes once, so a
        # subject beside the reference, then the noise arm, saves a round on two slots.
        return sorted(arms, key=lambda a: len(a.steps), reverse=True)

    def has_room(self, arm: ArmPlan) -> bool:
        return self._concurrent is None or len(self._pending) < self._concurrent

    def launch(self, arm: ArmPlan) -> ArmResult | None:
        from harness import store
        from harness.orchestrate.runner import store_error
        from harness.run_dir import RunDir

        if self._staging and self._staged is None:  # once, from the first arm's checkpoints
            cs = arm.checkpoints
            self._staged = {f: stage_refs(getattr(cs, f)) for f in STAGED_CHECKPOINTS if getattr(cs, f)}
        store.dump(arm, RunDir(self.workdir).arm(arm).plan, "arm_plan")
        resources = arm_resources(arm, self.fan)
        key = self.keys.get(arm.name, "")
        if resources.get("num_gpus", 0) > self._node_gpus:
            # Ray would keep an infeasible actor pending forever, and the run with it.
            message = (
                f"cannot be placed: the arm needs {resources['num_gpus']:g} GPUs on one node (engine TP "
                f"{arm.engine.tensor_parallel_size} and its trainer); the largest node of the Ray cluster "
                f"has {self._node_gpus:g}"
            )
            return store_error(arm, self.workdir, message, key)
        actor: Any = self._actor_cls.options(**resources).remote()
        workdir = None if self.fan.address else self.workdir
        self._pending[actor.run.remote(arm, self.env, self._staged, workdir, key)] = (arm, actor)
        return None

    def running(self) -> bool:
        return bool(self._pending)

    def wait(self) -> list[tuple[ArmPlan, ArmResult]]:
        import ray

        done, _ = ray.wait(list(self._pending), num_returns=1)
        arm, actor = self._pending.pop(done[0])
        try:
            result, log = ray.get(done[0])
        except ray.exceptions.RayError as exc:  # the actor (or its node) died under the arm
            from harness.orchestrate.runner import store_error

            message = f"the Ray actor running this arm died: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
            result, log = store_error(arm, self.workdir, message, self.keys.get(arm.name, "")), None
        ray.kill(actor)
        return [(arm, self._store(arm, result, log))]

    def _store(self, arm: ArmPlan, result: ArmResult, log: str | None) -> ArmResult:
        """The result and log an actor sent back, written into the run directory."""
        from harness import store
        from harness.run_dir import RunDir

        files = RunDir(self.workdir).arm(arm)
        if log is not None:
            files.log.write_text(log)
        if result.error:  # name the log the parent wrote, not the node's scratch copy
            result = replace(result, error=result.error.replace(SCRATCH, str(self.workdir)))
        store.dump(result, files.result, "arm_result")
        return result

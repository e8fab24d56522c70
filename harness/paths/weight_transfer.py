"""Weight transfer through vLLM's API, trainer in a Ray actor beside the engine actor.

One class per backend. They share everything up to the transport: the engine actor
built with ``WeightTransferConfig(backend=...)``, the trainer actor built by vLLM's
``WeightTransferTrainerFactory`` with a ``WeightSource`` over the checkpoint, and
vLLM's ``RayVLLMWeightSyncClient``. ``gloo`` runs on the CPU; the others need CUDA.
"""

from __future__ import annotations

from typing import Any, ClassVar

from harness.device import cuda_available
from harness.paths import reload_path
from harness.paths.base import ReloadPath
from harness.spec.requirements import EngineRequirements
from harness.spec.transfer import BACKENDS, RAY_NAMESPACE, arm_gpus, layout


class WeightTransferPath(ReloadPath):
    backend: ClassVar[str]
    """vLLM weight-transfer backend name (``harness.spec.transfer.BACKENDS``)."""

    sabotage = "the positive-control tensor left out of the update the trainer sends"

    def __init__(self, checkpoints, prompts=None) -> None:
        super().__init__(checkpoints, prompts)
        self.trainers: list = []

    @classmethod
    def unavailable_reason(cls, cuda: bool | None = None, packages: bool = True) -> str | None:
        reason = super().unavailable_reason(cuda, packages)
        if reason or not packages:
            return reason
        missing = missing_packages(cls.backend)
        if missing:
            return (
                f"{cls.name} needs {', '.join(d for d, _ in missing)} ({'; '.join(w for _, w in missing)}), which "
                f"vLLM does not install: pip install 'refit-harness[gpu-full]'"
            )
        return None

    @classmethod
    def gpus_needed(cls, tensor_parallel_size: int) -> int:
        return arm_gpus(tensor_parallel_size, cls.backend)

    def trainer_fields(self, world_size: int, rank: int = 0) -> dict[str, Any]:
        """Fields of the backend's TrainerInitInfo for trainer ``rank`` (rank 0 is the sender).
        vLLM's NCCL trainers bind the port they are given themselves, so it can only be picked
        free beforehand."""
        from harness.loopback import free_port

        return {"rank": rank, "master_address": "127.0.0.1", "master_port": free_port(), "world_size": world_size}

    def refit(self, engine, checkpoint_dir, target, exclude: tuple[str, ...] = ()):
        import ray

        if not self.trainers:
            self.trainers = self._connect(engine)
        ray.get([t.send.remote(checkpoint_dir, exclude) for t in self.trainers])

    def sabotaged_refit(self, engine, target):
        self.refit(engine, self.checkpoints.directory(target), target, exclude=(self.left_out,))

    def _connect(self, engine) -> list:
        """Start the trainer ranks where the layout puts them, and rendezvous with the engine."""
        import ray

        from harness.loopback import HOST, free_port
        from harness.machinery.placement import trainer_actor_options, wait_placed
        from harness.machinery.transfer import TrainerActor

        ranks = len(engine.rpc("refit_harness_ping"))
        placed = layout(self.backend, ranks, cuda_available())
        world = 1 + ranks  # the NCCL-style groups: trainer rank 0, then the workers
        actor_cls = ray.remote(TrainerActor)
        trainers = []
        try:
            for slot in placed.trainers:
                # Segments start at A; a sparse trainer diffs against what the engine holds.
                fields = self.trainer_fields(world, slot.rank)
                actor = actor_cls.options(
                    **trainer_actor_options(slot, getattr(engine, "placement_group", None))
                ).remote(engine.actor, fields, self.backend, self.checkpoints.a)
                trainers.append(actor)
                wait_placed(ray, actor, f"{self.name}: trainer rank {slot.rank}", slot.gpus)
            if len(trainers) > 1:
                port = free_port()
                ray.get([t.join_group.remote(HOST, port, i, len(trainers)) for i, t in enumerate(trainers)])
            ray.get([t.connect.remote() for t in trainers])
        except BaseException:
            for t in trainers:
                ray.kill(t)
            raise
        return trainers

    def close(self) -> None:
        if self.trainers:
            import ray

            try:
                ray.get([t.shutdown.remote() for t in self.trainers], timeout=30)
            finally:
                for t in self.trainers:
                    ray.kill(t)
                self.trainers = []


def missing_packages(backend: str) -> list[tuple[str, str]]:
    """The backend's packages vLLM does not install that are missing here (looked up by
    distribution name, without importing them)."""
    import importlib.metadata

    missing = []
    for dist, why in BACKENDS[backend].packages:
        try:
            importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            missing.append((dist, why))
    return missing


NCCL_WHEELS = ("nvidia-nccl-cu13", "nvidia-nccl-cu12")
"""The NCCL library wheels (``nccl-extensions[cu13]`` / ``[cu12]`` pull them; torch's CUDA wheels too)."""


def nccl_library() -> tuple[str, str] | None:
    """``(version, path of libnccl.so.2)`` of the newest installed NCCL wheel, or None."""
    import importlib.metadata

    from packaging.version import Version

    found = []
    for dist in NCCL_WHEELS:
        try:
            meta = importlib.metadata.distribution(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
        lib = next((f for f in meta.files or () if f.name.startswith("libnccl.so")), None)
        if lib is not None:
            found.append((Version(meta.version), meta.version, str(lib.locate())))
    return max(found)[1:] if found else None


def nccl_library_problem(backend: str, env: dict[str, str]) -> str | None:
    """Why the backend's NCCL-linked library would not load with ``env`` (``VLLM_NCCL_SO_PATH``
    unset or missing, no NCCL wheel, or one older than the backend needs), with the fix; None
    when it would (or the backend links none)."""
    import os

    from packaging.version import Version

    need = BACKENDS[backend].nccl
    if need is None:
        return None
    lib = nccl_library()
    if lib is None or Version(lib[0]) < Version(need):
        have = f"NCCL {lib[0]}" if lib else "no NCCL wheel"
        return (
            f"needs NCCL >= {need} ({' or '.join(NCCL_WHEELS)}); {have} here: install nccl-extensions[cu12] or "
            "[cu13], the one matching torch's CUDA"
        )
    given = env.get("VLLM_NCCL_SO_PATH")
    if not given or not os.path.exists(given):
        return (
            f"VLLM_NCCL_SO_PATH {'is not set' if not given else given + ' does not exist'}: vLLM must load the "
            f"libnccl that libnccl_m2n was linked against (NCCL {lib[0]}: VLLM_NCCL_SO_PATH={lib[1]})"
        )
    return None


def _transfer(backend: str, *, cuda: bool, what: str, fields=None) -> type[WeightTransferPath]:
    """One path class per backend; ``fields`` overrides the trainer init fields when the
    backend's TrainerInitInfo is not the NCCL-style (address, port, world size) one."""
    attrs = {
        "name": f"transfer_{backend}",
        "backend": backend,
        "device": "cuda" if cuda else "any",
        "requirements": EngineRequirements(kind="ray_llm", weight_transfer_backend=backend),
        "exercises": f"weight transfer, backend '{backend}': {what}",
    }
    if fields is not None:
        attrs["trainer_fields"] = lambda self, world_size, rank=0: fields(world_size, rank)
    if BACKENDS[backend].fixed_metadata:
        attrs["sabotage"] = (
            "the positive-control tensor sent with the value the engine already holds (this trainer fixes its "
            "tensor list at init, so a round cannot leave one out)"
        )
    return reload_path(
        type("Transfer" + "".join(w.capitalize() for w in backend.split("_")), (WeightTransferPath,), attrs)
    )


TransferGloo = _transfer(
    "gloo",
    cuda=False,
    what=(
        "the harness's CPU twin of nccl (stateless gloo group on loopback), receiving through the same layerwise "
        "lifecycle: start_weight_update -> update_weights -> model.load_weights -> finish_weight_update"
    ),
    # Port 0: the trainer binds first and hands the kernel-picked port to the workers.
    fields=lambda world_size, rank: {
        "rank": rank,
        "master_address": "127.0.0.1",
        "master_port": 0,
        "world_size": world_size,
    },
)
TransferNccl = _transfer("nccl", cuda=True, what="dense NCCL broadcast from the trainer, layerwise reload on receive")
TransferSparseNccl = _transfer(
    "sparse_nccl", cuda=True, what="sparse patches (changed elements only) over NCCL, applied in place"
)
TransferNcclM2n = _transfer("nccl_m2n", cuda=True, what="M-to-N resharding over NCCL")
TransferIpc = _transfer(
    "ipc",
    cuda=True,
    what="CUDA IPC handles to the tensors of a trainer rank colocated on each worker's GPU",
    fields=lambda world_size, rank: {"rank": rank},
)
TransferShardedRdt = _transfer(
    "sharded_rdt",
    cuda=True,
    what="consumers pull sharded tensors over Ray direct transport",
    # The workers find the trainer's serve actor by name, in the namespace of the arm's Ray.
    fields=lambda world_size, rank: {
        "rank": rank,
        "num_consumers": world_size - 1,
        "trainer_actor_namespace": RAY_NAMESPACE,
    },
)


@reload_path
class EncoderCacheReset(TransferGloo):  # type: ignore[valid-type,misc]
    name = "encoder_cache"
    exercises = (
        "a vision-language model refit as an RL framework must refit it: the image prompts served right before "
        "transfer_gloo's update, then the engine's encoder cache reset (LLMEngine.reset_encoder_cache). vLLM "
        "leaves that reset to the caller after a weight update (vllm #45093 made it automatic; #46125 reverted it)"
    )
    requirements = EngineRequirements(kind="ray_llm", weight_transfer_backend="gloo", apart="encoder_cache")
    sabotage = "the update without the encoder-cache reset: the old vision tower's embeddings stay servable"
    sabotage_evidence = "encoder_cache"
    needs_images = True

    def refit(self, engine, checkpoint_dir, target, exclude: tuple[str, ...] = (), reset: bool = True):
        engine.generate(self.prompts)  # the images embedded by the weights before the refit
        super().refit(engine, checkpoint_dir, target, exclude)
        if reset:
            engine.reset_encoder_cache()

    def sabotaged_refit(self, engine, target):
        self.refit(engine, self.checkpoints.directory(target), target, reset=False)

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


def gpu_shares(backend: str | None, tensor_parallel_size: int, cuda: bool) -> tuple[float, float]:
    """GPUs Ray gives the engine actor and the trainer actor. Ray hides CUDA from an actor
    that requests none, so on CUDA both must ask. CUDA IPC shares device memory between
    the two, so they split one GPU; the NCCL-style backends give the trainer its own."""
    if not cuda:
        return 0.0, 0.0
    if backend == "ipc" and tensor_parallel_size == 1:
        return 0.5, 0.5
    return float(tensor_parallel_size), 1.0


class WeightTransferPath(ReloadPath):
    backend: ClassVar[str]
    """vLLM weight-transfer backend name."""

    sabotage = "the positive-control tensor left out of the update the trainer sends"

    def __init__(self, checkpoints, prompts=None) -> None:
        super().__init__(checkpoints, prompts)
        self.trainer = None

    def trainer_fields(self, world_size: int) -> dict[str, Any]:
        """Fields of the backend's TrainerInitInfo (rank 0 is the sender). vLLM's NCCL trainers
        bind the port they are given themselves, so it can only be picked free beforehand."""
        from harness.loopback import free_port

        return {"rank": 0, "master_address": "127.0.0.1", "master_port": free_port(), "world_size": world_size}

    def refit(self, engine, checkpoint_dir, target, exclude: tuple[str, ...] = ()):
        import ray

        if self.trainer is None:
            self.trainer = self._connect(engine)
        ray.get(self.trainer.send.remote(checkpoint_dir, exclude))

    def sabotaged_refit(self, engine, target):
        self.refit(engine, self.checkpoints.directory(target), target, exclude=(self.left_out,))

    def _connect(self, engine):
        import ray

        from harness.arm.transfer import TrainerActor

        ranks = len(engine.rpc("refit_harness_ping"))
        fields = self.trainer_fields(1 + ranks)
        _, gpus = gpu_shares(self.backend, ranks, cuda_available())
        # Segments start at A; a sparse trainer diffs against what the engine holds.
        trainer = ray.remote(num_cpus=0, num_gpus=gpus)(TrainerActor).remote(
            engine.actor, fields, self.backend, self.checkpoints.a
        )
        ray.get(trainer.connect.remote())
        return trainer

    def close(self) -> None:
        if self.trainer is not None:
            import ray

            try:
                ray.get(self.trainer.shutdown.remote(), timeout=30)
            finally:
                ray.kill(self.trainer)
                self.trainer = None


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
        attrs["trainer_fields"] = lambda self, world_size: fields(world_size)
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
    fields=lambda world_size: {"rank": 0, "master_address": "127.0.0.1", "master_port": 0, "world_size": world_size},
)
TransferNccl = _transfer("nccl", cuda=True, what="dense NCCL broadcast from the trainer, layerwise reload on receive")
TransferSparseNccl = _transfer(
    "sparse_nccl", cuda=True, what="sparse patches (changed elements only) over NCCL, applied in place"
)
TransferNcclM2n = _transfer("nccl_m2n", cuda=True, what="M-to-N resharding over NCCL")
TransferIpc = _transfer(
    "ipc", cuda=True, what="CUDA IPC handles to a colocated trainer's tensors", fields=lambda world_size: {"rank": 0}
)
TransferShardedRdt = _transfer(
    "sharded_rdt",
    cuda=True,
    what="consumers pull sharded tensors over Ray direct transport",
    fields=lambda world_size: {"rank": 0, "num_consumers": world_size - 1},
)

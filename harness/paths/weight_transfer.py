"""Weight transfer through vLLM's API, trainer in a Ray actor beside the engine actor.

One class per backend. They share everything up to the transport: the engine actor
built with ``WeightTransferConfig(backend=...)``, the trainer actor built by vLLM's
``WeightTransferTrainerFactory`` with a ``WeightSource`` over the checkpoint, and
vLLM's ``RayVLLMWeightSyncClient``. ``gloo`` runs on the CPU; the others need CUDA.
"""

from __future__ import annotations

from typing import Any, ClassVar

from harness.paths.base import EngineRequirements, ReloadPath


class WeightTransferPath(ReloadPath):
    backend: ClassVar[str]
    """vLLM weight-transfer backend name."""

    def __init__(self, checkpoints) -> None:
        super().__init__(checkpoints)
        self.trainer = None

    def trainer_fields(self, port: int, world_size: int) -> dict[str, Any]:
        """Fields of the backend's TrainerInitInfo (rank 0 is the sender)."""
        return {"rank": 0, "master_address": "127.0.0.1", "master_port": port, "world_size": world_size}

    def refit(self, engine, checkpoint_dir, target):
        import ray

        if self.trainer is None:
            self.trainer = self._connect(engine)
        ray.get(self.trainer.send.remote(checkpoint_dir))

    def _connect(self, engine):
        import ray

        from harness.engine.transfer import TrainerActor, free_loopback_port

        ranks = len(engine.rpc("refit_harness_ping"))
        fields = self.trainer_fields(free_loopback_port(), 1 + ranks)
        # Segments start at A; a sparse trainer diffs against what the engine holds.
        trainer = ray.remote(num_cpus=0)(TrainerActor).remote(engine.actor, fields, self.backend, self.checkpoints.a)
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


def _transfer(backend: str, *, cuda: bool, what: str) -> type[WeightTransferPath]:
    attrs = {
        "name": f"transfer_{backend}", "backend": backend, "device": "cuda" if cuda else "any",
        "requirements": EngineRequirements(kind="ray_llm", weight_transfer_backend=backend),
        "exercises": f"weight transfer, backend '{backend}': {what}",
    }
    return type(f"Transfer{backend.title().replace('_', '')}", (WeightTransferPath,), attrs)


TransferGloo = _transfer("gloo", cuda=False, what=(
    "the harness's CPU twin of nccl (stateless gloo group on loopback), receiving through the same layerwise "
    "lifecycle: start_weight_update -> update_weights -> model.load_weights -> finish_weight_update"))
TransferNccl = _transfer("nccl", cuda=True, what="dense NCCL broadcast from the trainer, layerwise reload on receive")
TransferSparseNccl = _transfer("sparse_nccl", cuda=True, what="sparse patches (changed elements only) over NCCL, applied in place")
TransferNcclM2n = _transfer("nccl_m2n", cuda=True, what="M-to-N resharding over NCCL")


class TransferIpc(WeightTransferPath):
    name = "transfer_ipc"
    backend = "ipc"
    device = "cuda"
    requirements = EngineRequirements(kind="ray_llm", weight_transfer_backend="ipc")
    exercises = "weight transfer, backend 'ipc': CUDA IPC handles to a colocated trainer's tensors"

    def trainer_fields(self, port, world_size):
        return {"rank": 0}


class TransferShardedRdt(WeightTransferPath):
    name = "transfer_sharded_rdt"
    backend = "sharded_rdt"
    device = "cuda"
    requirements = EngineRequirements(kind="ray_llm", weight_transfer_backend="sharded_rdt")
    exercises = "weight transfer, backend 'sharded_rdt': consumers pull sharded tensors over Ray direct transport"

    def trainer_fields(self, port, world_size):
        return {"rank": 0, "num_consumers": world_size - 1}

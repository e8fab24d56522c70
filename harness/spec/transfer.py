"""What each vLLM weight-transfer backend needs of the arm that drives it, and where its
engine and trainer actors go, as plain data (the planner, the fan-out, the arm and the
preflight all read it; nothing here imports vLLM, torch or Ray).

Checked against vLLM 0.32's sources (``vllm/distributed/weight_transfer/``):

- ``sparse_nccl``'s trainer takes no ``WeightSource`` (``sparse_nccl_engine.py``: "takes no
  WeightSource; pass each round's patches to send_weights(patches)"); the others take one.
- ``nccl_m2n``'s trainer needs an ``M2NWeightSource`` (mesh and per-tensor placements) and the
  ``nccl.m2n`` module of ``nccl-extensions``.
- ``sharded_rdt``'s worker engine requires ``distributed_executor_backend="ray"``, and its
  trainer a source in numeric layer order (``layerwise_groups``); its consumers pull over NIXL.
- ``ipc`` hands CUDA IPC handles keyed by the sender GPU's UUID; each worker looks up its own
  GPU's, so there is one colocated sender per worker GPU.
- The NCCL-style backends broadcast from a trainer rank on a GPU of its own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

SourceKind = Literal["full", "none", "m2n"]
TrainerPlace = Literal["none", "own", "colocated"]
Executor = Literal["default", "ray"]

RAY_NAMESPACE = "refit-harness"
"""Namespace of the Ray an arm starts for its engine (the sharded-RDT workers find the trainer's
serve actor by name in it)."""
COLOCATED_SHARE = 0.5
"""GPU fraction of each vLLM worker and of the trainer rank colocated with it (IPC)."""


@dataclass(frozen=True)
class Backend:
    """One weight-transfer backend's needs."""

    name: str
    """vLLM's backend name (``WeightTransferConfig(backend=...)``)."""
    source: SourceKind
    """What ``trainer_init`` takes as ``source``: a plain ``WeightSource`` (``full``), none
    (``none``: per-round patches instead), or an ``M2NWeightSource`` (``m2n``)."""
    layer_order: bool
    """The source must yield tensors grouped and ordered by layer index (``layers.2`` before
    ``layers.10``), as ``vllm.distributed.weight_transfer.base.layerwise_groups`` orders them."""
    fixed_metadata: bool
    """The trainer fixes the list of tensors at init and checks every round against it, so a
    sabotaged round cannot leave a tensor out: it sends the engine's current value instead."""
    executor: Executor
    """vLLM's ``distributed_executor_backend``: ``ray`` where the backend needs Ray workers
    (its own requirement, or a colocated sender per worker GPU); ``default`` lets vLLM pick."""
    trainer: TrainerPlace
    """Where the trainer runs: no GPU (``none``), a GPU of its own (``own``), or one rank on
    each worker's GPU (``colocated``)."""
    packages: tuple[tuple[str, str], ...] = ()
    """``(distribution, what needs it)`` of packages vLLM does not install (the ``gpu-full``
    extra); a cell whose package is missing is SKIPPED with that reason."""
    nccl: str | None = None
    """The oldest NCCL library it runs with, where it links a library of its own against NCCL
    (``libnccl_m2n``): vLLM must then load that same library, ``VLLM_NCCL_SO_PATH``."""
    insecure_serialization: bool = False
    """Its update payload carries Python objects (IPC handles) that vLLM's msgpack between
    the front end and a separate engine core refuses without ``VLLM_ALLOW_INSECURE_SERIALIZATION=1``."""
    cuda: bool = True
    """Needs CUDA."""


BACKENDS: dict[str, Backend] = {
    b.name: b
    for b in (
        Backend(
            "gloo", "full", layer_order=False, fixed_metadata=False, executor="default", trainer="none", cuda=False
        ),
        Backend("nccl", "full", layer_order=False, fixed_metadata=False, executor="default", trainer="own"),
        Backend("sparse_nccl", "none", layer_order=False, fixed_metadata=False, executor="default", trainer="own"),
        Backend(
            "nccl_m2n",
            "m2n",
            layer_order=False,
            fixed_metadata=True,
            executor="default",
            trainer="own",
            packages=(("nccl-extensions", "nccl_m2n's trainer and workers import nccl.m2n"),),
            nccl="2.30.5",  # vLLM's m2n_common import hint
        ),
        Backend(
            "sharded_rdt",
            "full",
            layer_order=True,
            fixed_metadata=True,
            executor="ray",
            trainer="own",
            packages=(("nixl", "sharded_rdt's consumers pull over NIXL"),),
        ),
        Backend(
            "ipc",
            "full",
            layer_order=False,
            fixed_metadata=False,
            executor="ray",
            trainer="colocated",
            insecure_serialization=True,
        ),
    )
}
"""Every backend a ``transfer_*`` path drives."""


@dataclass(frozen=True)
class TrainerSlot:
    """One trainer rank's Ray actor."""

    rank: int
    """Its trainer rank (0 is the sender)."""
    gpus: float
    """GPUs its actor asks Ray for."""
    bundle: int | None
    """The bundle of the engine's placement group it shares (colocated); None: outside it."""


@dataclass(frozen=True)
class TransferLayout:
    """Where a transfer arm's engine actor, vLLM's workers and the trainer ranks go, inside the
    Ray the arm starts (which sees exactly the GPUs the arm holds)."""

    backend: str
    """The backend."""
    tensor_parallel_size: int
    """vLLM workers."""
    executor: Executor
    """vLLM's executor."""
    engine_gpus: float
    """GPUs the ``LLM`` actor asks for itself (its workers' under vLLM's default executor, which
    starts them inside the actor's own GPUs)."""
    bundles: int
    """One-GPU bundles of the placement group the ``LLM`` actor and its Ray workers run in
    (``ray`` executor); 0: no placement group."""
    worker_gpus: float | None
    """``VLLM_RAY_PER_WORKER_GPUS`` of each Ray worker (``ray`` executor only)."""
    trainers: tuple[TrainerSlot, ...]
    """The trainer ranks."""

    @property
    def arm_gpus(self) -> int:
        """GPUs the arm must hold for all of it to be placed."""
        engine = self.bundles if self.bundles else self.engine_gpus
        own = sum(t.gpus for t in self.trainers if t.bundle is None)
        return int(math.ceil(engine + own))

    def engine_env(self) -> dict[str, str]:
        """Environment of the ``LLM`` actor (vLLM reads these when it starts its workers)."""
        env: dict[str, str] = {}
        if self.executor == "ray":
            env["VLLM_RAY_PER_WORKER_GPUS"] = f"{self.worker_gpus:g}"
            env["VLLM_RAY_BUNDLE_INDICES"] = ",".join(str(i) for i in range(self.tensor_parallel_size))
            # The actor asks no GPU itself; Ray would set CUDA_VISIBLE_DEVICES="" for it.
            env["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"] = "1"
        if BACKENDS[self.backend].insecure_serialization:
            env["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
        return env

    def engine_args(self) -> dict[str, str]:
        """``LLM(...)`` arguments the layout adds."""
        return {"distributed_executor_backend": "ray"} if self.executor == "ray" else {}


def layout(backend: str, tensor_parallel_size: int, cuda: bool) -> TransferLayout:
    """The layout of a ``transfer_<backend>`` arm. Without CUDA nothing asks for a GPU (the
    ``gloo`` twin; the CUDA backends are SKIPPED there)."""
    b = BACKENDS[backend]
    tp = tensor_parallel_size
    if not cuda:
        return TransferLayout(backend, tp, b.executor, 0.0, 0, None, (TrainerSlot(0, 0.0, None),))
    if b.trainer == "colocated":
        trainers = tuple(TrainerSlot(r, COLOCATED_SHARE, r) for r in range(tp))
        return TransferLayout(backend, tp, "ray", 0.0, tp, COLOCATED_SHARE, trainers)
    trainer = (TrainerSlot(0, 1.0 if b.trainer == "own" else 0.0, None),)
    if b.executor == "ray":
        return TransferLayout(backend, tp, "ray", 0.0, tp, 1.0, trainer)
    return TransferLayout(backend, tp, "default", float(tp), 0, None, trainer)


def arm_gpus(tensor_parallel_size: int, backend: str | None) -> int:
    """GPUs an arm holds on CUDA: its engine's, and a transfer arm's trainer GPU."""
    if backend is None:
        return tensor_parallel_size
    return layout(backend, tensor_parallel_size, cuda=True).arm_gpus

"""Weight transfer through vLLM's own API, with a CPU twin of the NCCL backend.

Inference side: vLLM's worker builds ``WeightTransferEngineFactory.create_engine`` from
``WeightTransferConfig(backend=...)``; the harness drives ``init_weight_transfer_engine``,
``start_weight_update``, ``update_weights`` and ``finish_weight_update`` through vLLM's
``RayVLLMWeightSyncClient``, from a trainer running as a Ray actor next to the engine.

The ``gloo`` backend is registered in both of vLLM's factories by the harness's general
plugin. It mirrors the NCCL engine: a stateless process group (loopback by default),
and a receive that goes through the same reload lifecycle as the installed vLLM's own engines
(``vllm_compat.start_reload`` -> ``model.load_weights`` per tensor -> ``finish_reload``: the
layerwise pair before 0.34, the ``VLLM_RELOAD_MODE`` dispatch from 0.34). Only the transport
differs. The sources the trainer sends from sit on ``vllm_compat.weight_source_base``, which
maps them onto the installed vLLM's ``WeightSource`` protocol.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, ClassVar

import torch
from vllm.distributed.weight_transfer.base import (
    ParamMeta,
    TrainerInitInfo,
    TrainerWeightTransferEngine,
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)

from harness import loopback, safetensors_files
from harness.worker import vllm_compat

_TIMEOUT = timedelta(seconds=300)
_FIRST_POLL_S = 0.0005
_LAST_POLL_S = 0.05
"""How often a sender looks at its receiver while a broadcast is in flight: from a fraction
of a millisecond (a small tensor's broadcast) up to what a waiting reviewer does not notice."""


def store_listener(host: str, port: int = 0) -> socket.socket:
    """Rank 0's store socket, bound and listening on ``host`` only; port 0 lets the kernel
    pick one, so no other process can take it between the pick and the bind."""
    listen = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listen.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listen.bind((host, port))
    listen.listen()
    return listen


def _gloo_group(host: str, port: int, rank: int, world_size: int, listen: socket.socket | None = None):
    """A stateless gloo group that listens on ``host`` only.

    Left to itself, rank 0's ``TCPStore`` listens on every interface (seen with ``ss -ltnp``:
    ``*:PORT``), and gloo's pairs bind to the address the hostname resolves to. So rank 0
    binds the store's socket itself (or is handed ``listen``, already bound), and gloo is
    pinned to the loopback interface (``GLOO_SOCKET_IFNAME``, read when the backend is built)
    when the host is loopback.
    """
    import ipaddress

    from vllm.distributed.utils import stateless_init_torch_distributed_process_group

    if rank == 0 and listen is None:
        listen = store_listener(host, port)
    on_loopback = ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    saved = os.environ.get("GLOO_SOCKET_IFNAME")
    if on_loopback:
        os.environ["GLOO_SOCKET_IFNAME"] = loopback.interface()
    try:
        return stateless_init_torch_distributed_process_group(
            host, port, rank, world_size, backend="gloo", timeout=_TIMEOUT, listen_socket=listen
        )
    finally:
        if on_loopback:
            if saved is None:
                os.environ.pop("GLOO_SOCKET_IFNAME", None)
            else:
                os.environ["GLOO_SOCKET_IFNAME"] = saved


def _broadcast(group, tensor: torch.Tensor, root: int = 0, receiver: Future | None = None) -> None:
    """Broadcast ``tensor`` from ``root``. ``receiver`` is the RPC in which the receiving side
    takes part: if it ends in an error while this waits, that error is raised at once. Without
    it, a sender whose receiver has raised waits out the group's whole timeout and reports
    only that (measured: 300 s, then gloo's "Timed out waiting ... for send operation")."""
    # The ProcessGroup's own broadcast uses group-local ranks; torch.distributed.broadcast
    # would look up global ranks this stateless group does not have.
    opts = torch.distributed.BroadcastOptions()
    opts.rootRank = root
    work = group.broadcast([_on_the_wire(tensor)], opts)
    if receiver is None:
        work.wait()
        return
    pause = _FIRST_POLL_S
    while not work.is_completed():
        if receiver.done() and receiver.exception() is not None:
            raise receiver.exception()  # type: ignore[misc]
        time.sleep(pause)
        pause = min(2 * pause, _LAST_POLL_S)
    work.wait()  # raises the broadcast's own error, if it had one


def _on_the_wire(tensor: torch.Tensor) -> torch.Tensor:
    """What gloo moves: float8 tensors as their bytes (gloo has no float8 type: "Invalid scalar
    type", measured with the fp8 W8A8 checkpoint), a view, so the receiver fills its tensor."""
    if tensor.is_floating_point() and tensor.element_size() == 1:
        return tensor.view(torch.uint8)
    return tensor


@dataclass
class GlooWeightTransferInitInfo(WeightTransferInitInfo):
    master_address: str
    master_port: int
    rank_offset: int
    world_size: int


@dataclass
class GlooWeightTransferUpdateInfo(WeightTransferUpdateInfo):
    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]


class GlooWeightTransferEngine(WeightTransferEngine[GlooWeightTransferInitInfo, GlooWeightTransferUpdateInfo]):
    """Inference side: receive checkpoint-format tensors and load them layerwise."""

    init_info_cls = GlooWeightTransferInitInfo
    update_info_cls = GlooWeightTransferUpdateInfo

    def __init__(self, config, vllm_config, device, model) -> None:
        super().__init__(config, vllm_config, device, model)
        self.group = None

    def init_transfer_engine(self, init_info: GlooWeightTransferInitInfo) -> None:
        rank = init_info.rank_offset + self.parallel_config.rank
        self.group = _gloo_group(init_info.master_address, init_info.master_port, rank, init_info.world_size)

    def start_weight_update(self) -> None:
        vllm_compat.start_reload(self.model)

    def finish_weight_update(self) -> None:
        vllm_compat.finish_reload(self.model, self.model_config, self.device)

    def update_weights(self, update_info: dict[str, Any]) -> None:
        # The base class ends with torch.accelerator.synchronize(), which raises where
        # there is no accelerator; gloo receives synchronously, so there is nothing to wait for.
        self.receive_weights(self.parse_update_info(update_info))
        if torch.accelerator.is_available():
            torch.accelerator.synchronize()

    def receive_weights(self, update_info: GlooWeightTransferUpdateInfo) -> None:
        if self.group is None:
            raise RuntimeError("gloo weight transfer not initialized; call init_weight_transfer_engine first")
        for name, dtype_name, shape in zip(update_info.names, update_info.dtype_names, update_info.shapes):
            weight = torch.empty(shape, dtype=getattr(torch, dtype_name))
            _broadcast(self.group, weight)
            self.model.load_weights([(name, weight.to(self.device))])

    def shutdown(self) -> None:
        self.group = None


@dataclass
class GlooTrainerInitInfo(TrainerInitInfo):
    backend: ClassVar[str] = "gloo"
    master_address: str
    master_port: int
    """0: the kernel picks a free port when rank 0 binds (the harness's choice)."""
    world_size: int


class GlooTrainerWeightTransferEngine(TrainerWeightTransferEngine[GlooTrainerInitInfo]):
    """Trainer side: rank 0 of the gloo group; drives the update round trip through the client."""

    init_info_cls = GlooTrainerInitInfo

    @classmethod
    def trainer_init(cls, init_info: GlooTrainerInitInfo, *, client, source=None):
        if source is None:
            raise ValueError("gloo trainer weight transfer requires a WeightSource")
        engine = cls(client=client, source=source, is_sender=init_info.is_sender)
        # Bind before telling the workers where to join: with master_port 0 the port is the
        # kernel's pick, held from here on, so a port taken by another process cannot fail it.
        listen = store_listener(init_info.master_address, init_info.master_port)
        port = listen.getsockname()[1]
        worker_info = GlooWeightTransferInitInfo(
            master_address=init_info.master_address, master_port=port, rank_offset=1, world_size=init_info.world_size
        )
        # Both sides block in the rendezvous: ask the workers to join while we do.
        with ThreadPoolExecutor(max_workers=1) as pool:
            joined = pool.submit(client.init_weight_transfer_engine, asdict(worker_info))
            engine.group = _gloo_group(init_info.master_address, port, 0, init_info.world_size, listen=listen)
            joined.result()
        return engine

    def send_weights(self) -> None:
        meta = vllm_compat.source_metadata(self.source)
        info = GlooWeightTransferUpdateInfo(
            names=[m.name for m in meta],
            dtype_names=[str(m.dtype).removeprefix("torch.") for m in meta],
            shapes=[list(m.shape) for m in meta],
        )
        self.client.start_weight_update()
        pool = ThreadPoolExecutor(max_workers=1)
        try:
            received = pool.submit(self.client.update_weights, asdict(info))
            for (_, tensor), m in zip(vllm_compat.source_tensors(self.source), meta):
                _broadcast(self.group, tensor.to(m.dtype).contiguous(), receiver=received)
            received.result()
        finally:
            # Not joined: after a failed broadcast the RPC may never return, and the group is
            # unusable anyway; the caller tears the trainer down.
            pool.shutdown(wait=False)
        self.client.finish_weight_update()

    def shutdown(self) -> None:
        self.group = None


class CheckpointSource(vllm_compat.weight_source_base()):  # type: ignore[misc]
    """A ``WeightSource`` over a safetensors checkpoint directory (the trainer's weights).

    - ``device``: where the tensors are handed over; NCCL sends from device pointers and CUDA
      IPC shares handles to device memory, so the CUDA backends need CUDA tensors.
    - ``exclude``: names left out of the update (a sabotaged transfer).
    - ``substitute``: name -> another checkpoint directory whose tensor is sent under that name
      instead (a sabotaged transfer for backends whose trainer fixes the tensor list at init:
      the engine is sent the value it already holds).
    - ``layer_order``: tensors in numeric layer order (``layers.2`` before ``layers.10``), as
      vLLM's ``layerwise_groups`` orders them, instead of the files' order; the sharded-RDT
      trainer refuses any other ("metadata order is group-contiguous").

    ``param_metas()`` and ``tensors()`` always agree, element for element (vLLM's NCCL trainer
    checks).
    """

    def __init__(
        self,
        directory: str | Path,
        device: str = "cpu",
        exclude: tuple[str, ...] = (),
        substitute: dict[str, str] | None = None,
        layer_order: bool = False,
    ) -> None:
        self.directory = Path(directory)
        self.device = device
        self.exclude = frozenset(exclude)
        self.substitute = dict(substitute or {})
        self.layer_order = layer_order

    def _entries(self) -> list[tuple[Path, str, dict[str, Any]]]:
        entries = [
            (f, name, entry)
            for f in safetensors_files.files(self.directory)
            for name, entry in safetensors_files.tensor_entries(safetensors_files.read_header(f)[1])
            if name not in self.exclude
        ]
        if self.layer_order:
            from vllm.distributed.weight_transfer.base import layerwise_groups

            rank = {name: i for i, name in enumerate(n for g in layerwise_groups([e[1] for e in entries]) for n in g)}
            entries.sort(key=lambda e: rank[e[1]])
        return entries

    def param_metas(self) -> list[ParamMeta]:
        return [
            ParamMeta(name=name, dtype=safetensors_files.torch_dtype(entry["dtype"]), shape=tuple(entry["shape"]))
            for _, name, entry in self._entries()
        ]

    def tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        from contextlib import ExitStack

        from safetensors import safe_open

        entries = self._entries()
        with ExitStack() as stack:
            opened: dict[Path, Any] = {}

            def tensor(f: Path, name: str) -> torch.Tensor:
                if f not in opened:
                    opened[f] = stack.enter_context(safe_open(str(f), framework="pt"))
                return opened[f].get_tensor(name)

            for f, name, _ in entries:
                if name in self.substitute:
                    other = next(
                        g
                        for g in safetensors_files.files(self.substitute[name])
                        if name in safetensors_files.read_header(g)[1]
                    )
                    yield name, tensor(other, name).to(self.device)
                else:
                    yield name, tensor(f, name).to(self.device)


M2NCheckpointSource = vllm_compat.m2n_source_class(CheckpointSource)
"""The checkpoint as vLLM's m2n trainer takes it: one trainer rank holding every tensor whole,
replicated (m2n reshards each into the workers' tensor-parallel layout)."""


def checkpoint_source(backend: str, directory: str | Path, **options) -> CheckpointSource:
    """The source a backend's trainer takes, over ``directory``, on the backend's device and in
    the order it needs (``harness.spec.transfer.BACKENDS``)."""
    from harness.spec.transfer import BACKENDS

    b = BACKENDS[backend]
    options.setdefault("device", source_device(backend))
    cls = M2NCheckpointSource if b.source == "m2n" else CheckpointSource
    return cls(directory, layer_order=b.layer_order, **options)


class TensorSource(vllm_compat.weight_source_base()):  # type: ignore[misc]
    """A ``WeightSource`` over tensors a live trainer holds: ``(name, tensor)`` pairs, sent in
    this order, under these names and in these dtypes."""

    def __init__(self, tensors: list[tuple[str, torch.Tensor]]) -> None:
        self.pairs = list(tensors)

    def param_metas(self) -> list[ParamMeta]:
        return [ParamMeta(name=n, dtype=t.dtype, shape=tuple(t.shape)) for n, t in self.pairs]

    def tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        return iter(self.pairs)


class TrainerActor:
    """One trainer rank, in a Ray actor beside the engine actor, as RL frameworks place it.

    Builds its engine with vLLM's ``WeightTransferTrainerFactory`` and talks to the inference
    engine through vLLM's ``RayVLLMWeightSyncClient``. ``held`` is the checkpoint the inference
    engine holds now (sparse patches are deltas against it; a sabotaged round of a backend with
    fixed metadata sends its values). Every rank runs ``connect`` and ``send`` at the same
    time (the IPC ranks all-gather their handles); only rank 0 drives the engine.
    """

    def __init__(self, engine_actor, init_info: dict[str, Any], backend: str, engine_holds: str) -> None:
        from vllm.distributed.weight_transfer.clients import RayVLLMWeightSyncClient
        from vllm.plugins import load_general_plugins

        load_general_plugins()  # registers the gloo trainer engine in this process too
        self.client = RayVLLMWeightSyncClient(engine_actor)
        self.init_info = trainer_init_info(backend, init_info)
        self.backend = backend
        self.held = engine_holds
        self.engine = None

    def join_group(self, address: str, port: int, rank: int, world_size: int) -> None:
        """The trainer ranks' own process group: vLLM's IPC trainer all-gathers every rank's
        handles over the default group (``_all_gather_and_merge_handles``)."""
        torch.distributed.init_process_group(
            backend="gloo", init_method=f"tcp://{address}:{port}", rank=rank, world_size=world_size
        )

    def connect(self) -> None:
        from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory

        self.engine = WeightTransferTrainerFactory.trainer_init(
            self.init_info, client=self.client, source=trainer_source(self.backend, self.held)
        )

    def send(self, checkpoint_dir: str, exclude: tuple[str, ...] = ()) -> None:
        """Update the engine to ``checkpoint_dir``, leaving out ``exclude`` (a sabotage)."""
        from harness.spec.transfer import BACKENDS

        if BACKENDS[self.backend].source == "none":
            target = checkpoint_source(self.backend, checkpoint_dir, exclude=exclude)
            self.engine.send_weights(sparse_patches(checkpoint_source(self.backend, self.held), target))
        else:  # full resync backends replay their source: the trainer's weights are now the target
            if BACKENDS[self.backend].fixed_metadata:
                target = checkpoint_source(self.backend, checkpoint_dir, substitute=dict.fromkeys(exclude, self.held))
            else:
                target = checkpoint_source(self.backend, checkpoint_dir, exclude=exclude)
            self.engine.source = target
            self.engine.send_weights()
        # Every name, even one left out: the next sparse diff looks each one up here, and its
        # patches carry absolute values, so a left-out tensor is still set right by it.
        self.held = checkpoint_dir

    def shutdown(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def trainer_source(backend: str, directory: str | Path) -> CheckpointSource | None:
    """What ``trainer_init`` gets as ``source``: None for a delta backend, whose trainer refuses
    one ("Sparse NCCL weight transfer takes no WeightSource"); else the checkpoint, as the
    backend needs it."""
    from harness.spec.transfer import BACKENDS

    return None if BACKENDS[backend].source == "none" else checkpoint_source(backend, directory)


def source_device(backend: str) -> str:
    """Where the trainer's tensors live: NCCL sends from device pointers and CUDA IPC
    shares handles to device memory, so every CUDA backend needs CUDA tensors; only the
    gloo twin sends from the host."""
    return "cpu" if backend == "gloo" else "cuda"


def sparse_patches(held: CheckpointSource, target: CheckpointSource) -> list:
    """vLLM ``SparseWeightPatch`` objects for every element that differs between two checkpoints,
    with the int32 flat indices vLLM's sparse trainer requires ("Sparse weight updates require
    int32 indices"), so a tensor must have fewer than 2**31 elements."""
    from vllm.distributed.weight_transfer.sparse_nccl_engine import SparseWeightPatch

    old = dict(vllm_compat.source_tensors(held))
    patches = []
    for name, new in vllm_compat.source_tensors(target):
        if new.numel() >= 2**31:
            raise ValueError(f"{name} has {new.numel()} elements: more than int32 sparse indices can address")
        changed = (new != old[name].to(new.device)).reshape(-1).nonzero().reshape(-1).to(torch.int32)
        if changed.numel():
            patches.append(
                SparseWeightPatch(
                    name=name, indices=changed, values=new.reshape(-1)[changed], full_shape=tuple(new.shape)
                )
            )
    return patches


def trainer_init_info(backend: str, fields: dict[str, Any]) -> TrainerInitInfo:
    """The backend's own TrainerInitInfo class, looked up in vLLM's trainer factory."""
    from harness.worker.vllm_private import trainer_engine_class

    return trainer_engine_class(backend).init_info_cls(**fields)

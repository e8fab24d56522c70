"""The preflight's engine side: ``python -m harness.arm.preflight REQUEST FINDINGS``.

Checks a scenario's cells, as planned for machines with N GPUs (``PreflightRequest``),
against the installed vLLM's own classes and on a Ray told it has N GPUs, without starting an
engine or touching a GPU. Everything that can be checked without CUDA is:

- **engine-args**: each arm's ``LLM(...)`` arguments (the arm's own ``_llm_kwargs``) through
  ``EngineArgs(**args).create_engine_config()``. CPU-platform facts are not held against a
  GPU cell: the platform is taken to have sleep mode, as CUDA has.
- **kv-cache**: vLLM's ``check_enough_kv_cache_memory`` for the arm's ``kv_cache_memory_bytes``,
  with the model's attention layers as ``FullAttentionSpec`` (KV heads per TP rank, head size,
  dtype, the attention backend's block size).
- **attention**: the pinned backend's ``validate_configuration`` for the cell's head size,
  dtype, block size and the nightly GPU's compute capability.
- **trainer**: each trainer rank's real ``TrainerActor.connect`` (vLLM's ``trainer_init`` with
  the harness's source and fields), up to the backend's first transport call, which raises
  ``ReachedTransport``; the init payload the trainer sends is parsed by the worker engine's own
  ``init_info_cls``, the worker engine is instantiated with the arm's ``VllmConfig`` (the
  sharded-RDT executor check), and the first round's update payload is built and validated as
  the backend builds it (sparse patches through ``_validate_patch``, the dense source through
  ``_checked_iter``, IPC handles through vLLM's msgpack encoder under the engine's environment).
- **packages**: the optional packages each backend needs, and the modules an engine configuration
  imports (the HPC cell's ``hpc``); a missing one is a SKIP with the install steps, not a problem.
- **placement**: every arm's Ray actor on a machine of N GPUs, then, inside a Ray with exactly
  the GPUs the arm holds, the engine's placement group, the ``LLM`` actor, vLLM's Ray workers
  and every trainer rank, with the options the arm uses (``harness.machinery.placement``); a
  colocated trainer rank must land on its worker's GPU.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import threading
import types
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

from harness import store
from harness.machinery.placement import (
    PlacementError,
    engine_actor_options,
    engine_placement_group,
    group_ready,
    trainer_actor_options,
    worker_actor_options,
)
from harness.plan import ArmPlan, PreflightFinding, PreflightRequest
from harness.spec.transfer import BACKENDS, TransferLayout, layout
from harness.worker import vllm_compat

Finding = PreflightFinding
W = "vllm.distributed.weight_transfer."


class ReachedTransport(Exception):
    """Raised in place of a backend's first transport call: everything before it ran."""


class RecordingClient:
    """A ``VLLMWeightSyncClient`` (vLLM's structural protocol) that records the handshake."""

    def __init__(self) -> None:
        self.init_info: dict[str, Any] | None = None
        self.called = threading.Event()

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self.init_info = init_info
        self.called.set()

    def start_weight_update(self) -> None:
        pass

    def update_weights(self, update_info) -> None:
        pass

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        pass


SENDS_INIT_BEFORE_TRANSPORT = frozenset({"gloo", "nccl", "sparse_nccl", "nccl_m2n", "ipc"})
"""Backends whose sender asks the workers to init before its first transport call (the
sharded-RDT trainer spawns its serve actors first, so its handshake is past the stop)."""


def _stop(*args, **kwargs):
    raise ReachedTransport()


def transport_stops(backend: str, rank: int) -> list[tuple[str, dict[str, Any]]]:
    """What to patch so that a trainer's ``trainer_init`` runs on the CPU up to its transport."""
    return {
        "nccl": [(W + "nccl_engine.open_trainer_endpoint", {"side_effect": _stop})],
        "sparse_nccl": [(W + "sparse_nccl_engine.open_trainer_endpoint", {"side_effect": _stop})],
        # The runtime package may be missing here (a SKIP of its own); its import is not transport.
        "nccl_m2n": [
            (W + "m2n_trainer.import_m2n", {"return_value": types.SimpleNamespace()}),
            (W + "m2n_trainer." + vllm_compat.m2n_rendezvous_target(), {"side_effect": _stop}),
        ],
        # IPC needs no rendezvous: its trainer asks CUDA only for the sender GPU's UUID.
        "ipc": [
            ("torch.accelerator.current_device_index", {"return_value": 0}),
            ("torch.cuda.get_device_properties", {"return_value": types.SimpleNamespace(uuid=f"GPU-preflight-{rank}")}),
        ],
        "sharded_rdt": [
            (W + "sharded_rdt_trainer.ShardedRDTTrainerWeightTransferEngine._spawn_server", {"side_effect": _stop})
        ],
        # The harness's CPU twin: its trainer binds its store, asks the workers to join, then joins.
        "gloo": [("harness.machinery.transfer._gloo_group", {"side_effect": _stop})],
    }.get(backend, [])


def dry_connect(path, backend: str, world_size: int, rank: int) -> tuple[str, dict[str, Any] | None]:
    """Trainer rank ``rank``'s real ``TrainerActor.connect`` up to its transport: ``(how far it
    got, the init payload it sent the workers)``; vLLM's own refusals propagate."""
    from harness.machinery.transfer import TrainerActor

    actor = TrainerActor(None, path.trainer_fields(world_size, rank), backend, path.checkpoints.a)
    actor.client = RecordingClient()
    with ExitStack() as stack:
        for target, how in transport_stops(backend, rank):
            stack.enter_context(mock.patch(target, **how))
        try:
            actor.connect()
            got = "trainer_init completed"
        except ReachedTransport:
            got = "reached the transport"
    if rank == 0 and backend in SENDS_INIT_BEFORE_TRANSPORT:
        actor.client.called.wait(5)  # the m2n trainer sends it from a thread it does not join
    return got, actor.client.init_info


@contextmanager
def gpu_platform() -> Iterator[None]:
    """vLLM's config checks, with the CPU platform's one GPU-only refusal lifted: sleep mode."""
    from vllm.platforms import current_platform

    with mock.patch.object(type(current_platform), "is_sleep_mode_available", lambda self: True):
        yield


def engine_config(kwargs: dict[str, Any]):
    """vLLM's ``VllmConfig`` for ``LLM(**kwargs)``, or raise what vLLM raises."""
    from vllm.engine.arg_utils import EngineArgs

    with gpu_platform():
        return EngineArgs(**kwargs).create_engine_config()


def attention_backend(name: str | None):
    """The class of the attention backend a cell pins (FlashAttention when it pins none: what
    vLLM picks for these dtypes and head sizes on sm80 and newer)."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    return AttentionBackendEnum[name or "FLASH_ATTN"].get_class()


def block_size(backend_cls) -> int:
    sizes = [getattr(s, "base", s) for s in backend_cls.get_supported_kernel_block_sizes()]
    return next((int(s) for s in sizes if isinstance(s, int) and s >= 16), 16)


def check_attention(arm: ArmPlan, cfg, capability: tuple[int, int], where: str) -> list[Finding]:
    import torch
    from vllm.platforms.interface import DeviceCapability

    pinned = arm.engine.vllm_kwargs().get("attention_backend")
    if not pinned:
        return [Finding("ok", where, "attention", "no backend pinned: vLLM chooses one for the cell's dtype")]
    cls = attention_backend(pinned)
    mc = cfg.model_config
    reasons = cls.validate_configuration(
        head_size=mc.get_head_size(),
        dtype=mc.dtype if isinstance(mc.dtype, torch.dtype) else getattr(torch, str(mc.dtype)),
        kv_cache_dtype=cfg.cache_config.cache_dtype,
        block_size=block_size(cls),
        use_mla=mc.use_mla,
        has_sink=False,
        use_sparse=False,
        use_mm_prefix=False,
        use_per_head_quant_scales=False,
        device_capability=DeviceCapability(*capability),
        attn_type="decoder",
    )
    name = cls.get_name()
    if reasons:
        return [
            Finding(
                "problem",
                where,
                "attention",
                f"{name} cannot run it on sm{capability[0]}{capability[1]}: "
                f"{', '.join(reasons)} ({mc.dtype}, head size {mc.get_head_size()})",
            )
        ]
    return [Finding("ok", where, "attention", f"{name} accepts {mc.dtype}, head size {mc.get_head_size()}")]


def check_kv_cache(arm: ArmPlan, cfg, kwargs: dict[str, Any], where: str) -> list[Finding]:
    """vLLM's own KV-cache check for the arm's KV cache size."""
    from vllm.v1.attention.backends.utils import get_supported_kv_cache_layouts, resolve_kv_cache_layout
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    mc, pc = cfg.model_config, cfg.parallel_config
    if mc.use_mla or mc.is_hybrid or mc.is_attention_free:
        return [Finding("ok", where, "kv-cache", "not an attention-only model: vLLM sizes its cache at start-up")]
    backend_cls = attention_backend(arm.engine.vllm_kwargs().get("attention_backend"))
    size = block_size(backend_cls)
    cfg.cache_config.block_size = size  # the GPU backend's, not the CPU platform's 128
    spec = {
        f"model.layers.{i}.self_attn.attn": FullAttentionSpec(
            block_size=size, num_kv_heads=mc.get_num_kv_heads(pc), head_size=mc.get_head_size(), dtype=mc.dtype
        )
        for i in range(mc.get_num_layers(pc))
    }
    available = kwargs.get("kv_cache_memory_bytes")
    if not available:
        return [Finding("problem", where, "kv-cache", "no kv_cache_memory_bytes: vLLM would profile the GPU for it")]
    layouts = [layout.name for layout in get_supported_kv_cache_layouts((backend_cls,))]
    resolve_kv_cache_layout(cfg, [layouts], spec.values())
    try:
        vllm_compat.resolve("check_enough_kv_cache_memory")(cfg, spec, available)
    except ValueError as exc:
        return [Finding("problem", where, "kv-cache", f"{available >> 20} MiB: {' '.join(str(exc).split())[:300]}")]
    return [Finding("ok", where, "kv-cache", f"{available >> 20} MiB holds max_model_len {mc.max_model_len}")]


def ipc_handle_args():
    """The types ``torch.multiprocessing.reductions.reduce_tensor`` puts in a CUDA tensor's
    rebuild arguments (what ``ipc_handles`` carries), built without CUDA."""
    import torch

    return (
        torch.Tensor,
        torch.Size([1]),
        (1,),
        0,
        torch.UntypedStorage,
        torch.bfloat16,
        0,
        b"\0" * 64,
        2,
        0,
        False,
        b"\0" * 16,
        0,
        b"\0" * 64,
        True,
    )


def check_update_payload(arm: ArmPlan, placed: TransferLayout, where: str) -> list[Finding]:
    """The first round's update payload, built as the backend builds it, validated by vLLM."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    from harness.machinery.transfer import checkpoint_source, sparse_patches

    backend = placed.backend
    engine_cls = WeightTransferEngineFactory._registry[backend]()
    a = checkpoint_source(backend, arm.checkpoints.a, device="cpu")
    b = checkpoint_source(backend, arm.checkpoints.b, device="cpu")
    meta = vllm_compat.source_metadata(b)
    dense = {
        "names": [m.name for m in meta],
        "dtype_names": [str(m.dtype).split(".")[-1] for m in meta],
        "shapes": [list(m.shape) for m in meta],
    }
    if backend == "sparse_nccl":
        from vllm.distributed.weight_transfer.sparse_nccl_engine import SparseNCCLTrainerWeightTransferEngine

        patches = sparse_patches(a, b)
        for p in patches:
            SparseNCCLTrainerWeightTransferEngine._validate_patch(p)
        engine_cls.update_info_cls(
            names=[p.name for p in patches],
            dtype_names=[str(p.values.dtype).split(".")[-1] for p in patches],
            shapes=[list(p.full_shape) for p in patches],
            num_updates_list=[p.indices.numel() for p in patches],
        )
        return [Finding("ok", where, "trainer", f"{len(patches)} sparse patches pass vLLM's _validate_patch")]
    if backend == "nccl":
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerWeightTransferEngine

        sent = sum(1 for _ in NCCLTrainerWeightTransferEngine._checked_iter(b, meta))
        engine_cls.update_info_cls(**dense)
        return [Finding("ok", where, "trainer", f"the source's metadata and iteration agree ({sent} tensors)")]
    if backend == "ipc":
        from vllm.v1.serial_utils import MsgpackEncoder

        payload = {**dense, "ipc_handles": [{"GPU-preflight-0": ipc_handle_args()} for _ in meta]}
        engine_cls.update_info_cls(**payload)
        if not arm.engine.engine_core_process:
            return [Finding("ok", where, "trainer", "IPC handles stay in Python objects (no separate engine core)")]
        with mock.patch.dict(os.environ, placed.engine_env()):
            try:
                MsgpackEncoder().encode(("collective_rpc", ("update_weights",), {"update_info": payload}))
            except TypeError as exc:
                return [
                    Finding(
                        "problem",
                        where,
                        "trainer",
                        f"the IPC handles cannot reach a separate engine core: {' '.join(str(exc).split())[:200]}",
                    )
                ]
        return [Finding("ok", where, "trainer", "IPC handles pass vLLM's msgpack to the engine core")]
    if backend == "nccl_m2n":
        engine_cls.update_info_cls(names=dense["names"])
    return []


def check_transfer(arm: ArmPlan, cfg, where: str) -> list[Finding]:
    import torch
    from vllm.config import WeightTransferConfig
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    from harness.paths import PATHS

    backend = arm.requirements.weight_transfer_backend
    placed = layout(backend, arm.engine.tensor_parallel_size, cuda=True)
    path = PATHS.get(f"transfer_{backend}")(arm.checkpoints, arm.prompts)
    engine_cls = WeightTransferEngineFactory._registry[backend]()
    out: list[Finding] = []
    for slot in placed.trainers[:2]:  # the sender and one other rank are every kind there is
        got, init = dry_connect(path, backend, 1 + arm.engine.tensor_parallel_size, slot.rank)
        detail = f"trainer rank {slot.rank}: vLLM's trainer_init {got}"
        if slot.rank == 0 and backend in SENDS_INIT_BEFORE_TRANSPORT:
            if init is None:
                out.append(Finding("problem", where, "trainer", detail + ", but sent the workers no init payload"))
                continue
            engine_cls.init_info_cls(**init)
            detail += f"; its init payload parses as {engine_cls.init_info_cls.__name__}"
        out.append(Finding("ok", where, "trainer", detail))
    engine_cls(WeightTransferConfig(backend=backend), cfg, torch.device("cpu"), torch.nn.Module())
    out.append(Finding("ok", where, "trainer", f"{engine_cls.__name__} accepts the engine's config"))
    return out + check_update_payload(arm, placed, where)


def check_arm(arm: ArmPlan, where: str, request: PreflightRequest) -> list[Finding]:
    from harness.arm.engines import _llm_kwargs

    out: list[Finding] = []
    try:
        kwargs = _llm_kwargs(arm, None, cuda=True)
        cfg = engine_config(kwargs)
    except Exception as exc:  # vLLM's refusal is the finding
        return [Finding("problem", where, "engine-args", _one_line(exc))]
    shown = {k: v for k, v in kwargs.items() if k not in ("model", "worker_extension_cls", "weight_transfer_config")}
    out.append(Finding("ok", where, "engine-args", json.dumps(shown, default=str, sort_keys=True)))
    checks = [
        ("kv-cache", lambda: check_kv_cache(arm, cfg, kwargs, where)),
        ("attention", lambda: check_attention(arm, cfg, request.cuda_capability, where)),
    ]
    if arm.requirements.weight_transfer_backend:
        checks.append(("trainer", lambda: check_transfer(arm, cfg, where)))
    for name, check in checks:
        try:
            out += check()
        except Exception as exc:  # vLLM's refusal is the finding
            out.append(Finding("problem", where, name, _one_line(exc)))
    return out


def _one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:400]


# ---- placement ------------------------------------------------------------------------


class Gate:
    """Where the stand-in tasks of one placement round report in, and wait to be let go: they
    must all hold their resources at once, as the engine, its workers and the trainer do."""

    def __init__(self) -> None:
        self.round = 0
        self.arrived: dict[str, list[str]] = {}

    def open_round(self) -> int:
        self.round += 1
        self.arrived = {}
        return self.round

    def arrive(self, round_: int, key: str, gpu_ids: list[str]) -> None:
        if round_ == self.round:
            self.arrived[key] = gpu_ids

    def report(self) -> dict[str, list[str]]:
        return dict(self.arrived)

    def holding(self, round_: int) -> bool:
        return round_ == self.round


@contextmanager
def leaving_free(ray, total: int, free: float, timeout_s: float) -> Iterator[None]:
    """Hold all but ``free`` of the Ray's ``total`` GPUs, so what is placed inside sees a machine
    (or an arm's Ray) of ``free`` GPUs."""
    from ray.util.placement_group import placement_group, remove_placement_group

    held = total - free
    pg = placement_group([{"GPU": float(held)}], strategy="STRICT_PACK") if held > 0 else None
    if pg is not None and not group_ready(ray, pg, timeout_s):
        raise RuntimeError(f"the preflight's own Ray could not hold {held:g} of its {total} GPUs")
    try:
        yield
    finally:
        if pg is not None:
            remove_placement_group(pg)


def fits(ray, gpus: float, timeout_s: float) -> bool:
    """Whether Ray can give one actor ``gpus`` GPUs on one node now (a placement group of that
    one bundle: no process to start)."""
    from ray.util.placement_group import placement_group, remove_placement_group

    pg = placement_group([{"GPU": float(gpus)}], strategy="STRICT_PACK")
    try:
        return group_ready(ray, pg, timeout_s)
    finally:
        remove_placement_group(pg)


def _hold(gate, round_: int, key: str) -> None:
    """A stand-in: report the GPUs Ray gave it, then hold them until its round is over."""
    import time

    import ray

    gate.arrive.remote(round_, key, [str(g) for g in ray.get_gpu_ids()])
    while ray.get(gate.holding.remote(round_)):
        time.sleep(0.05)


def _stand_in(options: dict[str, Any]) -> dict[str, Any]:
    """Actor options as task options: what Ray places by (resources, scheduling strategy)."""
    return {k: v for k, v in options.items() if k in ("num_cpus", "num_gpus", "scheduling_strategy", "resources")}


def place_together(ray, hold, gate, asks: dict[str, dict[str, Any]], timeout_s: float) -> dict[str, list[str]] | str:
    """Place one stand-in task per ``asks`` entry (name -> Ray options) at once; the GPU ids each
    got, or the names of those not placed once ``timeout_s`` passed with no further one placed.

    The clock restarts at each arrival: Ray starts a worker process per stand-in, at most
    ``num_cpus`` at a time, so on a loaded machine the placeable ones arrive seconds apart, and
    only a wait with no progress at all says that the rest cannot be placed."""
    import time

    round_ = ray.get(gate.open_round.remote())
    refs = [hold.options(**_stand_in(opts), max_retries=0).remote(gate, round_, name) for name, opts in asks.items()]
    try:
        arrived, deadline = 0, time.monotonic() + timeout_s
        while True:
            got = ray.get(gate.report.remote())
            if len(got) == len(asks):
                return got
            if len(got) > arrived:
                arrived, deadline = len(got), time.monotonic() + timeout_s
            elif time.monotonic() > deadline:
                return ", ".join(n for n in asks if n not in got)
            time.sleep(0.05)
    finally:
        ray.get(gate.open_round.remote())  # ends this round: every stand-in placed returns
        done, pending = ray.wait(refs, num_returns=len(refs), timeout=5)
        for ref in pending:  # never placed
            ray.cancel(ref, force=True)


def check_placement(request: PreflightRequest) -> list[Finding]:
    """Every arm on machines of N GPUs, then each transfer arm's engine, workers and trainer
    ranks inside a Ray of the arm's GPUs; one Ray for all of it, told it has the most GPUs any
    check needs, with the rest held by a placement group while a smaller machine is checked."""
    import ray

    from harness.ray_local import init_local_ray

    cells = [c for c in request.cells if c.arms]
    if not cells:
        return []
    total = max(max(c.gpus for c in cells), max(int(-(-a.gpus // 1)) for c in cells for a in c.arms))
    timeout = request.placement_timeout_s
    init_local_ray(ray, num_cpus=2, num_gpus=total, log_to_driver=False, object_store_memory=128 << 20)
    out: list[Finding] = []
    hold, gate = ray.remote(num_cpus=0)(_hold), ray.remote(num_cpus=0)(Gate).remote()
    try:
        # The arms on a machine of N GPUs: each arm's actor (the fan-out's) alone.
        for n in sorted({c.gpus for c in cells}):
            asks: dict[float, str] = {}
            for c in (c for c in cells if c.gpus == n):
                for a in c.arms:
                    asks.setdefault(a.gpus, f"{a.plan.name}[{c.id}]")
            with leaving_free(ray, total, n, timeout):
                for gpus, where in sorted(asks.items()):
                    if not fits(ray, gpus, timeout):
                        out.append(
                            Finding(
                                "problem",
                                where,
                                "placement",
                                f"on {n} GPU(s): the arm's actor (asks {gpus:g} GPU) cannot be placed",
                            )
                        )
                    else:
                        out.append(Finding("ok", where, "placement", f"the arm's actor ({gpus:g} GPU) fits {n} GPU(s)"))
        # Inside each transfer arm: the Ray it starts sees exactly the arm's GPUs.
        seen: set[str] = set()
        for c in cells:
            for a in c.arms:
                backend = a.plan.requirements.weight_transfer_backend
                if not backend:
                    continue
                placed = layout(backend, a.plan.engine.tensor_parallel_size, cuda=True)
                shape = {k: v for k, v in dataclasses.asdict(placed).items() if k != "backend"}
                key = json.dumps([shape, a.gpus], sort_keys=True)
                if key in seen:
                    continue
                seen.add(key)
                with leaving_free(ray, total, a.gpus, timeout):
                    out.append(_place_inside(ray, hold, gate, placed, a.gpus, f"{a.plan.name}[{c.id}]", timeout))
    finally:
        ray.shutdown()
    return out


def _place_inside(ray, hold, gate, placed: TransferLayout, arm_gpus: float, where: str, timeout: float) -> Finding:
    """The engine, its Ray workers and the trainer ranks, placed together in a Ray of
    ``arm_gpus``, with the options the arm gives them (``harness.machinery.placement``)."""
    what = f"{placed.backend} TP {placed.tensor_parallel_size} in the arm's {arm_gpus:g} GPU(s)"
    pg = None
    try:
        pg = engine_placement_group(ray, placed, timeout)
        asks = {"the LLM actor": engine_actor_options(placed, pg)}
        if placed.executor == "ray":
            for r in range(placed.tensor_parallel_size):
                asks[f"vLLM's Ray worker {r}"] = worker_actor_options(placed, pg, r)
        for slot in placed.trainers:
            asks[f"trainer rank {slot.rank}"] = trainer_actor_options(slot, pg)
        got = place_together(ray, hold, gate, asks, timeout)
        if isinstance(got, str):
            return Finding("problem", where, "placement", f"{what}: cannot be placed together: {got}")
        if placed.executor != "ray" and len(got["the LLM actor"]) != placed.tensor_parallel_size:
            return Finding(
                "problem",
                where,
                "placement",
                f"{what}: the LLM actor sees {len(got['the LLM actor'])} "
                f"GPU(s) for its {placed.tensor_parallel_size} workers",
            )
        for slot in placed.trainers:
            mine = got[f"trainer rank {slot.rank}"]
            theirs = got.get(f"vLLM's Ray worker {slot.bundle}") if slot.bundle is not None else None
            if theirs is not None and mine != theirs:
                return Finding(
                    "problem",
                    where,
                    "placement",
                    f"{what}: trainer rank {slot.rank} is on GPU {mine}, its worker on {theirs}; IPC needs them on one GPU",
                )
        return Finding(
            "ok",
            where,
            "placement",
            f"{what}: " + "; ".join(f"{k} on GPU {','.join(v) or '-'}" for k, v in got.items()),
        )
    except PlacementError as exc:
        return Finding("problem", where, "placement", f"{what}: {exc}")
    finally:
        if pg is not None:
            ray.util.remove_placement_group(pg)


def missing_package_findings(request: PreflightRequest) -> list[Finding]:
    from harness.paths.weight_transfer import missing_packages, nccl_library_problem
    from harness.spec.engine_config import missing_modules, missing_modules_reason

    out = []
    # An engine configuration's modules (the HPC cell's hpc-ops), once per cell group.
    for cell_id, packages in sorted({(c.id, c.packages) for c in request.cells if c.packages}):
        missing = missing_modules(packages)
        if missing:
            out.append(Finding("skip", cell_id, "packages", "SKIPPED: " + missing_modules_reason(missing)))
        else:
            out.append(Finding("ok", cell_id, "packages", ", ".join(m for m, _ in packages) + " installed"))
    for backend in sorted(
        {a.plan.requirements.weight_transfer_backend for c in request.cells for a in c.arms} - {None}
    ):
        missing = missing_packages(backend)
        nccl = None if missing else nccl_library_problem(backend, dict(os.environ))
        if nccl:
            out.append(Finding("problem", f"transfer_{backend}", "packages", nccl))
        elif missing:
            out.append(
                Finding(
                    "skip",
                    f"transfer_{backend}",
                    "packages",
                    "SKIPPED on a machine without "
                    + ", ".join(f"{d} ({why})" for d, why in missing)
                    + ": pip install 'refit-harness[gpu-full]'",
                )
            )
        elif BACKENDS[backend].packages:
            out.append(
                Finding(
                    "ok",
                    f"transfer_{backend}",
                    "packages",
                    ", ".join(d for d, _ in BACKENDS[backend].packages) + " installed",
                )
            )
    return out


def run(request: PreflightRequest) -> list[Finding]:
    out: list[Finding] = []
    for c in request.cells:
        out += [Finding("skip", f"{s.path}[{c.id}]", "gpus", f"on {c.gpus} GPU(s): {s.reason}") for s in c.skipped]
    checked: set[str] = set()
    for c in request.cells:
        for a in c.arms:
            plan = store.to_jsonable(a.plan)
            key = json.dumps({k: plan[k] for k in ("engine", "requirements", "start")}, sort_keys=True)
            if key not in checked:
                checked.add(key)
                out += check_arm(a.plan, f"{a.plan.name}[{c.id}]", request)
    out += missing_package_findings(request)
    try:
        out += check_placement(request)
    except Exception as exc:  # Ray itself failing is a problem of its own
        out.append(
            Finding("problem", request.scenario, "placement", f"the placement check could not run: {_one_line(exc)}")
        )
    return out


def main(argv: list[str]) -> int:
    request = store.load(PreflightRequest, Path(argv[0]), "preflight_request")
    findings = run(request)
    store.dump(tuple(findings), Path(argv[1]), "preflight_findings")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

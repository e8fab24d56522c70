"""Census of every tensor reachable from a model, with exact digests.

Runs inside the vLLM worker (through ``harness.worker.extension``) but needs only
torch: it is plain module/object walking. Parameters and buffers are the easy part;
refit bugs live in plain attributes, containers, quant-method and kernel objects,
which this walk also visits.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Iterator
from dataclasses import dataclass

import blake3
import torch
from torch import nn

from harness.records import TensorRecord, UnobservedRecord

# Attribute names never walked: torch's own bookkeeping, and per-step state.
_SKIP_ATTRS = frozenset(
    {
        "_parameters",
        "_buffers",
        "_modules",
        "_forward_hooks",
        "_forward_pre_hooks",
        "_backward_hooks",
        "_state_dict_hooks",
        "_load_state_dict_pre_hooks",
        "kv_cache",
    }
)
# Object types whose attributes are configuration, never kernel state.
_SKIP_TYPE_PREFIXES = ("vllm.config", "transformers.", "torch.", "builtins", "enum", "logging")
_MAX_OBJECT_DEPTH = 3
_MAX_CONTAINER_ITEMS = 4096


@dataclass(frozen=True)
class CensusEntry:
    """A tensor found by the walk, before digesting."""

    name: str
    kind: str
    tensor: torch.Tensor


DIGEST_ALGORITHM = "blake3-128"
"""Name of the digest every record carries (see ``TensorRecord.digest``). Digests are
compared only with digests from the same harness version."""
_DIGEST_CHUNK_BYTES = 64 << 20  # bounds the copy of a non-contiguous or device tensor
_DIGEST_THREADED_BYTES = 1 << 20  # below this, blake3's thread pool costs more than it saves


def tensor_digest(t: torch.Tensor) -> str:
    """blake3-128 of the tensor's bytes in row-major order; dtype and shape are recorded beside it.

    A contiguous CPU tensor is hashed in place through a zero-copy view of its memory;
    a non-contiguous or device tensor is copied to host one chunk of rows at a time, so
    the hash never holds a second copy of a large tensor. The bytes hashed are the same
    either way, so the digest does not depend on the layout.
    """
    if t.device.type == "meta":
        return "meta"
    data = t.detach()
    nbytes = data.numel() * data.element_size()
    hasher = blake3.blake3(max_threads=blake3.blake3.AUTO if nbytes >= _DIGEST_THREADED_BYTES else 1)
    for chunk in _host_chunks(data, nbytes):
        hasher.update(chunk)
    return hasher.hexdigest(length=16)


def _host_chunks(data: torch.Tensor, nbytes: int) -> Iterator[memoryview]:
    """The tensor's bytes in row-major order, as host buffers of at most a chunk (one row
    of dim 0 may be larger), without copying a contiguous CPU tensor."""
    if data.numel() == 0:
        return
    if data.device.type == "cpu" and data.is_contiguous():
        yield _bytes_view(data)
        return
    if data.dim() == 0 or nbytes <= _DIGEST_CHUNK_BYTES:
        yield _bytes_view(data.contiguous().cpu())
        return
    rows = max(1, data.shape[0] * _DIGEST_CHUNK_BYTES // nbytes)
    for start in range(0, data.shape[0], rows):
        yield _bytes_view(data[start : start + rows].contiguous().cpu())


def _bytes_view(data: torch.Tensor) -> memoryview:
    # Through uint8, because numpy has no bfloat16/float8. A C-contiguous n-d buffer hashes
    # as its flat bytes; only a 0-d tensor needs a dimension to be viewed as bytes.
    return memoryview((data if data.dim() else data.reshape(1)).view(torch.uint8).numpy())


def nan_count(t: torch.Tensor) -> int:
    """NaN elements of a tensor (0 for integer and bool dtypes)."""
    if t.device.type == "meta" or t.numel() == 0 or not (t.is_floating_point() or t.is_complex()):
        return 0
    return int(torch.isnan(t.detach()).sum())


def tensor_stats(t: torch.Tensor) -> tuple[int, float]:
    """(nan_count, absmax) of a tensor, cheap enough for every census entry."""
    if t.device.type == "meta" or t.numel() == 0:
        return 0, 0.0
    if t.is_floating_point() or t.is_complex():
        finite = torch.nan_to_num(t.detach().abs().float(), nan=0.0)
        return nan_count(t), float(finite.max())
    return 0, float(t.detach().abs().max()) if t.dtype != torch.bool else 0.0


def walk_model(model: nn.Module, excluded_storages: frozenset[int] = frozenset()) -> list[CensusEntry]:
    """Every tensor reachable from ``model``: parameters, buffers, plain attributes
    (including those set with ``object.__setattr__``), tensors inside list/tuple/dict
    attributes, and attributes of quant-method and other non-module objects.

    ``excluded_storages`` holds storage pointers (e.g. the KV cache) to leave out.
    """
    entries: list[CensusEntry] = []
    tree_modules = {id(m) for m in model.modules()}
    visited_objects: set[int] = set()

    def keep(name: str, kind: str, t: torch.Tensor) -> None:
        if _storage_ptr(t) in excluded_storages:
            return
        entries.append(CensusEntry(name, kind, t))

    def walk_value(value: object, name: str, kind: str, depth: int) -> None:
        if isinstance(value, torch.Tensor):
            keep(name, kind, value)
        elif isinstance(value, nn.Module):
            # Modules in the tree are walked on their own; a module hidden in a plain
            # attribute is not in the tree, so its tensors are reachable only from here.
            if id(value) not in tree_modules and id(value) not in visited_objects:
                visited_objects.add(id(value))
                for sub_name, t in _module_tensors(value):
                    keep(f"{name}.{sub_name}", "attribute", t)
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value[:_MAX_CONTAINER_ITEMS]):
                walk_value(item, f"{name}[{i}]", kind, depth)
        elif isinstance(value, dict):
            for i, (key, item) in enumerate(value.items()):
                if i >= _MAX_CONTAINER_ITEMS:
                    break
                walk_value(item, f"{name}[{key!r}]", kind, depth)
        elif isinstance(value, functools.partial):
            walk_value(value.args, f"{name}<partial>.args", "closure", depth)
            walk_value(value.keywords, f"{name}<partial>.keywords", "closure", depth)
        elif isinstance(value, (types.FunctionType, types.MethodType)) and depth < _MAX_OBJECT_DEPTH:
            # Kernels bound at load time keep their weights in closures, e.g. vLLM's CPU
            # `layer.cpu_linear = lambda x, w, b: ops.weight_packed_linear_cpu(x, packed, ...)`.
            fn = value.__func__ if isinstance(value, types.MethodType) else value
            for var, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
                try:
                    content = cell.cell_contents
                except ValueError:  # an empty cell
                    continue
                walk_value(content, f"{name}<closure>.{var}", "closure", depth + 1)
        elif depth < _MAX_OBJECT_DEPTH and _is_walkable_object(value):
            if id(value) in visited_objects:
                return
            visited_objects.add(id(value))
            for attr, item in _object_attrs(value):
                walk_value(item, f"{name}.{attr}", "object", depth + 1)

    for mod_name, module in model.named_modules():
        prefix = f"{mod_name}." if mod_name else ""
        for p_name, param in module._parameters.items():
            if param is not None:
                keep(prefix + p_name, "parameter", param)
        for b_name, buf in module._buffers.items():
            if buf is not None:
                keep(prefix + b_name, "buffer", buf)
        for attr, value in vars(module).items():
            if attr in _SKIP_ATTRS:
                continue
            walk_value(value, prefix + attr, "attribute", 0)
    return entries


def _module_tensors(module: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    yield from module.named_parameters()
    yield from module.named_buffers()


def _is_walkable_object(value: object) -> bool:
    if isinstance(value, (type, types.FunctionType, types.MethodType, types.ModuleType)):
        return False
    if not hasattr(value, "__dict__"):
        return False
    return not (type(value).__module__ or "").startswith(_SKIP_TYPE_PREFIXES)


def _object_attrs(value: object) -> Iterator[tuple[str, object]]:
    try:
        items = list(vars(value).items())
    except TypeError:
        return
    yield from ((k, v) for k, v in items if k not in _SKIP_ATTRS)


def _storage_ptr(t: torch.Tensor) -> int:
    if t.device.type == "meta":
        return -1
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return -1


PROBE_ROWS = 3
PROBE_SEED = 20260


def probe_linear_kernels(model: nn.Module, unobserved: list[UnobservedRecord] | None = None) -> list[CensusEntry]:
    """Fingerprint what each linear kernel computes, by running it on a fixed input.

    Kernels may consume weights no tensor walk can digest: vLLM's CPU backend repacks
    every linear weight into an opaque oneDNN handle and leaves the registered
    parameter empty. The output of ``quant_method.apply(layer, x)`` on a fixed ``x``
    is a function of exactly the weights the kernel reads, so its digest is compared
    like any other tensor (bias excluded: it is a parameter of its own).

    A kernel that cannot be run this way (e.g. an SSM mixer's projection, which has no
    ``cpu_linear`` on CPU) is appended to ``unobserved`` with the reason, and the probe
    goes on: an unseen architecture must never crash the census.
    """
    entries = []
    gen = torch.Generator().manual_seed(PROBE_SEED)
    with torch.inference_mode():
        for mod_name, module in model.named_modules():
            method = getattr(module, "quant_method", None)
            # A replicated linear (an MoE router: vLLM's GateLinear) has no TP partition of its
            # input and names its width ``input_size``; its packed kernel goes stale all the same.
            in_features = getattr(module, "input_size_per_partition", None)
            if in_features is None and any(c.__name__ == "ReplicatedLinear" for c in type(module).__mro__):
                in_features = getattr(module, "input_size", None)
            if method is None or not hasattr(method, "apply") or not isinstance(in_features, int):
                continue
            name = f"{mod_name}.<kernel-output>"
            try:
                dtype = getattr(module, "params_dtype", torch.float32)
                device = next((p.device for p in module.parameters() if p.device.type != "meta"), torch.device("cpu"))
                x = torch.randn(PROBE_ROWS, in_features, generator=gen).to(device=device, dtype=dtype)
                out = method.apply(module, x, None)
                if not isinstance(out, torch.Tensor):
                    raise TypeError(f"quant_method.apply returned {type(out).__name__}, not a tensor")
            except Exception as exc:
                if unobserved is not None:
                    unobserved.append(UnobservedRecord(name, "kernel", _reason(exc)))
                continue
            entries.append(CensusEntry(name, "kernel", out))
    return entries


def _reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".strip()[:300]


def observe_entry(entry: CensusEntry, rank: int = 0) -> TensorRecord | UnobservedRecord:
    """The record of one census entry on worker ``rank``, or why it cannot be digested."""
    t = entry.tensor
    try:
        nan_count, absmax = tensor_stats(t)
        return TensorRecord(
            name=entry.name,
            kind=entry.kind,
            dtype=str(t.dtype).removeprefix("torch."),
            shape=tuple(t.shape),
            device=str(t.device),
            address=int(t.data_ptr()) if t.device.type != "meta" else 0,
            digest=tensor_digest(t),
            nan_count=nan_count,
            absmax=absmax,
            rank=rank,
        )
    except Exception as exc:
        return UnobservedRecord(entry.name, entry.kind, _reason(exc), rank=rank)

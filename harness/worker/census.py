"""Census of every tensor reachable from a model, with exact digests.

Runs inside the vLLM worker (through ``harness.worker.extension``) but needs only
torch: it is plain module/object walking. Parameters and buffers are the easy part;
refit bugs live in plain attributes, containers, quant-method and kernel objects,
which this walk also visits.
"""

from __future__ import annotations

import enum
import functools
import math
import struct
import types
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from harness.records import TensorRecord, UnobservedRecord
from harness.worker import digest as digests

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
        # A LoRA layer's punica wrapper holds the last batch's token-to-adapter indices: per-step
        # scheduling state rebuilt before every forward, like the KV cache, not weights.
        "punica_wrapper",
        "punica_wrapper_mapping",
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


def tensor_digest(t: torch.Tensor, algorithm: str = digests.XXH3) -> str:
    """The exact digest of ``t``'s bytes in row-major order (``harness.worker.digest``); dtype
    and shape are recorded beside it."""
    return digests.digest(t, algorithm)


def nan_count(t: torch.Tensor) -> int:
    """NaN elements of a tensor (0 for integer and bool dtypes)."""
    if t.device.type == "meta" or t.numel() == 0 or not (t.is_floating_point() or t.is_complex()):
        return 0
    data = t.detach()
    if data.is_floating_point():
        try:
            if not torch.isnan(data.max()):  # one read, no copy: a NaN anywhere makes the max NaN
                return 0
        except (RuntimeError, NotImplementedError):  # a dtype without a max kernel here
            pass
    return int(torch.isnan(data).sum())


def tensor_stats(t: torch.Tensor) -> tuple[int, float]:
    """(nan_count, absmax) of a tensor, cheap enough for every census entry: one read of a
    tensor without NaN (its min and max), where the exact count below reads it four times
    and copies it twice (measured: 60 ms against 1.25 s for 128 MiB of float32). The
    absmax is the largest |finite value| as float32, an infinity counting as float32's largest."""
    if t.device.type == "meta" or t.numel() == 0:
        return 0, 0.0
    data = t.detach()
    if data.is_floating_point():
        try:
            lo, hi = (x.item() for x in torch.aminmax(data))
        except (RuntimeError, NotImplementedError):  # a dtype without an aminmax kernel here
            lo = hi = math.nan
        if lo == lo and hi == hi:  # no NaN anywhere: NaN propagates through min and max
            return 0, _float32(max(-lo, hi))
    if data.is_floating_point() or data.is_complex():
        finite = torch.nan_to_num(data.abs().float(), nan=0.0)
        return nan_count(data), float(finite.max())
    return 0, float(data.abs().max()) if data.dtype != torch.bool else 0.0


_FLOAT32_MAX = float(torch.finfo(torch.float32).max)


def _float32(x: float) -> float:
    """``x`` rounded to float32, an infinity (or a value beyond float32) as float32's largest."""
    try:
        y = struct.unpack("f", struct.pack("f", x))[0]
    except OverflowError:
        return _FLOAT32_MAX
    return _FLOAT32_MAX if math.isinf(y) else y


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


@dataclass(frozen=True)
class NumberEntry:
    """A Python number found by the walk: a float, or an int whose name is private."""

    name: str
    kind: str
    value: float | int


def walk_numbers(model: nn.Module) -> list[NumberEntry]:
    """Python numbers the kernels may read instead of a tensor: every ``float`` attribute of a
    module, and every ``int`` attribute whose name starts with ``_`` (public ints are shapes and
    counts from the config), on the module itself and on the non-module objects it holds (its
    quant method, its attention implementation). vLLM's attention takes ``_k_scale_float`` and
    ``_v_scale_float`` from the KV-scale tensors at load and passes them to the kernel: a refit
    that refreshed the tensors but not the floats is only visible here. Bools are flags, never
    numbers; the walk never descends into containers (their numbers are configuration)."""
    entries: list[NumberEntry] = []
    seen: set[int] = set()

    def numbers_of(owner: object, prefix: str, kind: str, depth: int) -> None:
        try:
            items = list(vars(owner).items())
        except TypeError:
            return
        for attr, value in items:
            if attr in _SKIP_ATTRS or isinstance(value, bool):
                continue
            if isinstance(value, float) or (isinstance(value, int) and attr.startswith("_")):
                entries.append(NumberEntry(f"{prefix}{attr}", kind, value))
            elif (
                depth == 0
                and not isinstance(value, (nn.Module, torch.Tensor, enum.Enum))  # an enum's _sort_order_ is no state
                and _is_walkable_object(value)
                and id(value) not in seen
            ):
                seen.add(id(value))
                numbers_of(value, f"{prefix}{attr}.", "number", depth + 1)

    for mod_name, module in model.named_modules():
        numbers_of(module, f"{mod_name}." if mod_name else "", "number", 0)
    return entries


def number_digest(value: float | int) -> str:
    """blake3-128 of the number's exact value (a float's hex form: no rounding); numbers are
    digested the same way whatever the run's tensor digest, so they compare across runs."""
    import blake3

    text = f"float:{value.hex()}" if isinstance(value, float) else f"int:{value}"
    return blake3.blake3(text.encode()).hexdigest(length=16)


def observe_number(entry: NumberEntry, rank: int = 0) -> TensorRecord:
    """The record of a number: judged like a 0-d tensor (a NaN counts as a difference)."""
    value = entry.value
    is_nan = isinstance(value, float) and math.isnan(value)
    finite = not isinstance(value, float) or math.isfinite(value)
    return TensorRecord(
        name=entry.name,
        kind="number",
        dtype="float" if isinstance(value, float) else "int",
        shape=(),
        device="host",
        address=0,
        digest=number_digest(value),
        nan_count=int(is_nan),
        absmax=float(abs(value)) if finite else 0.0,
        rank=rank,
        value=value if finite else None,
    )


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
            if in_features is None and callable(getattr(module, "tie_weights", None)):
                # vLLM's ParallelLMHead: its quant method computes the logits, on CPU through a
                # kernel copy (a packed weight or a oneDNN handle) built from the weight at load,
                # which for a tied head is the embedding's parameter.
                in_features = getattr(module, "embedding_dim", None)
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
            # A kernel may keep a derived copy of the bias that it reads only when given one
            # (the CPU int8 AMX path's ``bias_fp32``; the W4A8 path converts ``bias`` to fp32):
            # a second probe with the layer's own bias reaches it.
            bias = getattr(module, "bias", None)
            if isinstance(bias, torch.Tensor) and bias.numel() and bias.device.type != "meta":
                with_bias = f"{mod_name}.<kernel-output+bias>"
                try:
                    entries.append(CensusEntry(with_bias, "kernel", method.apply(module, x, bias)))
                except Exception as exc:
                    if unobserved is not None:
                        unobserved.append(UnobservedRecord(with_bias, "kernel", _reason(exc)))
    return entries


_KERNEL_ATTRS = ("kernel", "fp8_linear", "linear_kernel")


def quant_kernels(model: nn.Module) -> tuple[str, ...]:
    """The quantized linear kernels the model's layers run, each as
    ``<quant method or scheme>/<kernel class>[:<the kernel's chosen method>]``, sorted and
    deduplicated, e.g. ``CompressedTensorsW8A8Int8/CPUInt8ScaledMMLinearKernel:_apply_weights_onednn``
    (vLLM's CPU int8 kernel picks its AMX or oneDNN path per layer at load) or
    ``AutoGPTQLinearMethod/CPUWNA16LinearKernel:w4a8`` (the int4 kernel's ``layer.use_w4a8``). Known
    issues of one kernel path are scoped on these; unquantized layers are not listed."""
    found = set()
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        if (
            method is None
            or type(method).__name__ == "UnquantizedLinearMethod"
            or not hasattr(module, "input_size_per_partition")
        ):
            continue
        owner = getattr(module, "scheme", None) or method
        kernel = next((k for a in _KERNEL_ATTRS if (k := getattr(owner, a, None)) is not None), None)
        if kernel is None:
            found.add(type(owner).__name__)
            continue
        chosen = getattr(kernel, "linear_method", None)
        suffix = f":{getattr(chosen, '__name__', type(chosen).__name__)}" if chosen is not None else ""
        if isinstance(getattr(module, "use_w4a8", None), bool):  # CPUWNA16's per-layer choice
            suffix += ":w4a8" if module.use_w4a8 else ":w4a16"
        found.add(f"{type(owner).__name__}/{type(kernel).__name__}{suffix}")
    return tuple(sorted(found))


def _reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".strip()[:300]


def observe_entries(
    entries: Sequence[CensusEntry], rank: int = 0, algorithm: str = digests.XXH3
) -> list[TensorRecord | UnobservedRecord]:
    """The record of each census entry on worker ``rank``, or why it cannot be digested; the
    digests are taken in one call (``digest_many``), the way they run at memory speed."""
    found = digests.digest_many([e.tensor for e in entries], algorithm)
    return [observe_entry(entry, rank, algorithm, digest) for entry, digest in zip(entries, found)]


def observe_entry(
    entry: CensusEntry, rank: int = 0, algorithm: str = digests.XXH3, digest: str | Exception | None = None
) -> TensorRecord | UnobservedRecord:
    """The record of one census entry on worker ``rank``, or why it cannot be digested;
    ``digest`` is its digest (or what stopped it) when already taken."""
    t = entry.tensor
    try:
        if isinstance(digest, Exception):
            raise digest
        nan_count, absmax = tensor_stats(t)
        return TensorRecord(
            name=entry.name,
            kind=entry.kind,
            dtype=str(t.dtype).removeprefix("torch."),
            shape=tuple(t.shape),
            device=str(t.device),
            address=int(t.data_ptr()) if t.device.type != "meta" else 0,
            digest=digest if digest is not None else tensor_digest(t, algorithm),
            nan_count=nan_count,
            absmax=absmax,
            rank=rank,
        )
    except Exception as exc:
        return UnobservedRecord(entry.name, entry.kind, _reason(exc), rank=rank)

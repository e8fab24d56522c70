"""Quantized checkpoints written by the harness itself, deterministically, in the on-disk
formats vLLM loads, and what each quantized tensor *is* (its role), for the perturbation.

A writer takes a float checkpoint (a zoo family) and quantizes every linear projection of
its decoder layers (``*.layers.N.*_proj.weight``: attention and MLP, never embeddings, norms,
``lm_head`` or MoE experts); the other tensors are copied. The formats and the tensor names,
dtypes and shapes are read from vLLM 0.32's loaders:

- ``ct-w8a8-int8`` / ``ct-w8a8-int8-asym``: compressed-tensors ``int-quantized``, static
  per-channel int8 weights (``weight`` I8 ``[N, K]``, ``weight_scale`` ``[N, 1]``), dynamic
  per-token int8 activations, symmetric or asymmetric (``CompressedTensorsW8A8Int8``;
  CPU kernel ``CPUInt8ScaledMMLinearKernel``: the AMX ``sgl`` path for symmetric inputs, the
  oneDNN path with an ``azp_adj`` term for asymmetric ones).
- ``gptq-int4``: GPTQ v1, 4-bit symmetric, group 32 (``qweight`` I32 ``[K/8, N]`` packed along
  the input dim, ``scales`` F16 ``[K/32, N]``, ``qzeros`` I32 ``[K/32, N/8]`` holding the
  format's constant 7s, ``g_idx`` I32 ``[K]``; ``AutoGPTQLinearMethod`` ->
  ``CPUWNA16LinearKernel``).
- ``awq-int4``: AWQ GEMM, 4-bit with zero points, group 32 (``qweight`` I32 ``[K, N/8]``
  packed along the output dim in AWQ's order 0 2 4 6 1 3 5 7, ``qzeros`` I32 ``[K/32, N/8]``,
  ``scales`` F16 ``[K/32, N]``; ``AutoAWQMarlinLinearMethod`` -> ``CPUWNA16LinearKernel``).
- ``ct-fp8-w8a8``: compressed-tensors ``float-quantized``, per-channel e4m3 weights
  (``weight`` F8_E4M3 ``[N, K]``, ``weight_scale`` F32 ``[N, 1]``) and dynamic per-token fp8
  activations (``CompressedTensorsW8A8Fp8``).
- ``ct-fp8-static``: per-tensor e4m3 weights with a static per-tensor input scale
  (``weight_scale`` ``[1]``, ``input_scale`` ``[1]``).
- ``fp8-block``: compressed-tensors e4m3 weights in 64 x 128 blocks (``weight_scale``
  ``[N/64, K/128]``), dynamic per-group activations (DeepSeek-V3 style, smaller N blocks).
- ``fixture-boot-max-scale`` / ``fixture-fresh-max-scale``: the harness's planted quant
  fixture (``harness.worker.fixtures.quant``): int8 weights with one scale per checkpoint
  tensor, combined per fused module into a max scale.

Whether vLLM's CPU backend has a kernel for a format is measured, not assumed: a cell whose
engine vLLM refuses is SKIPPED with vLLM's words (``docs/quantized.md`` has the grid).
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from harness import safetensors_files
from harness.checkpoints.read import weight_files
from harness.errors import CheckpointError
from harness.registry import Registry

if TYPE_CHECKING:
    import torch

WRITER_VERSION = "quantize-v1"
"""Version of the writers' output bytes: part of a quantized zoo model's cache key."""

_LINEAR = re.compile(r"\.layers\.\d+\.(?:[\w.]+\.)?(?P<proj>\w+_proj)\.weight$")
_EXPERT = re.compile(r"\.experts?\.|shared_expert")


def quantizable(name: str, shape: tuple[int, ...]) -> bool:
    """A decoder layer's linear projection (attention or MLP, not an expert) that every CPU
    kernel can take: 2-D, both dims multiples of 32 (CPUWNA16 and the AMX tiles need it)."""
    return (
        bool(_LINEAR.search(name))
        and not _EXPERT.search(name)
        and len(shape) == 2
        and shape[0] % 32 == 0
        and shape[1] % 32 == 0
    )


@dataclass(frozen=True)
class QuantFormat:
    """One on-disk quantized format the harness writes."""

    name: str
    """Registry name, e.g. ``ct-w8a8-int8``."""
    quant_method: str
    """``quantization_config.quant_method`` in config.json (what vLLM dispatches on)."""
    summary: str
    """One line: weights, scales and activations of the format."""
    write: Callable[[dict[str, torch.Tensor]], tuple[dict[str, torch.Tensor], dict]]
    """Float tensors -> (the checkpoint's tensors, its ``quantization_config``)."""


def quantized(source: str | Path, fmt: str, dest: Path) -> Path:
    """``dest``: ``source`` (a float checkpoint) with its linear projections quantized in format
    ``fmt``, written once across processes (``harness.cache.cached_variant``)."""
    from harness.cache import cached_variant

    return cached_variant(dest, lambda staging: write_quantized(source, fmt, staging))


def write_quantized(source: str | Path, fmt: str, staging: Path) -> None:
    """Write into the empty directory ``staging`` the checkpoint ``source`` with its linear
    projections quantized in format ``fmt``: one file, ``model.safetensors``; config and tokenizer
    copied, the config given the format's ``quantization_config``. Deterministic: no randomness,
    so the same source always gives the same bytes."""
    from safetensors.torch import save_file

    quant = QUANT_FORMATS.get(fmt)
    floats = dict(safetensors_files.tensors(weight_files(source)))
    tensors, qconfig = quant.write(floats)
    staging.mkdir(parents=True, exist_ok=True)
    for f in Path(source).iterdir():
        if f.is_file() and not f.name.endswith(".safetensors") and f.name != safetensors_files.INDEX:
            shutil.copy2(f, staging / f.name)
    config = json.loads((staging / "config.json").read_text())
    config["quantization_config"] = qconfig
    (staging / "config.json").write_text(json.dumps(config, indent=2))
    save_file(
        {k: v.contiguous() for k, v in sorted(tensors.items())},
        str(staging / "model.safetensors"),
        metadata={"format": "pt"},
    )


def recipe_key(fmt: str) -> str:
    """What a quantized model's bytes depend on besides its source: the format and the
    writers' version."""
    QUANT_FORMATS.target(fmt)  # an unknown format is a usage error, named with the available ones
    return hashlib.sha256(f"{fmt}|{WRITER_VERSION}".encode()).hexdigest()[:8]


# ---- int4 packing (GPTQ and AWQ), shared with the perturbation ----------------------------

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
"""AWQ's bit-slot order: slot i of an int32 holds value ``AWQ_ORDER[i]`` of its 8."""


def pack_int4(values: torch.Tensor, dim: int, order: tuple[int, ...] | None = None) -> torch.Tensor:
    """Values in [0, 15], 8 per int32 along ``dim``; slot i (bits 4i..4i+3) holds value
    ``order[i]`` of each run of 8 (GPTQ: in order; AWQ: ``AWQ_ORDER``)."""
    import torch

    v = values.to(torch.int32).movedim(dim, -1)
    if v.shape[-1] % 8:
        raise CheckpointError(f"cannot pack {v.shape[-1]} int4 values into int32 (not a multiple of 8)")
    v = v.reshape(*v.shape[:-1], v.shape[-1] // 8, 8)
    if order is not None:
        v = v[..., list(order)]
    packed = torch.zeros(v.shape[:-1], dtype=torch.int32)
    for i in range(8):
        packed |= (v[..., i] & 0xF) << (4 * i)
    return packed.movedim(-1, dim).contiguous()


def unpack_int4(packed: torch.Tensor, dim: int, order: tuple[int, ...] | None = None) -> torch.Tensor:
    """The inverse of ``pack_int4``."""
    import torch

    p = packed.movedim(dim, -1)
    slots = torch.stack([(p >> (4 * i)) & 0xF for i in range(8)], dim=-1)
    if order is not None:
        slots = slots[..., [order.index(j) for j in range(8)]]
    return slots.reshape(*p.shape[:-1], p.shape[-1] * 8).movedim(-1, dim).contiguous()


# ---- writers ------------------------------------------------------------------------------


def _split(floats: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(linear weights to quantize, everything else)."""
    lin = {k: v for k, v in floats.items() if quantizable(k, tuple(v.shape)) and v.is_floating_point()}
    if not lin:
        raise CheckpointError("no decoder-layer linear projection (*.layers.N.*_proj.weight) to quantize")
    return lin, {k: v for k, v in floats.items() if k not in lin}


def _prefix(name: str) -> str:
    return name.removesuffix("weight")


def _ct_config(group: dict, fmt: str) -> dict:
    return {
        "quant_method": "compressed-tensors",
        "format": fmt,
        "quantization_status": "compressed",
        "config_groups": {"group_0": {"targets": ["Linear"], **group}},
        "ignore": ["lm_head"],
        "kv_cache_scheme": None,
    }


def _int8_channel(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    import torch

    w = w.float()
    scale = w.abs().amax(dim=1, keepdim=True).clamp(min=1e-8) / 127.0
    return torch.round(w / scale).clamp(-128, 127).to(torch.int8), scale


def _write_ct_int8(floats: dict, symmetric_input: bool) -> tuple[dict, dict]:
    lin, out = _split(floats)
    for name, w in lin.items():
        out[name], out[_prefix(name) + "weight_scale"] = _int8_channel(w)
    act = {"num_bits": 8, "type": "int", "symmetric": symmetric_input, "strategy": "token", "dynamic": True}
    weights = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel", "dynamic": False}
    return out, _ct_config({"weights": weights, "input_activations": act}, "int-quantized")


def write_ct_w8a8_int8(floats: dict) -> tuple[dict, dict]:
    return _write_ct_int8(floats, symmetric_input=True)


def write_ct_w8a8_int8_asym(floats: dict) -> tuple[dict, dict]:
    return _write_ct_int8(floats, symmetric_input=False)


GROUP = 32
"""Group size of the int4 formats (a multiple of 2 and a divisor of every zoo dim)."""


def write_gptq_int4(floats: dict) -> tuple[dict, dict]:
    import torch

    lin, out = _split(floats)
    for name, w in lin.items():
        wt = w.float().t()  # [K, N]
        k, n = wt.shape
        grouped = wt.reshape(k // GROUP, GROUP, n)
        scales = (grouped.abs().amax(dim=1) / 7.0).clamp(min=1e-6).to(torch.float16)  # [K/G, N]
        q = torch.round(grouped / scales.float()[:, None, :]).clamp(-8, 7).to(torch.int32) + 8  # uint4b8
        p = _prefix(name)
        out[p + "qweight"] = pack_int4(q.reshape(k, n), 0)
        out[p + "scales"] = scales
        out[p + "qzeros"] = pack_int4(torch.full((k // GROUP, n), 7, dtype=torch.int32), 1)  # v1: zero - 1
        out[p + "g_idx"] = torch.arange(k, dtype=torch.int32) // GROUP
    qconfig = {
        "quant_method": "gptq",
        "bits": 4,
        "group_size": GROUP,
        "desc_act": False,
        "sym": True,
        "lm_head": False,
        "damp_percent": 0.01,
        "true_sequential": True,
        "static_groups": False,
    }
    return out, qconfig


def write_awq_int4(floats: dict) -> tuple[dict, dict]:
    import torch

    lin, out = _split(floats)
    for name, w in lin.items():
        wt = w.float().t()  # [K, N]
        k, n = wt.shape
        grouped = wt.reshape(k // GROUP, GROUP, n)
        lo, hi = grouped.amin(dim=1), grouped.amax(dim=1)
        scales = ((hi - lo).clamp(min=1e-5) / 15.0).to(torch.float16)  # [K/G, N]
        zeros = torch.round(-lo / scales.float()).clamp(0, 15).to(torch.int32)
        q = (torch.round(grouped / scales.float()[:, None, :]) + zeros[:, None, :]).clamp(0, 15).to(torch.int32)
        p = _prefix(name)
        out[p + "qweight"] = pack_int4(q.reshape(k, n), 1, AWQ_ORDER)
        out[p + "qzeros"] = pack_int4(zeros, 1, AWQ_ORDER)
        out[p + "scales"] = scales
    return out, {"quant_method": "awq", "bits": 4, "group_size": GROUP, "zero_point": True, "version": "gemm"}


def _fp8(w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    import torch

    fmax = torch.finfo(torch.float8_e4m3fn).max
    return (w / scale).clamp(-fmax, fmax).to(torch.float8_e4m3fn)


def write_ct_fp8_w8a8(floats: dict) -> tuple[dict, dict]:
    import torch

    lin, out = _split(floats)
    fmax = torch.finfo(torch.float8_e4m3fn).max
    for name, w in lin.items():
        w = w.float()
        scale = w.abs().amax(dim=1, keepdim=True).clamp(min=1e-8) / fmax
        out[name], out[_prefix(name) + "weight_scale"] = _fp8(w, scale), scale
    weights = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "channel", "dynamic": False}
    act = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "token", "dynamic": True}
    return out, _ct_config({"weights": weights, "input_activations": act}, "float-quantized")


def write_ct_fp8_static(floats: dict) -> tuple[dict, dict]:
    import torch

    lin, out = _split(floats)
    fmax = torch.finfo(torch.float8_e4m3fn).max
    for name, w in lin.items():
        w = w.float()
        scale = (w.abs().amax().clamp(min=1e-8) / fmax).reshape(1)
        p = _prefix(name)
        out[name], out[p + "weight_scale"] = _fp8(w, scale), scale
        out[p + "input_scale"] = torch.tensor([4.0 / fmax])  # activations of the tiny models stay within +-4
    weights = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "tensor", "dynamic": False}
    act = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "tensor", "dynamic": False}
    return out, _ct_config({"weights": weights, "input_activations": act}, "float-quantized")


BLOCK = (64, 128)
"""Block shape (N, K) of the ``fp8-block`` format: the CPU fp8 block kernels take K blocks of
128 only and N blocks of a multiple of 32, and vLLM's loader needs every fused shard (the tiny
models' k/v projections have 64 rows) to start on a block."""


def write_fp8_block(floats: dict) -> tuple[dict, dict]:
    import torch

    lin, out = _split(floats)
    fmax = torch.finfo(torch.float8_e4m3fn).max
    bn, bk = BLOCK
    for name, w in lin.items():
        w = w.float()
        n, k = w.shape
        nb, kb = -(-n // bn), -(-k // bk)
        padded = torch.zeros(nb * bn, kb * bk)
        padded[:n, :k] = w
        blocks = padded.reshape(nb, bn, kb, bk)
        scale = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-8) / fmax  # [N/bn, K/bk]
        q = (blocks / scale[:, None, :, None]).reshape(nb * bn, kb * bk)[:n, :k]
        out[name], out[_prefix(name) + "weight_scale"] = q.clamp(-fmax, fmax).to(torch.float8_e4m3fn), scale
    weights = {
        "num_bits": 8,
        "type": "float",
        "symmetric": True,
        "strategy": "block",
        "dynamic": False,
        "block_structure": list(BLOCK),
    }
    act = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "group", "dynamic": True, "group_size": bk}
    return out, _ct_config({"weights": weights, "input_activations": act}, "float-quantized")


def _write_fixture(floats: dict, quant_method: str) -> tuple[dict, dict]:
    import torch

    lin, out = _split(floats)
    for name, w in lin.items():
        w = w.float()
        scale = (w.abs().amax().clamp(min=1e-8) / 127.0).reshape(1)
        out[name] = torch.round(w / scale).clamp(-128, 127).to(torch.int8)
        out[_prefix(name) + "weight_scale"] = scale
    return out, {"quant_method": quant_method}


def write_fixture_boot_max_scale(floats: dict) -> tuple[dict, dict]:
    return _write_fixture(floats, "refit_fixture_boot_max_scale")


def write_fixture_fresh_max_scale(floats: dict) -> tuple[dict, dict]:
    return _write_fixture(floats, "refit_fixture_fresh_max_scale")


_M = "harness.checkpoints.quantize"
CT_W8A8_INT8 = QuantFormat(
    "ct-w8a8-int8",
    "compressed-tensors",
    "int8 per-channel weights, dynamic per-token symmetric int8 activations",
    write_ct_w8a8_int8,
)
CT_W8A8_INT8_ASYM = QuantFormat(
    "ct-w8a8-int8-asym",
    "compressed-tensors",
    "int8 per-channel weights, dynamic per-token asymmetric int8 activations",
    write_ct_w8a8_int8_asym,
)
GPTQ_INT4 = QuantFormat("gptq-int4", "gptq", "GPTQ 4-bit symmetric, group 32, no act-order", write_gptq_int4)
AWQ_INT4 = QuantFormat("awq-int4", "awq", "AWQ GEMM 4-bit with zero points, group 32", write_awq_int4)
CT_FP8_W8A8 = QuantFormat(
    "ct-fp8-w8a8",
    "compressed-tensors",
    "e4m3 per-channel weights, dynamic per-token fp8 activations",
    write_ct_fp8_w8a8,
)
CT_FP8_STATIC = QuantFormat(
    "ct-fp8-static",
    "compressed-tensors",
    "e4m3 per-tensor weights, static per-tensor fp8 input scale",
    write_ct_fp8_static,
)
FP8_BLOCK = QuantFormat(
    "fp8-block",
    "compressed-tensors",
    "e4m3 weights in 64x128 blocks, dynamic per-group fp8 activations",
    write_fp8_block,
)
FIXTURE_BOOT_MAX_SCALE = QuantFormat(
    "fixture-boot-max-scale",
    "refit_fixture_boot_max_scale",
    "planted bug: int8 per-tensor scales combined into a max scale at cold start only",
    write_fixture_boot_max_scale,
)
FIXTURE_FRESH_MAX_SCALE = QuantFormat(
    "fixture-fresh-max-scale",
    "refit_fixture_fresh_max_scale",
    "fixed twin: the combined max scale recomputed on every load",
    write_fixture_fresh_max_scale,
)

QUANT_FORMATS: Registry[QuantFormat] = Registry("quantized checkpoint format")
for _name, _attr in (
    ("ct-w8a8-int8", "CT_W8A8_INT8"),
    ("ct-w8a8-int8-asym", "CT_W8A8_INT8_ASYM"),
    ("gptq-int4", "GPTQ_INT4"),
    ("awq-int4", "AWQ_INT4"),
    ("ct-fp8-w8a8", "CT_FP8_W8A8"),
    ("ct-fp8-static", "CT_FP8_STATIC"),
    ("fp8-block", "FP8_BLOCK"),
    ("fixture-boot-max-scale", "FIXTURE_BOOT_MAX_SCALE"),
    ("fixture-fresh-max-scale", "FIXTURE_FRESH_MAX_SCALE"),
):
    QUANT_FORMATS.register(_name, f"{_M}:{_attr}")


# ---- what each tensor of a quantized checkpoint is ----------------------------------------

Role = Literal["int-codes", "int4-packed", "fp8-codes", "scale", "int-zero-point", "int4-zero-points", "layout"]
"""How a quantized checkpoint's tensor is perturbed (``harness.checkpoints.perturb``):
- ``int-codes``: integer weights, each moved one step within ``bits``;
- ``int4-packed``: int32 words of eight 4-bit codes, each code moved one step in [0, 15];
- ``fp8-codes``: e4m3 weights, each to a neighbouring finite code;
- ``scale``: a positive float scale, multiplied by ``1 + strength * n``;
- ``int-zero-point`` / ``int4-zero-points``: zero points, moved like codes;
- ``layout``: what the format fixes (``g_idx``, ``weight_shape``, GPTQ's symmetric ``qzeros``):
  left as it is."""

_SCALE_LEAVES = frozenset(
    {"weight_scale", "weight_scale_inv", "input_scale", "scales", "weight_global_scale", "k_scale", "v_scale"}
)


@dataclass(frozen=True)
class TensorRole:
    """What one tensor of a quantized checkpoint is."""

    role: Role
    """See ``Role``."""
    bits: int = 8
    """Code width for ``int-codes``/``int-zero-point`` (signed range ``[-2^(bits-1), 2^(bits-1)-1]``)."""


def quantization_config(directory: str | Path) -> dict | None:
    """The checkpoint's ``quantization_config`` (config.json, or ``quantize_config.json`` as
    AutoGPTQ writes it), or None for a float checkpoint."""
    d = Path(directory)
    try:
        config = json.loads((d / "config.json").read_text())
    except (OSError, ValueError):
        return None
    qc = config.get("quantization_config") or config.get("compression_config")
    if not qc and (d / "quantize_config.json").is_file():
        try:
            qc = json.loads((d / "quantize_config.json").read_text())
            qc.setdefault("quant_method", "gptq")
        except (OSError, ValueError):
            return None
    return qc if isinstance(qc, dict) and qc else None


def quantizes_weights(qconfig: dict | None) -> bool:
    """Whether a ``quantization_config`` stores weights quantized (a compressed-tensors config
    with no weight scheme, such as the fp8 KV-cache scales alone, keeps them float)."""
    if not qconfig:
        return False
    if str(qconfig.get("quant_method", "")).lower() == "compressed-tensors":
        return any((g or {}).get("weights") for g in (qconfig.get("config_groups") or {}).values())
    return True


def describe_quantization(qconfig: dict | None) -> str | None:
    """A short name for a checkpoint's quantization, for known issues scoped on the format before
    any engine ran: ``<quant_method>/<weight type>/<weight strategy>``, e.g.
    ``compressed-tensors/float/block``, ``compressed-tensors/int/channel``, ``gptq/int/group``,
    ``fp8/float/block``, ``compressed-tensors/kv-cache`` (KV-cache scales beside float weights);
    None for a float checkpoint."""
    if not qconfig:
        return None
    method = str(qconfig.get("quant_method", "")).lower()
    if method == "compressed-tensors":
        groups = [g.get("weights") or {} for g in (qconfig.get("config_groups") or {}).values()]
        weights = next((w for w in groups if w), {})
        if not weights and qconfig.get("kv_cache_scheme"):
            return f"{method}/kv-cache"  # float weights; only the KV cache's scales
        return f"{method}/{weights.get('type', '?')}/{weights.get('strategy', '?')}"
    if method in ("gptq", "awq", "auto_gptq", "auto_awq", "gptq_marlin", "awq_marlin"):
        return f"{method}/int/{'channel' if qconfig.get('group_size', -1) == -1 else 'group'}"
    if method == "fp8":
        return f"fp8/float/{'block' if qconfig.get('weight_block_size') else 'tensor'}"
    return method


def role_of(qconfig: dict, name: str, dtype: str) -> TensorRole | None:
    """The role of tensor ``name`` (safetensors dtype code ``dtype``) in a checkpoint with this
    ``quantization_config``; None for an ordinary float tensor (perturbed like any other) or an
    integer tensor the formats here do not name (left as it is, so UNJUDGEABLE)."""
    leaf = name.rsplit(".", 1)[-1]
    method = str(qconfig.get("quant_method", "")).lower()
    floating = dtype in ("F64", "F32", "F16", "BF16")
    if leaf in _SCALE_LEAVES and floating:
        return TensorRole("scale")
    if leaf in ("g_idx", "weight_g_idx", "weight_shape", "perm"):
        return TensorRole("layout")
    if dtype in ("F8_E4M3",):
        return TensorRole("fp8-codes")
    bits = int(qconfig.get("bits") or qconfig.get("w_bit") or 4)
    if method in ("gptq", "awq", "auto_gptq", "auto_awq", "gptq_marlin", "awq_marlin") and dtype == "I32":
        if leaf == "qweight":
            return TensorRole("int4-packed") if bits == 4 else None
        if leaf == "qzeros":
            symmetric = method.startswith("gptq") or method == "auto_gptq"
            return TensorRole("layout") if symmetric and qconfig.get("sym", True) else TensorRole("int4-zero-points")
    if method == "compressed-tensors":
        if leaf == "weight_packed" and dtype == "I32":
            return TensorRole("int4-packed") if _ct_weight_bits(qconfig) == 4 else None
        if leaf in ("weight_zero_point", "input_zero_point") and dtype in ("I8", "I32"):
            return TensorRole("int-zero-point", bits=8)
    if leaf == "weight" and dtype == "I8":
        return TensorRole("int-codes", bits=8)
    return None


def _ct_weight_bits(qconfig: dict) -> int:
    for group in (qconfig.get("config_groups") or {}).values():
        bits = (group.get("weights") or {}).get("num_bits")
        if bits:
            return int(bits)
    return 8

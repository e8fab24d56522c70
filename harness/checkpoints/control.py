"""Which tensor the positive control B' scales when the user names none, from the
checkpoint's headers alone."""

from __future__ import annotations

import re

from harness.checkpoints.read import TensorHeader
from harness.errors import CheckpointError

_FLOAT_DTYPES = frozenset({"F64", "F32", "F16", "BF16"})


# Preferred norm modules, best first: each scales a whole layer's activations, and a norm
# kernel reads its weight as a tensor on every backend (not through an opaque handle).
_NORM_PREFERENCE = (
    "post_attention_layernorm",
    "input_layernorm",
    "pre_feedforward_layernorm",
    "norm",
    "pre_mixer_norm",
)


_EXPERT = re.compile(r"\.experts?\.|shared_expert")

# Quantized linear modules whose scale B' moves, best first: each adds straight into the
# residual stream. Never q/k first: Qwen3's and Gemma's QK-norm normalizes a scaled q or k back.
_PROJ_PREFERENCE = ("down_proj", "o_proj", "v_proj", "up_proj", "gate_proj", "dense", "out_proj")
_SCALE_LEAVES = ("weight_scale", "scales", "weight_scale_inv")


def _layer(name: str) -> int:
    m = re.search(r"\.(?:layers|h|blocks)\.(\d+)\.", name)
    return int(m.group(1)) if m else 1 << 30


def _proj_rank(name: str) -> int:
    module = name.rsplit(".", 2)[-2] if name.count(".") >= 2 else ""
    return _PROJ_PREFERENCE.index(module) if module in _PROJ_PREFERENCE else len(_PROJ_PREFERENCE)


def choose_quantized_control(
    headers: dict[str, TensorHeader], online_quantization: str | None = None
) -> tuple[str, str] | None:
    """For a quantized engine, a tensor a quantized kernel reads, and why: in a pre-quantized
    checkpoint, the weight scale of the earliest layer's quantized projection (``weight_scale``,
    GPTQ/AWQ ``scales``, fp8 ``weight_scale_inv``); under online quantization of a float
    checkpoint, that projection's float weight, which the engine quantizes itself (so its
    derived scale moves). None when neither exists (then the float choice applies)."""
    if online_quantization:
        pool = [
            n
            for n, h in headers.items()
            if h.dtype in _FLOAT_DTYPES
            and len(h.shape) == 2
            and n.endswith("_proj.weight")
            and _layer(n) < 1 << 30
            and not _EXPERT.search(n)
        ]
        why = (
            f"automatic: the engine quantizes online ({online_quantization}); the earliest layer's projection "
            "weight, which it quantizes into the codes and scale its kernel reads"
        )
    else:
        quantized_modules = {n.rsplit(".", 1)[0] for n, h in headers.items() if h.dtype not in _FLOAT_DTYPES}
        pool = [
            n
            for n in headers
            if n.rsplit(".", 1)[-1] in _SCALE_LEAVES
            and n.rsplit(".", 1)[0] in quantized_modules
            and headers[n].dtype in _FLOAT_DTYPES
            and not _EXPERT.search(n)
        ]
        why = (
            "automatic: a quantized checkpoint; the weight scale of the earliest layer's quantized projection, "
            "which its quantized kernel reads on every forward"
        )
    if not pool:
        return None
    best = min(pool, key=lambda n: (_layer(n), _proj_rank(n), n))
    return best, why


def choose_control_tensor(
    headers: dict[str, TensorHeader], quantized: bool = False, online_quantization: str | None = None
) -> tuple[str, str]:
    """The tensor B' scales when the user names none, and why. For a quantized engine (a
    quantized checkpoint, or ``online_quantization``), a tensor its quantized kernels read
    (``choose_quantized_control``). Otherwise a 1-D norm weight of the
    earliest layer (read directly by a kernel, moves every output), else the final norm,
    else a 1-D tensor of the earliest layer, else its first floating weight (seen through
    the kernel probes). Expert weights come last: a token may route around them."""
    if quantized or online_quantization:
        chosen = choose_quantized_control(headers, online_quantization)
        if chosen is not None:
            return chosen
    floats = {n: h for n, h in headers.items() if h.dtype in _FLOAT_DTYPES}
    if not floats:
        raise CheckpointError("the checkpoint has no floating-point tensor to use as the positive control")

    layer = _layer

    def module_leaf(name: str) -> str:
        parts = name.split(".")
        return parts[-2] if len(parts) >= 2 else ""

    def norm_rank(name: str) -> int:
        leaf = module_leaf(name)
        return _NORM_PREFERENCE.index(leaf) if leaf in _NORM_PREFERENCE else len(_NORM_PREFERENCE)

    norms = [
        n
        for n, h in floats.items()
        if len(h.shape) == 1 and n.endswith(".weight") and "norm" in module_leaf(n) and not _EXPERT.search(n)
    ]
    in_layers = [n for n in norms if layer(n) < 1 << 30]
    if in_layers:
        best = min(in_layers, key=lambda n: (layer(n), norm_rank(n), n.count("."), n))
        return best, (
            f"automatic: the {module_leaf(best)} weight of the earliest layer ({layer(best)}); a norm "
            "kernel reads it directly as a tensor and it scales the whole layer's activations"
        )
    if norms:
        best = min(norms, key=lambda n: (norm_rank(n), n))
        return best, (
            "automatic: no per-layer norm weight in the checkpoint; the final norm weight, which a norm "
            "kernel reads directly and every output passes through"
        )
    vectors = [n for n, h in floats.items() if len(h.shape) == 1 and not _EXPERT.search(n)]
    if vectors:
        best = min(vectors, key=lambda n: (layer(n), n))
        return best, "automatic: no norm weight in the checkpoint; the earliest 1-D tensor (a bias or scale)"
    best = min(floats, key=lambda n: (bool(_EXPERT.search(n)), layer(n), "embed" in n, n))
    return best, (
        "automatic: no 1-D tensor in the checkpoint; the earliest weight matrix, seen through the kernel probes"
    )

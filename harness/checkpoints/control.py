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


def choose_control_tensor(headers: dict[str, TensorHeader]) -> tuple[str, str]:
    """The tensor B' scales when the user names none, and why: a 1-D norm weight of the
    earliest layer (read directly by a kernel, moves every output), else the final norm,
    else a 1-D tensor of the earliest layer, else its first floating weight (seen through
    the kernel probes). Expert weights come last: a token may route around them."""
    floats = {n: h for n, h in headers.items() if h.dtype in _FLOAT_DTYPES}
    if not floats:
        raise CheckpointError("the checkpoint has no floating-point tensor to use as the positive control")

    def layer(name: str) -> int:
        m = re.search(r"\.(?:layers|h|blocks)\.(\d+)\.", name)
        return int(m.group(1)) if m else 1 << 30

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

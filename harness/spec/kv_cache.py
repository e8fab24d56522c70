"""A KV cache sized from a model's own ``config.json`` (pure: the planner reads the file).

vLLM refuses to start when the KV cache cannot hold one sequence of ``max_model_len``
(``vllm/v1/core/kv_cache_utils.py``, ``_check_enough_kv_cache_memory``). A fixed size that fits
the tiny CPU models does not fit a real one: Qwen3-0.6B (28 layers x 8 KV heads x 128) needs
224 KiB of fp32 KV per token, 112 MiB for 512 tokens, against the default 64 MiB. So a real
model's cell sizes its cache for every sequence it may batch, with a margin, and the preflight
checks that size with vLLM's own check.
"""

from __future__ import annotations

import math
from typing import Any

DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}
"""Bytes per element of the model dtypes a cell can name."""
MARGIN = 1.25
"""Head room over the computed need (allocator rounding, vLLM's null block, draft layers)."""
BLOCK_TOKENS = 16
"""Tokens per KV block assumed for the rounding (FlashAttention's default block size)."""
MiB = 1 << 20


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's part of a (possibly multimodal) config."""
    return config.get("text_config") or config


def kv_bytes_per_token(config: dict[str, Any], dtype: str) -> int:
    """K and V bytes one token takes over all layers, for the whole model (before tensor
    parallelism splits the heads): ``2 x layers x kv_heads x head_dim x bytes``, or the
    compressed latent of an MLA model (``kv_lora_rank + qk_rope_head_dim`` per layer)."""
    c = text_config(config)
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"no element size for dtype {dtype!r} (known: {', '.join(sorted(DTYPE_BYTES))})")
    size = DTYPE_BYTES[dtype]
    try:
        layers = int(c["num_hidden_layers"])
        if c.get("kv_lora_rank"):
            return layers * (int(c["kv_lora_rank"]) + int(c.get("qk_rope_head_dim") or 0)) * size
        heads = int(c["num_attention_heads"])
        kv_heads = int(c.get("num_key_value_heads") or heads)
        head_dim = int(c.get("head_dim") or int(c["hidden_size"]) // heads)
    except KeyError as exc:
        raise ValueError(f"the config has no {exc.args[0]!r}") from None
    return 2 * layers * kv_heads * head_dim * size


def kv_cache_bytes(config: dict[str, Any], dtype: str, max_model_len: int, max_num_seqs: int) -> int:
    """A KV cache that holds ``max_num_seqs`` sequences of ``max_model_len`` tokens (each
    rounded up to whole blocks, plus one block), with ``MARGIN``, in whole MiB."""
    blocks = max_num_seqs * (math.ceil(max_model_len / BLOCK_TOKENS) + 1) + 1
    need = kv_bytes_per_token(config, dtype) * blocks * BLOCK_TOKENS * MARGIN
    return int(math.ceil(need / MiB)) * MiB

"""The embedded default model: a tiny Qwen3 (QK-norm included), built deterministically."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from harness.cache import cached_variant
from harness.settings import DEFAULT_CACHE

TINY_QWEN3 = dict(
    vocab_size=512,
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,  # CPU attention rejects head_dim 16
    max_position_embeddings=512,
    attention_bias=True,
    tie_word_embeddings=False,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
)


def tiny_qwen3(seed: int = 0, architecture: str | None = None, cache: Path = DEFAULT_CACHE) -> Path:
    """A tiny Qwen3 checkpoint (QK-norm included), built deterministically from ``seed``.

    Norm weights are drawn around 1 rather than left at ones, so a stale copy of a
    norm differs from the refreshed value. ``architecture`` renames the model class in
    config.json, which is how planted-bug fixture models are selected.
    """
    arch = architecture or "Qwen3ForCausalLM"
    recipe = json.dumps({"seed": seed, "arch": arch, **TINY_QWEN3}, sort_keys=True)
    dest = cache / "models" / f"tiny-qwen3-{hashlib.sha256(recipe.encode()).hexdigest()[:12]}"
    return cached_variant(dest, lambda staging: _write_tiny_qwen3(seed, arch, staging), _complete)


def _complete(dest: Path) -> bool:
    return (dest / "model.safetensors").is_file()


def _write_tiny_qwen3(seed: int, arch: str, staging: Path) -> None:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    config = Qwen3Config(**TINY_QWEN3)
    hf_model = Qwen3ForCausalLM(config).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in hf_model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith(".bias"):
                p.copy_(0.05 * torch.randn(p.shape, generator=gen))
    hf_model.save_pretrained(str(staging), safe_serialization=True)
    cfg = json.loads((staging / "config.json").read_text())
    cfg["architectures"] = [arch]
    cfg["torch_dtype"] = "float32"
    (staging / "config.json").write_text(json.dumps(cfg, indent=2))

"""Tiny random checkpoints of stock vLLM architectures, one per family, for the ``zoo``
scenario and the tests.

Each is made deterministically from a transformers config (hidden 128, 2 layers,
head_dim 32 where the backend allows it, vocabulary 512) and cached under the model
cache beside the embedded tiny Qwen3, keyed by its recipe. Norm weights are drawn around
their neutral value (1, or 0 where the model adds 1 itself, as Gemma does) and biases
around 0, so a stale copy of any of them differs from the refreshed value.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from harness.cache import cached_variant
from harness.settings import DEFAULT_CACHE

_COMMON = dict(
    vocab_size=512, hidden_size=128, num_hidden_layers=2, max_position_embeddings=512, tie_word_embeddings=False
)
_ATTN = dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32)  # CPU attention rejects head_dim 16


@dataclass(frozen=True)
class Family:
    """One architecture family of the zoo."""

    label: str
    """Short name used in cell ids, e.g. ``qwen3-moe``."""
    config_class: str
    """transformers config class that builds it, e.g. ``Qwen3MoeConfig``."""
    model_class: str
    """transformers model class instantiated with random weights."""
    architecture: str
    """``architectures[0]`` written to config.json: the vLLM model class it selects."""
    config: tuple[tuple[str, object], ...]
    """Config keyword arguments (tuples of pairs so the spec stays hashable)."""
    covers: str
    """What this family adds to the zoo (shown by ``refit-harness list``)."""
    neutral_norm: float = 1.0
    """Value a norm weight leaves its input unchanged at (Gemma adds 1 itself: 0)."""
    extra: tuple[tuple[str, object], ...] = field(default=())
    """Keys set on config.json after saving (transformers versions that drop them)."""


def _cfg(**kwargs) -> tuple[tuple[str, object], ...]:
    return tuple(sorted(kwargs.items()))


FAMILIES: tuple[Family, ...] = (
    Family(
        "llama",
        "LlamaConfig",
        "LlamaForCausalLM",
        "LlamaForCausalLM",
        _cfg(**_COMMON, **_ATTN, intermediate_size=256, rms_norm_eps=1e-6),
        "dense GQA",
    ),
    Family(
        "qwen3",
        "Qwen3Config",
        "Qwen3ForCausalLM",
        "Qwen3ForCausalLM",
        _cfg(**_COMMON, **_ATTN, intermediate_size=256, attention_bias=True, rms_norm_eps=1e-6),
        "QK-norm, attention biases",
    ),
    Family(
        "qwen2",
        "Qwen2Config",
        "Qwen2ForCausalLM",
        "Qwen2ForCausalLM",
        _cfg(**{**_COMMON, **_ATTN}, intermediate_size=256, rms_norm_eps=1e-6),
        "QKV biases",
    ),
    Family(
        "phi3",
        "Phi3Config",
        "Phi3ForCausalLM",
        "Phi3ForCausalLM",
        _cfg(
            **_COMMON,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=256,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
        ),
        "fused qkv/gate_up in the checkpoint",
    ),
    Family(
        "gemma3",
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        "Gemma3ForCausalLM",
        _cfg(
            **_COMMON,
            **_ATTN,
            intermediate_size=256,
            sliding_window=16,
            query_pre_attn_scalar=32,
            layer_types=["sliding_attention", "full_attention"],
        ),
        "(1 + w) norms, pre/post-FFN norms, QK-norm, sliding window",
        neutral_norm=0.0,
    ),
    Family(
        "qwen3-moe",
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        "Qwen3MoeForCausalLM",
        _cfg(
            **_COMMON,
            **_ATTN,
            intermediate_size=256,
            moe_intermediate_size=64,
            num_experts=4,
            num_experts_per_tok=2,
            decoder_sparse_step=1,
            norm_topk_prob=True,
            rms_norm_eps=1e-6,
        ),
        "MoE, softmax top-k router (renormalized)",
    ),
    Family(
        "mixtral",
        "MixtralConfig",
        "MixtralForCausalLM",
        "MixtralForCausalLM",
        _cfg(**_COMMON, **_ATTN, intermediate_size=64, num_local_experts=4, num_experts_per_tok=2, rms_norm_eps=1e-6),
        "MoE, top-k-then-softmax router",
    ),
    Family(
        "deepseek-v2",
        "DeepseekV2Config",
        "DeepseekV2ForCausalLM",
        "DeepseekV2ForCausalLM",
        # CPU MLA compiles its decode kernel for a latent of 576 = kv_lora_rank 512 + rope 64 only.
        _cfg(
            **_COMMON,
            num_attention_heads=4,
            num_key_value_heads=4,
            intermediate_size=256,
            moe_intermediate_size=64,
            n_routed_experts=4,
            n_shared_experts=1,
            num_experts_per_tok=2,
            first_k_dense_replace=1,
            kv_lora_rank=512,
            q_lora_rank=None,
            qk_rope_head_dim=64,
            qk_nope_head_dim=32,
            v_head_dim=32,
            n_group=2,
            topk_group=1,
            topk_method="group_limited_greedy",
            rms_norm_eps=1e-6,
        ),
        "MLA, grouped top-k MoE router, shared expert",
    ),
    Family(
        "mamba2",
        "Mamba2Config",
        "Mamba2ForCausalLM",
        "Mamba2ForCausalLM",
        _cfg(
            vocab_size=512,
            hidden_size=128,
            num_hidden_layers=2,
            num_heads=8,
            head_dim=32,
            state_size=16,
            n_groups=1,
            expand=2,
            chunk_size=64,
            tie_word_embeddings=False,
        ),
        "pure SSM (Mamba2)",
    ),
    Family(
        "nemotron-h",
        "NemotronHConfig",
        "NemotronHForCausalLM",
        "NemotronHForCausalLM",
        _cfg(
            vocab_size=512,
            hidden_size=128,
            layers_block_type=["mamba", "attention", "mlp"],
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            intermediate_size=256,
            mamba_num_heads=8,
            mamba_head_dim=32,
            ssm_state_size=16,
            n_groups=1,
            chunk_size=64,
            max_position_embeddings=512,
            tie_word_embeddings=False,
        ),
        "hybrid attention + Mamba2 + MLP",
    ),
    Family(
        "granitemoe-hybrid",
        "GraniteMoeHybridConfig",
        "GraniteMoeHybridForCausalLM",
        "GraniteMoeHybridForCausalLM",
        _cfg(
            **_COMMON,
            **{k: v for k, v in _ATTN.items() if k != "head_dim"},
            intermediate_size=64,
            shared_intermediate_size=64,
            num_local_experts=4,
            num_experts_per_tok=2,
            layer_types=["mamba", "attention"],
            mamba_n_heads=8,
            mamba_d_head=32,
            mamba_d_state=16,
            mamba_n_groups=1,
            mamba_chunk_size=64,
            position_embedding_type="rope",
        ),
        "hybrid Mamba2 + attention with MoE and a shared expert",
    ),
)


def family(label: str) -> Family:
    from harness.errors import CheckpointError

    for f in FAMILIES:
        if f.label == label:
            return f
    raise CheckpointError(f"unknown zoo family {label!r}; available: {[f.label for f in FAMILIES]}")


def tiny_model(label: str, seed: int = 0, cache: Path = DEFAULT_CACHE) -> Path:
    """The family's tiny checkpoint, built once from its recipe and then read from the cache."""
    fam = family(label)
    recipe = json.dumps(
        {
            "seed": seed,
            "family": fam.label,
            "arch": fam.architecture,
            "config": fam.config,
            "extra": fam.extra,
            "neutral": fam.neutral_norm,
        },
        sort_keys=True,
        default=str,
    )
    dest = cache / "models" / f"zoo-{fam.label}-{hashlib.sha256(recipe.encode()).hexdigest()[:12]}"
    return cached_variant(dest, lambda staging: _write_tiny_model(fam, seed, staging), _complete)


def _complete(dest: Path) -> bool:
    return (dest / "config.json").is_file() and any(dest.glob("*.safetensors"))


def _write_tiny_model(fam: Family, seed: int, staging: Path) -> None:
    import torch
    import transformers

    torch.manual_seed(seed)
    config = getattr(transformers, fam.config_class)(**dict(fam.config))
    hf_model = getattr(transformers, fam.model_class)(config).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in hf_model.named_parameters():
            leaf = name.rsplit(".", 2)
            if name.endswith(".weight") and "norm" in leaf[-2]:
                p.copy_(fam.neutral_norm + 0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith(".bias") and p.is_floating_point():
                p.copy_(0.05 * torch.randn(p.shape, generator=gen))
    hf_model.save_pretrained(str(staging), safe_serialization=True)
    cfg = json.loads((staging / "config.json").read_text())
    cfg["architectures"] = [fam.architecture]
    cfg["torch_dtype"] = "float32"
    cfg.update(dict(fam.extra))
    (staging / "config.json").write_text(json.dumps(cfg, indent=2))

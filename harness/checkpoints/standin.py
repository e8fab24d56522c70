"""Stand-in checkpoints for the preflight: a real model's config and tensor names, no weights.

The preflight (``refit-harness preflight``) checks a GPU scenario's cells on any machine, CPU
included, without the model's weights: vLLM's ``EngineArgs`` and KV-cache checks read only
``config.json``, and the weight-transfer trainers check names, dtypes and ranks (the
sharded-RDT layer order, m2n's dtypes and tensor ranks), not values. So a stand-in holds the
model's own ``config.json`` and one safetensors file with every tensor the model's checkpoint
has, under its own name, dtype and rank, each dimension 1 (a few KB for Qwen3-0.6B's 310
tensors). A is zeros and B ones, so every tensor differs (sparse patches are never empty).

The config comes from a local checkpoint directory, the hub cache (never the network), or
``KNOWN_CONFIGS`` for the nightly's default model.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

from harness.errors import CheckpointError
from harness.settings import DEFAULT_CACHE
from harness.spec.checkpoint_set import CheckpointSet

KNOWN_CONFIGS: dict[str, dict[str, Any]] = {
    # Qwen/Qwen3-0.6B's config.json (Apache-2.0), as published with the model.
    "Qwen/Qwen3-0.6B": {
        "architectures": ["Qwen3ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": 1024,
        "initializer_range": 0.02,
        "intermediate_size": 3072,
        "max_position_embeddings": 40960,
        "max_window_layers": 28,
        "model_type": "qwen3",
        "num_attention_heads": 16,
        "num_hidden_layers": 28,
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000,
        "sliding_window": None,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.51.0",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": 151936,
    }
}
"""Configs of the models the GPU scenarios name by hub id, for machines without hub access."""


def model_config(model: str) -> tuple[dict[str, Any], str]:
    """``(config, where it came from)`` of a checkpoint directory or hub id, without the
    network: the directory's ``config.json``, the hub cache's, or ``KNOWN_CONFIGS``."""
    p = Path(model).expanduser()
    if p.is_dir():
        try:
            return json.loads((p / "config.json").read_text()), str(p / "config.json")
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"cannot read {p / 'config.json'}: {type(exc).__name__}: {exc}") from None
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(model, "config.json")
    except Exception:  # an id the hub library refuses, an unreadable cache: fall through
        cached = None
    if isinstance(cached, str):
        return json.loads(Path(cached).read_text()), cached
    if model in KNOWN_CONFIGS:
        return KNOWN_CONFIGS[model], f"the harness's copy of {model}'s config.json"
    raise CheckpointError(
        f"no config for {model!r}: not a directory, not in the hub cache, and not one of "
        f"{', '.join(sorted(KNOWN_CONFIGS))}; pass --model with a checkpoint directory"
    )


def tensor_names(config: dict[str, Any]) -> list[tuple[str, int]]:
    """``(name, rank)`` of every tensor the model's checkpoint holds: transformers' model built
    on the meta device (no memory), its deduplicated parameters (a tied ``lm_head`` is not
    saved)."""
    import torch
    import transformers

    cfg = transformers.AutoConfig.for_model(**config)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    return [(name, p.dim()) for name, p in model.named_parameters()]


def standin(model: str, dtype: str, cache: Path = DEFAULT_CACHE) -> tuple[CheckpointSet, str]:
    """Stand-ins A and B (and B' = B) for ``model`` in ``dtype``, and where the config came from."""
    config, source = model_config(model)
    recipe = json.dumps({"config": config, "dtype": dtype, "v": 1}, sort_keys=True)
    root = cache / "standins" / hashlib.sha256(recipe.encode()).hexdigest()[:16]
    a, b = root / "A", root / "B"
    if not (a / "model.safetensors").is_file() or not (b / "model.safetensors").is_file():
        import torch
        from safetensors.torch import save_file

        names = tensor_names(config)
        tmp = root.with_name(root.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        for label, value in (("A", 0.0), ("B", 1.0)):
            (tmp / label).mkdir(parents=True)
            tensors = {n: torch.full([1] * rank, value, dtype=getattr(torch, dtype)) for n, rank in names}
            save_file(tensors, str(tmp / label / "model.safetensors"), metadata={"format": "pt"})
            (tmp / label / "config.json").write_text(json.dumps({**config, "torch_dtype": dtype}, indent=2))
        shutil.rmtree(root, ignore_errors=True)
        tmp.rename(root)
    from harness.checkpoints.control import choose_control_tensor
    from harness.checkpoints.read import read_headers

    control, why = choose_control_tensor(read_headers(b))
    return CheckpointSet(a=str(a), b=str(b), b_control=str(b), control_tensor=control, control_reason=why), source

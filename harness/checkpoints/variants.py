"""Checkpoint variants that turn on a vLLM feature from ``config.json`` alone (no engine argument),
for the regression corpus: each is derived once from a tiny model and cached beside it."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from harness.settings import DEFAULT_CACHE

KV_SCHEME = {"type": "float", "num_bits": 8, "strategy": "tensor", "symmetric": True, "dynamic": False}
"""An fp8, per-tensor, static KV-cache scheme (compressed-tensors)."""
KV_FP8_CONFIG = {
    "quant_method": "compressed-tensors",
    "format": "dense",
    "quantization_status": "compressed",
    "config_groups": {},
    "kv_cache_scheme": KV_SCHEME,
    "ignore": ["lm_head"],
}
"""config.json's ``quantization_config`` of a checkpoint with fp8 KV-cache scales and float weights:
vLLM 0.32 loads per-tensor ``k_scale``/``v_scale`` through ``CompressedTensorsKVCacheMethod`` (in
float32, in every model dtype), and an fp8 cache reads them (``_k_scale_float``/``_v_scale_float``
in the CPU attention backend). Measured here: an ``fp8`` ``quantization_config`` with every linear
layer ignored loads them too, but vLLM refuses it in float32."""


def fp8_kv_scales(base: Path, cache: Path = DEFAULT_CACHE) -> Path:
    """``base`` (a Qwen3-style checkpoint) with a compressed-tensors ``kv_cache_scheme`` (fp8,
    per-tensor, static) and per-layer ``self_attn.k_scale`` / ``v_scale`` tensors: vLLM then
    runs an fp8 KV cache whose attention kernels read scales loaded from the checkpoint (the
    CPU attention reads them as the Python floats ``_k_scale_float``/``_v_scale_float``). Linear
    layers stay unquantized (no config group)."""
    import torch
    from safetensors.torch import load_file, save_file

    cfg = json.loads((base / "config.json").read_text())
    recipe = json.dumps({"base": base.name, "scheme": KV_SCHEME, "v": 1}, sort_keys=True)
    dest = cache / "models" / f"{base.name}-fp8kv-{hashlib.sha256(recipe.encode()).hexdigest()[:8]}"
    if (dest / "model.safetensors").is_file():
        return dest
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(base, tmp)
    tensors = load_file(tmp / "model.safetensors")
    for i in range(cfg["num_hidden_layers"]):
        tensors[f"model.layers.{i}.self_attn.k_scale"] = torch.tensor(0.05 * (i + 1), dtype=torch.float32)
        tensors[f"model.layers.{i}.self_attn.v_scale"] = torch.tensor(0.04 * (i + 1), dtype=torch.float32)
    save_file(tensors, tmp / "model.safetensors", metadata={"format": "pt"})
    cfg["quantization_config"] = KV_FP8_CONFIG
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return dest

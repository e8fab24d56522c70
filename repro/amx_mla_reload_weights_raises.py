"""On an AMX CPU, reload_weights raises on DeepSeek-V2 (MLA) in bf16: a size-0 kernel tensor.

Standalone (vLLM, torch and transformers only; no refit-harness): a tiny random DeepSeek-V2
checkpoint (the zoo's: MLA with the 576-wide latent the CPU MLA kernels are built for, a grouped
top-k MoE), started in bf16, then ``collective_rpc("reload_weights", weights_path=<the same
checkpoint>)``. On a CPU with AMX tiles vLLM 0.32 picks the AMX MLA backend
(``platforms/cpu.py:254``) and the layerwise reload raises ``RuntimeError: The size of tensor a (0)
must match the size of tensor b (512) at non-singleton dimension 1`` from
``_copy_and_restore_kernel_tensors`` (``model_loader/reload/layerwise.py``): the live kernel
tensor it copies the reloaded weight into is empty. Without AMX (the reference CPU MLA backend)
the same reload goes through.

The script prints the parameters that are empty on the cold engine, the error, and exits 1 while
the reload raises; 0 when it succeeds (with a note when the AMX MLA backend was not taken).
``--no-amx`` hides AMX from torch in this process, so vLLM takes the reference MLA backend here.

``--float32``: the same engine in float32. vLLM 0.32 picks the AMX MLA backend whatever the dtype,
and its post-load hook (``amx_mla.py``, ``convert_weight_packed``) refuses float32 weights:
``RuntimeError: expect weight to be bfloat16, float16, int8, fp8_e4m3 or uint8(mxfp4 or int4).``
The engine never starts (exit 1). ``--cpu-mla`` asks for the reference backend
(``attention_backend="CPU_MLA"``), and the engine starts.
Run: python repro/amx_mla_reload_weights_raises.py [--no-amx] [--float32 [--cpu-mla]]
"""

from __future__ import annotations

import os
import sys
import tempfile
import types
from pathlib import Path


def hide_amx() -> None:
    import torch

    real = dict(torch.cpu.get_capabilities())
    view = types.MappingProxyType({k: (False if k.startswith("amx") else v) for k, v in real.items()})
    torch.cpu.get_capabilities = lambda: view


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


def empty_parameters(worker) -> list[str]:
    return [f"{name} {tuple(p.shape)}" for name, p in worker.get_model().named_parameters() if p.numel() == 0]


def attention_backends(worker) -> list[str]:
    return sorted({type(m.impl).__name__ for m in worker.get_model().modules() if hasattr(m, "impl")})


def main() -> int:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process: a callable RPC
    if "--no-amx" in sys.argv:
        hide_amx()
    import torch
    from vllm import LLM

    model = tiny_deepseek_v2(Path(tempfile.mkdtemp(prefix="vllm-amx-mla-repro-")) / "model")
    try:
        llm = LLM(
            model=model,
            skip_tokenizer_init=True,
            dtype="float32" if "--float32" in sys.argv else "bfloat16",
            enforce_eager=True,
            kv_cache_memory_bytes=64 << 20,
            max_model_len=512,
            max_num_seqs=8,
            seed=0,
            **({"attention_backend": "CPU_MLA"} if "--cpu-mla" in sys.argv else {}),
        )
    except RuntimeError as exc:
        print(f"the engine did not start: {str(exc).splitlines()[0]}")
        return 1
    backends = llm.collective_rpc(attention_backends)[0]
    print(f"torch reports amx_tile={torch.cpu._is_amx_tile_supported()}; attention: {', '.join(backends)}")
    empty = llm.collective_rpc(empty_parameters)[0]
    print(f"{len(empty)} empty parameter(s) on the cold engine (weights moved into CPU kernels):")
    for line in empty:
        print("  ", line)
    try:
        llm.collective_rpc("reload_weights", kwargs={"weights_path": model})
    except RuntimeError as exc:
        print(f"reload_weights raised: {str(exc).splitlines()[0]}")
        return 1
    print(
        "reload_weights succeeded"
        + (
            ""
            if any("AMX" in b for b in backends)
            else " (the AMX MLA backend was not taken on this CPU: not reproducible here)"
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

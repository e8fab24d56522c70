"""vLLM's ``reload_weights`` reads a checkpoint that carries the multi-token-prediction layer, and
the MTP drafter keeps the layer it was started with.

Standalone (vLLM, torch, transformers, safetensors; no refit-harness). A MiMo checkpoint holds the
model and, beside it, ``model.mtp_layers.0.*``: the target (``MiMoForCausalLM``) skips those
tensors when it loads, and vLLM's ``mtp`` drafter (``MiMoMTP``, ``model_runner.drafter.model``)
loads them at start-up. The worker's ``reload_weights`` runs the reload lifecycle on the target
alone, so after ``reload_weights(B)`` the drafter still drafts with A's layer, although B's file,
read whole by that very call, holds the new one.

A tiny random MiMo (a Qwen2 with one MTP layer). B = A with every tensor moved (by 50 % of its
spread). Start on A with ``speculative_config={"method": "mtp"}``, ``reload_weights(B)``, then
read the drafter's ``token_layernorm.weight`` and compare it with B's on disk. Exit 1 while the
drafter's layer differs from B's.

``--deepseek``: the same with DeepSeek-V3's layout instead, a tiny DeepSeek-V3 (MLA, every layer
dense) whose checkpoint carries the MTP layer as the layer after the model's last
(``model.layers.2.*``: a decoder layer with ``enorm``, ``hnorm``, ``eh_proj`` and
``shared_head.norm``), which vLLM's ``DeepSeekMTP`` drafter loads; the norm read is ``enorm``.

Run: python repro/mtp_layer_stale_after_reload_weights.py [--deepseek] [--refit-drafter]
(``--refit-drafter``, the twin: after ``reload_weights`` the same reload lifecycle is run on the
drafter's model too; then it holds B's layer and the script exits 0).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
REFIT_DRAFTER = "--refit-drafter" in sys.argv[1:]
DEEPSEEK = "--deepseek" in sys.argv[1:]
NORM = "enorm" if DEEPSEEK else "token_layernorm"
"""The MTP layer's first norm."""
ON_DISK = "model.layers.2.enorm.weight" if DEEPSEEK else "model.mtp_layers.0.token_layernorm.weight"
"""That norm as the checkpoint names it (vLLM renumbers MiMo's layer in the drafter)."""


def model_and_mtp_names():
    """The target (a transformers model) and its MTP layer's prefix, norms and input projection."""
    import transformers

    shape = dict(vocab_size=512, hidden_size=128, num_hidden_layers=2, max_position_embeddings=512)
    shape |= dict(tie_word_embeddings=False, num_attention_heads=4, num_key_value_heads=4)
    if DEEPSEEK:
        # MLA as vLLM's CPU backend runs it (a latent of 512 + 64); every layer dense, the MTP one too.
        mla = dict(kv_lora_rank=512, q_lora_rank=None, qk_rope_head_dim=64, qk_nope_head_dim=32, v_head_dim=32)
        config = transformers.DeepseekV3Config(**shape, **mla, intermediate_size=256, first_k_dense_replace=3)
        model = transformers.DeepseekV3ForCausalLM(config)
        return model, "model.layers.2.", ("enorm", "hnorm", "shared_head.norm"), "eh_proj"
    config = transformers.Qwen2Config(**shape | dict(num_key_value_heads=2), intermediate_size=256, head_dim=32)
    model = transformers.Qwen2ForCausalLM(config)
    return model, "model.mtp_layers.0.", ("token_layernorm", "hidden_layernorm", "final_layernorm"), "input_proj"


def checkpoint(directory: Path, seed: int) -> str:
    import torch
    from safetensors.torch import load_file, save_file

    torch.manual_seed(0)
    model, prefix, norms, projection = model_and_mtp_names()
    model.save_pretrained(str(directory), safe_serialization=True)
    tensors = load_file(directory / "model.safetensors")
    # The MTP layer: a decoder layer like the first (drawn afresh), its norms and input projection.
    gen = torch.Generator().manual_seed(29)
    mtp = {prefix + n[len("model.layers.0.") :]: t for n, t in tensors.items() if n.startswith("model.layers.0.")}
    mtp = {n: 0.02 * torch.randn(t.shape, generator=gen) for n, t in mtp.items()}
    for norm in norms:
        mtp[f"{prefix}{norm}.weight"] = 1 + 0.2 * torch.randn(128, generator=gen)
    mtp[f"{prefix}{projection}.weight"] = 0.02 * torch.randn(128, 256, generator=gen)
    tensors |= mtp
    if seed:
        gen = torch.Generator().manual_seed(seed)
        tensors = {
            n: t + 0.5 * t.float().std().clamp(min=1e-2) * torch.randn(t.shape, generator=gen)
            for n, t in tensors.items()
        }
    save_file(
        {n: t.contiguous() for n, t in tensors.items()}, directory / "model.safetensors", metadata={"format": "pt"}
    )
    cfg = json.loads((directory / "config.json").read_text())
    cfg.update(num_nextn_predict_layers=1, torch_dtype="float32")
    cfg.update(architectures=["DeepseekV3ForCausalLM"] if DEEPSEEK else ["MiMoForCausalLM"])
    (directory / "config.json").write_text(json.dumps(cfg))
    return str(directory)


def drafter_norm(worker):
    """The drafter's MTP norm (``NORM``), as its kernels read it."""
    params = dict(worker.model_runner.drafter.model.named_parameters())
    name = next(n for n in params if n.endswith(f".{NORM}.weight"))
    return name, params[name].flatten()[:4].float().tolist()


def reload_drafter(worker, weights_path):
    """The twin's extra step: vLLM's reload lifecycle on the drafter's model."""
    from vllm.model_executor.model_loader.reload.inplace import reload_weights

    reload_weights(
        worker.vllm_config,
        worker.model_runner.drafter.model,
        weights_iterator=None,
        weights_path=weights_path,
        is_checkpoint_format=True,
    )


def main() -> int:
    import torch
    from safetensors.torch import load_file
    from vllm import LLM, SamplingParams

    root = Path(tempfile.mkdtemp(prefix="mtp-"))
    a, b = checkpoint(root / "A", 0), checkpoint(root / "B", 1)
    llm = LLM(
        model=a,
        speculative_config={"method": "mtp", "num_speculative_tokens": 1},
        skip_tokenizer_init=True,
        dtype="bfloat16",
        enforce_eager=True,
        kv_cache_memory_bytes=64 << 20,
        max_model_len=256,
        seed=0,
    )
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, detokenize=False)
    llm.generate([{"prompt_token_ids": list(range(3, 27))}], params, use_tqdm=False)
    on_a = llm.collective_rpc(drafter_norm)[0]
    llm.collective_rpc("reload_weights", kwargs={"weights_path": b})
    if REFIT_DRAFTER:
        llm.collective_rpc(reload_drafter, args=(b,))
    name, after = llm.collective_rpc(drafter_norm)[0]
    b_value = load_file(Path(b) / "model.safetensors")[ON_DISK].to(torch.bfloat16).flatten()[:4].float().tolist()
    a_value = load_file(Path(a) / "model.safetensors")[ON_DISK].to(torch.bfloat16).flatten()[:4].float().tolist()
    print(f"{'A + reload(B) + drafter reload(B)' if REFIT_DRAFTER else 'A + reload(B)'}: drafter {name}[:4]")
    print(f"  before the reload: {on_a[1]}")
    print(f"  after the reload:  {after}")
    print(f"  A on disk:         {a_value}")
    print(f"  B on disk:         {b_value}")
    return 0 if after == b_value else 1


if __name__ == "__main__":
    sys.exit(main())

"""vLLM 0.32: ``reload_weights`` leaves an unquantized gpt-oss model's attention sinks and MoE
experts at their old values.

Standalone (vLLM, torch, transformers, safetensors; no refit-harness). ``GptOssModel``'s loader
for unquantized checkpoints (``_load_weights_other`` in ``model_executor/models/gpt_oss.py``)
writes ``attn.sinks`` with ``param.data.copy_`` and the experts (``w13_weight``, ``w13_bias``,
``w2_weight``, ``w2_bias``) with ``param.copy_``, not through the parameters' weight loaders. vLLM's
layerwise reload only sees what a weight loader loads, so it puts those parameters' old values
back at the end of the reload: no error, and the tokens move. The public reports are vllm
#57797 and #57806 (fixed in 0.34).

A tiny random gpt-oss (2 layers, 4 experts, a sliding-window and a full layer, random sinks), B =
A with every tensor moved (by 50 % of its spread). Cold start on B vs cold start on A then
``reload_weights(B)``: prints, for one sink and one expert weight, the three values, and the greedy
tokens. Exit 1 while the refit leaves them at A.

Run: python repro/gpt_oss_sinks_experts_stale_after_reload.py [--dtype bfloat16|float32]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
PROBED = ("attn.sinks", "w13_weight")  # layer 0's, found by the end of their names


def checkpoint(directory: Path, seed: int) -> str:
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import GptOssConfig, GptOssForCausalLM

    torch.manual_seed(0)
    config = GptOssConfig(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        num_local_experts=4,
        num_experts_per_tok=2,
        sliding_window=16,
        layer_types=["sliding_attention", "full_attention"],
        max_position_embeddings=512,
        tie_word_embeddings=False,
    )
    model = GptOssForCausalLM(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".sinks"):  # transformers starts them at 0
                p.copy_(torch.randn(p.shape))
    model.save_pretrained(str(directory), safe_serialization=True)
    tensors = load_file(directory / "model.safetensors")
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
    cfg["torch_dtype"] = "float32"
    (directory / "config.json").write_text(json.dumps(cfg))
    return str(directory)


def probe(worker):
    """The first values of layer 0's probed parameters, as the kernels hold them."""
    params = [(n, p) for n, p in worker.get_model().named_parameters() if ".layers.0." in n]
    return {end: next(p for n, p in params if n.endswith(end)).flatten()[:3].float().tolist() for end in PROBED}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    dtype = parser.parse_args().dtype
    from vllm import LLM, SamplingParams

    root = Path(tempfile.mkdtemp(prefix="gpt-oss-"))
    a, b = checkpoint(root / "A", 0), checkpoint(root / "B", 1)
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, detokenize=False)
    prompts = [{"prompt_token_ids": [(7 * i + 13 * j) % 500 + 3 for j in range(24)]} for i in range(4)]

    def engine(path: str) -> LLM:
        return LLM(
            model=path,
            skip_tokenizer_init=True,
            dtype=dtype,
            enforce_eager=True,
            kv_cache_memory_bytes=64 << 20,
            max_model_len=256,
            seed=0,
        )

    def run(llm: LLM):
        tokens = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params, use_tqdm=False)]
        return tokens, llm.collective_rpc(probe)[0]

    llm = engine(b)
    cold_b = run(llm)
    llm.llm_engine.engine_core.shutdown()
    del llm
    llm = engine(a)
    cold_a = run(llm)
    llm.collective_rpc("reload_weights", kwargs={"weights_path": b})
    warm = run(llm)
    stale = []
    for name in PROBED:
        print(f"layer 0 {name}[:3]")
        print(f"  cold A:              {cold_a[1][name]}")
        print(f"  cold B:              {cold_b[1][name]}")
        print(f"  A + reload_weights(B): {warm[1][name]}")
        if warm[1][name] != cold_b[1][name]:
            stale.append(name + (" (equals A)" if warm[1][name] == cold_a[1][name] else ""))
    print(f"greedy tokens equal cold B's: {warm[0] == cold_b[0]}")
    print("left behind by the reload: " + (", ".join(stale) or "nothing"))
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())

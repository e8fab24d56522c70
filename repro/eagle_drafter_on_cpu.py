"""An EAGLE drafter runs on vLLM's CPU backend, and after ``reload_weights`` it drafts with the
refit target's embedding and head (which it shares) but with its own head weights as loaded.

Standalone (vLLM, torch, transformers, safetensors; no refit-harness). A tiny random Llama (A),
B = A with every tensor moved, and a tiny random EAGLE head (``fc`` and one decoder layer, no
embedding or ``lm_head`` of its own, so vLLM shares the target's). Start on A with the head
(``speculative_config={"method": "eagle", ...}``, 2 draft tokens), generate, ``reload_weights(B)``,
generate. Prints the draft counters, whether the drafter's embedding and head are the target's own
modules, and their sums beside the target's before and after the refit. Exit 1 if the drafter's
shared embedding or head differs from the target's after the refit; 0 otherwise.

The head's own weights (``fc``, its layer) come from its own checkpoint, which ``reload_weights``
never reads (it reloads ``get_model()``, the target): an RL loop that trains the head must reload
it itself, as for any drafter (docs/findings/drafter_stale_after_reload_weights.md).

Run: python repro/eagle_drafter_on_cpu.py
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
TINY = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "vocab_size": 512,
    "max_position_embeddings": 256,
}


def llama(directory: Path, seed: int) -> str:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    LlamaForCausalLM(LlamaConfig(**TINY)).save_pretrained(directory)
    return str(directory)


def eagle_head(directory: Path, target: str) -> str:
    """An EAGLE head for ``target``: its config with one layer; ``fc`` maps [embedding, hidden]
    to hidden; layer 0 has no input norm (vLLM's EAGLE Llama replaces it with an identity)."""
    import torch
    from safetensors.torch import save_file

    config = json.loads((Path(target) / "config.json").read_text()) | {"num_hidden_layers": 1}
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(config))
    h, i, d = TINY["hidden_size"], TINY["intermediate_size"], TINY["head_dim"]
    q, kv = TINY["num_attention_heads"] * d, TINY["num_key_value_heads"] * d
    shapes = {
        "fc.weight": (h, 2 * h),
        "layers.0.self_attn.q_proj.weight": (q, h),
        "layers.0.self_attn.k_proj.weight": (kv, h),
        "layers.0.self_attn.v_proj.weight": (kv, h),
        "layers.0.self_attn.o_proj.weight": (h, q),
        "layers.0.mlp.gate_proj.weight": (i, h),
        "layers.0.mlp.up_proj.weight": (i, h),
        "layers.0.mlp.down_proj.weight": (h, i),
    }
    generator = torch.Generator().manual_seed(7)
    tensors = {name: 0.05 * torch.randn(shape, generator=generator) for name, shape in shapes.items()}
    tensors["layers.0.post_attention_layernorm.weight"] = torch.ones(h)
    save_file(tensors, str(directory / "model.safetensors"))
    return str(directory)


def shared(worker) -> dict:
    """What the drafter shares with the target, read inside the worker."""
    runner = worker.model_runner
    drafter, target = runner.drafter.model, runner.get_model()
    return {
        "embedding is the target's": drafter.model.embed_tokens is target.model.embed_tokens,
        "lm_head is the target's": drafter.lm_head is target.lm_head,
        "drafter embedding sum": float(drafter.model.embed_tokens.weight.float().sum()),
        "target embedding sum": float(target.model.embed_tokens.weight.float().sum()),
        "drafter lm_head sum": float(drafter.lm_head.weight.float().sum()),
        "target lm_head sum": float(target.lm_head.weight.float().sum()),
    }


def main() -> int:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    with tempfile.TemporaryDirectory() as tmp:
        a, b = llama(Path(tmp) / "A", 0), llama(Path(tmp) / "B", 1)
        head = eagle_head(Path(tmp) / "eagle", a)
        llm = LLM(
            model=a,
            skip_tokenizer_init=True,
            dtype="bfloat16",
            enforce_eager=True,
            max_model_len=256,
            kv_cache_memory_bytes=64 << 20,
            disable_log_stats=False,
            speculative_config={"method": "eagle", "model": head, "num_speculative_tokens": 2},
        )
        prompt = [TokensPrompt(prompt_token_ids=[5, 6, 7, 8, 9] * 4)]
        greedy = SamplingParams(max_tokens=16, temperature=0, detokenize=False)
        print("tokens on A:", llm.generate(prompt, greedy)[0].outputs[0].token_ids)
        print("before the refit:", llm.collective_rpc(shared)[0])
        llm.collective_rpc("reload_weights", kwargs={"weights_path": b})
        after = llm.collective_rpc(shared)[0]
        print("after reload_weights(B):", after)
        print("tokens after the refit:", llm.generate(prompt, greedy)[0].outputs[0].token_ids)
        counters = {m.name: getattr(m, "value", None) for m in llm.get_metrics() if "spec_decode_num" in m.name}
        print("draft counters:", counters)
    follows = (
        after["drafter embedding sum"] == after["target embedding sum"]
        and after["drafter lm_head sum"] == after["target lm_head sum"]
    )
    print("the drafter's shared embedding and head follow the refit" if follows else "STALE shared tensors")
    return 0 if follows else 1


if __name__ == "__main__":
    sys.exit(main())

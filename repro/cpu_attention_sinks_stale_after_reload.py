"""vLLM's CPU attention keeps a float32 copy of the attention sinks made on the first forward.

Standalone (vLLM, torch, transformers, safetensors; no refit-harness). ``CPUAttentionBackendImpl``
runs sinks natively in bf16 and float32; in any other dtype (float16) its ``forward`` replaces
``self.sinks`` (the model's ``self_attn.sinks`` Parameter) with ``self.sinks.to(torch.float32)``
the first time it runs, and keeps that copy for good. A refit writes the new sinks into the
Parameter, which the impl no longer reads.

A tiny random Granite SWA (vLLM's ``GraniteForCausalLM``: a per-head sink on every layer, one
sliding-window and one full layer); B = A with every tensor moved (by 50 % of its spread). Cold
start on B vs cold start on A, generate (as an RL loop does before each refit), reload_weights(B),
generate. Prints the impl's sinks beside the Parameter. Exit 1 while the tokens, the logprobs or
the impl's sinks differ from the cold start's.

Run: python repro/cpu_attention_sinks_stale_after_reload.py [float16|bfloat16|float32]
(float16 reproduces; bfloat16 and float32 are its twins: the impl reads the Parameter itself).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
DTYPE = sys.argv[1] if len(sys.argv) > 1 else "float16"


def checkpoint(directory: Path, seed: int) -> str:
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import GraniteSWAConfig, GraniteSWAForCausalLM

    torch.manual_seed(0)
    config = GraniteSWAConfig(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=512,
        sliding_window=16,
        layer_types=["sliding_attention", "full_attention"],
        attention_multiplier=0.125,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )
    GraniteSWAForCausalLM(config).save_pretrained(str(directory), safe_serialization=True)
    tensors = load_file(directory / "model.safetensors")
    gen = torch.Generator().manual_seed(100)
    # transformers starts the sinks at 0: draw them, the same in A and B before B moves them.
    tensors |= {n: torch.randn(t.shape, generator=gen) for n, t in tensors.items() if n.endswith(".sinks")}
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


def sinks(model):
    attn = model.model.layers[0].self_attn
    impl = attn.attn.impl.sinks
    return {
        "parameter": [round(v, 4) for v in attn.sinks.float().tolist()],
        "impl": [round(v, 4) for v in impl.float().tolist()],
        "impl dtype": str(impl.dtype),
        "impl is the parameter": impl is attn.sinks,
    }


def main() -> int:
    from vllm import LLM, SamplingParams

    root = Path(tempfile.mkdtemp(prefix="sinks-"))
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
    prompts = [{"prompt_token_ids": [(7 * i + 13 * j) % 500 + 3 for j in range(40)]} for i in range(3)]

    def run(llm):
        outs = llm.generate(prompts, params, use_tqdm=False)
        toks = [list(o.outputs[0].token_ids) for o in outs]
        lps = [[pos[t].logprob for t, pos in zip(o.outputs[0].token_ids, o.outputs[0].logprobs)] for o in outs]
        return toks, lps, llm.apply_model(sinks)[0]

    llm = LLM(model=b, **engine)
    cold = run(llm)
    del llm
    llm = LLM(model=a, **engine)
    run(llm)  # generate on A first: the copy is made on the first forward
    llm.collective_rpc("reload_weights", kwargs={"weights_path": b})
    warm = run(llm)
    print(f"dtype {DTYPE}, layer 0 sinks")
    print("  cold B:          ", cold[2])
    print("  A + reload(B):   ", warm[2])
    for i, (c, w) in enumerate(zip(cold[0], warm[0])):
        print(f"prompt {i}: cold B {c}  refit {w}" + ("" if c == w else "   <- differ"))
    lp = max(abs(x - y) for cl, wl in zip(cold[1], warm[1]) for x, y in zip(cl, wl))
    print(f"max |logprob difference| over the shared tokens: {lp:.3g}")
    stale = cold[2]["impl"] != warm[2]["impl"]
    return 1 if cold[0] != warm[0] or lp > 1e-4 or stale else 0


if __name__ == "__main__":
    sys.exit(main())

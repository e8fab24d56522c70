"""vLLM keeps serving prefix-cache KV computed with the old weights after reload_weights.

Standalone (vLLM, torch and transformers only; no refit-harness): two tiny random Qwen3
checkpoints A and B, then
- cold B: greedy tokens of prompts that share a 272-token prefix;
- A with prefix caching, generate (fills the cache), reload_weights(B), generate again:
  the tokens differ from cold B, and every prompt reports cached tokens;
- reset_prefix_cache(), generate again: the tokens equal cold B.

Prints the three token lists and exits 1 when the reload alone serves stale KV.
Run: python repro/prefix_cache_stale_after_reload.py
"""

from __future__ import annotations

import random
import sys
import tempfile
from pathlib import Path


def tiny_qwen3(directory: Path, seed: int) -> str:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
    )
    model = Qwen3ForCausalLM(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape))
    model.save_pretrained(directory, safe_serialization=True)
    return str(directory)


def main() -> int:
    from vllm import LLM, SamplingParams

    work = Path(tempfile.mkdtemp(prefix="vllm-prefix-repro-"))
    a, b = tiny_qwen3(work / "A", 0), tiny_qwen3(work / "B", 1)
    draw = random.Random(0)
    prefix = [draw.randrange(1, 512) for _ in range(272)]  # > two 128-token KV blocks
    prompts = [{"prompt_token_ids": prefix + [draw.randrange(1, 512) for _ in range(8 + i)]} for i in range(4)]
    params = SamplingParams(temperature=0.0, max_tokens=12, detokenize=False)
    settings = dict(
        skip_tokenizer_init=True,
        dtype="float32",
        enforce_eager=True,
        kv_cache_memory_bytes=64 << 20,
        max_model_len=512,
        max_num_seqs=8,
        seed=0,
    )

    def generate(llm):
        outs = llm.generate(prompts, params, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs], [o.num_cached_tokens for o in outs]

    llm = LLM(model=b, enable_prefix_caching=False, **settings)
    cold_b, _ = generate(llm)
    del llm
    llm = LLM(model=a, enable_prefix_caching=True, **settings)
    generate(llm)  # the cache now holds KV computed with A's weights
    llm.collective_rpc("reload_weights", kwargs={"weights_path": b})
    after_reload, cached = generate(llm)
    llm.reset_prefix_cache()
    after_reset, _ = generate(llm)
    print("cold B:                   ", cold_b)
    print("A -> reload_weights(B):   ", after_reload, "cached tokens per prompt:", cached)
    print("... + reset_prefix_cache():", after_reset)
    stale = after_reload != cold_b
    print(
        "stale prefix KV served after reload_weights:", stale, "| equal to cold B after reset:", after_reset == cold_b
    )
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())

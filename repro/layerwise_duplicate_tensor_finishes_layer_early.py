"""vLLM's layerwise reload counts elements to decide a layer is complete, so a tensor sent twice
in one reload finishes its layer before the layer's other tensors arrive (RFC #48312's toy repro).

Standalone (vLLM, torch and transformers only; no refit-harness): a tiny random Qwen3 A and B,
bfloat16 (linear weights stay in their parameters on CPU), then in one engine started on A:
- reload_weights(weights_iterator=B) with ``model.layers.0.self_attn.q_proj.weight`` sent twice:
  q (twice) reaches qkv_proj's element total before v_proj arrives, the layer is processed with
  v's rows still the uninitialized copy, and v_proj's load then goes into a discarded tensor;
- reload_weights(weights_iterator=B) again, each tensor once: the correct result.

Prints whether qkv_proj's weight and the greedy tokens differ between the two, and exits 1 when
the duplicate changed them, or made the reload raise (the bug holds). Measured on vLLM 0.32 CPU:
the duplicated reload raises ``AttributeError: 'Parameter' object has no attribute 'weight_loader'``
in ``QKVParallelLinear.load_weights``: qkv_proj was processed when q arrived twice, and the loads
that followed met its kernel-format parameter (exit 1). Run: python repro/layerwise_duplicate_tensor_finishes_layer_early.py
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process: the iterator is local
DUPLICATE = "model.layers.0.self_attn.q_proj.weight"


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
        max_position_embeddings=512,
        tie_word_embeddings=False,
    )
    Qwen3ForCausalLM(config).save_pretrained(directory, safe_serialization=True)
    return str(directory)


def reload_from(self, path: str, duplicate: str | None):
    from safetensors.torch import load_file

    weights = list(load_file(os.path.join(path, "model.safetensors")).items())
    if duplicate:
        weights = [w for w in weights for _ in range(2 if w[0] == duplicate else 1)]
    self.model_runner.reload_weights(weights_iterator=iter(weights), is_checkpoint_format=True)
    qkv = self.model_runner.model.model.layers[0].self_attn.qkv_proj.weight
    return qkv.detach().float().clone()


def main() -> int:
    from vllm import LLM, SamplingParams

    work = Path(tempfile.mkdtemp(prefix="vllm-dup-repro-"))
    a, b = tiny_qwen3(work / "A", 0), tiny_qwen3(work / "B", 1)
    llm = LLM(
        model=a,
        skip_tokenizer_init=True,
        dtype="bfloat16",
        enforce_eager=True,
        kv_cache_memory_bytes=64 << 20,
        max_model_len=256,
        seed=0,
    )
    prompts = [{"prompt_token_ids": list(range(3 + i, 40 + i))} for i in range(4)]
    params = SamplingParams(temperature=0.0, max_tokens=12, detokenize=False)

    def tokens():
        return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params, use_tqdm=False)]

    try:
        dup_qkv = llm.collective_rpc(reload_from, args=(b, DUPLICATE))[0]
    except (
        Exception
    ) as exc:  # measured on 0.32 CPU, bf16: the layer was finished early, and a later load met its kernel tensor
        print(f"{DUPLICATE} sent twice: the reload raised {type(exc).__name__}: {exc}")
        print("the bug holds: the layer was processed before its last tensor arrived")
        return 1
    dup_tokens = tokens()
    ok_qkv = llm.collective_rpc(reload_from, args=(b, None))[0]
    ok_tokens = tokens()
    rows = (dup_qkv != ok_qkv).any(dim=1).nonzero().flatten().tolist()
    print(
        f"{DUPLICATE} sent twice: {len(rows)} of {dup_qkv.shape[0]} qkv_proj rows differ from a reload "
        f"that sends it once (rows {rows[:1]}..{rows[-1:]})"
    )
    for i, (d, o) in enumerate(zip(dup_tokens, ok_tokens)):
        print(f"prompt {i}: duplicate {d}\n          once      {o}")
    holds = bool(rows) or dup_tokens != ok_tokens
    print("the bug holds" if holds else "no difference: the bug is fixed")
    return 1 if holds else 0


if __name__ == "__main__":
    sys.exit(main())

"""On an AMX CPU, reload_weights leaves a bf16 linear's bias in fp32 precision, unlike a cold start.

Standalone (vLLM, torch and transformers only; no refit-harness): two tiny random Qwen2
checkpoints A and B saved in float32 (as transformers saves them), served in bfloat16, then
- cold B: every ``qkv_proj.bias`` and the greedy tokens' logprobs;
- cold A, ``collective_rpc("reload_weights", weights_path=B)``, the same.

Why: on a CPU with AMX tiles, vLLM's CPU post-load hook (``dispatch_cpu_unquantized_gemm``,
``vllm/model_executor/layers/utils.py:560-579``) runs small bf16 linears (weights up to 1 MiB)
through the SGL ``weight_packed_linear`` kernel and turns the bias to float32 in place:
``layer.bias.data = layer.bias.to(torch.float32)``. At a cold start the checkpoint's float32 bias
was first loaded into the bf16 Parameter, so it is rounded to bf16, then widened. The layerwise
reload never rebuilds ``bias`` (``SKIP_TENSORS`` in ``model_loader/reload/meta.py``): the new
checkpoint's float32 bias is copied into the float32 Parameter as it is, **not rounded to bf16**.
The bias then equals neither cold A nor cold B, and the logprobs move (by about 4e-3 here). A
bf16 checkpoint hides it (its values are already bf16); without AMX the bias stays bf16.

Exits 1 while a bias differs from cold B after the reload; 0 otherwise, with a note when the
SGL branch was not taken on this CPU.
Run: python repro/amx_linear_bias_unrounded_after_reload.py
"""

from __future__ import annotations

import os
import random
import sys
import tempfile
from pathlib import Path


def tiny_qwen2(directory: Path, seed: int) -> str:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
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
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():  # biases and norms away from their init, so A and B differ in every tensor
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape))
            elif name.endswith(".bias"):
                p.copy_(0.05 * torch.randn(p.shape))
    model.save_pretrained(directory, safe_serialization=True)  # float32 on disk
    return str(directory)


def biases(worker) -> dict:
    out = {}
    for name, m in worker.get_model().named_modules():
        bias = getattr(m, "bias", None)
        if name.endswith("qkv_proj") and bias is not None:
            fn = getattr(m, "cpu_linear", None)
            sgl = "packed_weight" in getattr(getattr(fn, "__code__", None), "co_freevars", ())
            out[name] = dict(bias=bias.detach().clone(), sgl=sgl)
    return out


def main() -> int:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process: a callable RPC
    import torch
    from vllm import LLM, SamplingParams

    work = Path(tempfile.mkdtemp(prefix="vllm-amx-bias-repro-"))
    a, b = tiny_qwen2(work / "A", 0), tiny_qwen2(work / "B", 1)
    draw = random.Random(0)
    prompts = [{"prompt_token_ids": [draw.randrange(1, 512) for _ in range(16 + 3 * i)]} for i in range(4)]
    params = SamplingParams(temperature=0.0, max_tokens=8, detokenize=False, logprobs=1)
    settings = dict(
        skip_tokenizer_init=True,
        dtype="bfloat16",
        enforce_eager=True,
        kv_cache_memory_bytes=64 << 20,
        max_model_len=256,
        max_num_seqs=8,
        seed=0,
    )

    def logprobs(llm):
        outs = llm.generate(prompts, params, use_tqdm=False)
        return [[next(iter(step.values())).logprob for step in o.outputs[0].logprobs] for o in outs]

    llm = LLM(model=b, **settings)
    cold_b, cold_b_lp = llm.collective_rpc(biases)[0], logprobs(llm)
    del llm
    llm = LLM(model=a, **settings)
    cold_a = llm.collective_rpc(biases)[0]
    llm.collective_rpc("reload_weights", kwargs={"weights_path": b})
    warm, warm_lp = llm.collective_rpc(biases)[0], logprobs(llm)
    del llm

    print(f"torch reports amx_tile={torch.cpu._is_amx_tile_supported()}")
    wrong = []
    for name, cold in cold_b.items():
        got = warm[name]["bias"]
        ok = torch.equal(got, cold["bias"])
        rounded = torch.equal(got.to(torch.bfloat16).to(got.dtype), got)
        if not ok:
            wrong.append(name)
        print(
            f"  {name}.bias ({got.dtype}) after reload_weights(B): "
            + (
                "equal to cold B"
                if ok
                else "STALE"
                if torch.equal(got, cold_a[name]["bias"])
                else f"CORRUPT (max |diff| {float((got - cold['bias']).abs().max()):.3g} from cold B)"
            )
            + f" | bf16-representable: {rounded} | SGL kernel: {cold['sgl']}"
        )
    drift = max(abs(x - y) for p, q in zip(cold_b_lp, warm_lp) for x, y in zip(p, q))
    print(f"largest logprob difference, A + reload_weights(B) vs cold B: {drift:.3g}")
    if not wrong and not any(c["sgl"] for c in cold_b.values()):
        print(
            "note: the SGL branch (AMX tiles) was not taken on this CPU, so the bias stays bf16: not reproducible here"
        )
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())

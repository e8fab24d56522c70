"""vLLM's ``reload_weights`` refits the target model only: a speculative-decoding drafter keeps
the weights it was started with.

Standalone (vLLM, torch, transformers, safetensors; no refit-harness). The worker's
``reload_weights`` runs vLLM's reload lifecycle on ``get_model()``, the target; the drafter
(``model_runner.drafter.model``, here a ``draft_model`` drafter) is never touched. Speculative
decoding is lossless, so the greedy tokens stay exactly cold B's: only the acceptance rate shows
the drafter still proposing from A.

A tiny random Qwen3 is its own drafter (self-speculation: while the drafter equals the target,
every draft is accepted). B = A with every tensor moved (by 50 % of its spread). Cold start on B
(drafter B) vs cold start on A (drafter A), generate, ``reload_weights(B)``, generate. Prints the
tokens, the acceptance rates and one drafter weight beside the target's. Exit 1 while the drafter
differs from cold B's.

Run: python repro/drafter_stale_after_reload_weights.py [--refit-drafter]
(``--refit-drafter``, the twin: after ``reload_weights`` the same reload lifecycle is run on the
drafter's model too, as an RL integration must; then it matches cold B and exits 0).
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
# A norm weight: the CPU backend empties linear Parameters into oneDNN handles on AVX-512.
PROBED = "model.layers.0.input_layernorm.weight"


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
        tie_word_embeddings=False,
    )
    Qwen3ForCausalLM(config).save_pretrained(str(directory), safe_serialization=True)
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
    """One weight of the target and of the drafter, as the kernels hold them."""
    runner = worker.model_runner
    target = dict(runner.get_model().named_parameters())[PROBED]
    drafter = dict(runner.drafter.model.named_parameters())[PROBED]
    return {"target": target.flatten()[:4].float().tolist(), "drafter": drafter.flatten()[:4].float().tolist()}


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
    from vllm import LLM, SamplingParams

    root = Path(tempfile.mkdtemp(prefix="drafter-"))
    a, b = checkpoint(root / "A", 0), checkpoint(root / "B", 1)

    def engine(path: str) -> LLM:
        return LLM(
            model=path,
            speculative_config={"method": "draft_model", "model": path, "num_speculative_tokens": 2},
            skip_tokenizer_init=True,
            dtype="bfloat16",
            enforce_eager=True,
            kv_cache_memory_bytes=64 << 20,
            max_model_len=256,
            disable_log_stats=False,
            seed=0,
        )

    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, detokenize=False)
    prompts = [{"prompt_token_ids": [(7 * i + 13 * j) % 500 + 3 for j in range(24)]} for i in range(3)]

    def counters(llm: LLM) -> tuple[float, float]:
        found = {m.name: m for m in llm.get_metrics()}
        return found["vllm:spec_decode_num_accepted_tokens"].value, found["vllm:spec_decode_num_draft_tokens"].value

    def run(llm: LLM):
        accepted, drafted = counters(llm)
        tokens = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params, use_tqdm=False)]
        accepted2, drafted2 = counters(llm)
        return tokens, (accepted2 - accepted) / max(1.0, drafted2 - drafted), llm.collective_rpc(probe)[0]

    llm = engine(b)
    cold = run(llm)
    llm.llm_engine.engine_core.shutdown()
    del llm
    llm = engine(a)
    run(llm)
    llm.collective_rpc("reload_weights", kwargs={"weights_path": b})
    if REFIT_DRAFTER:
        llm.collective_rpc(reload_drafter, args=(b,))
    warm = run(llm)
    print(f"{'A + reload(B) + drafter reload(B)' if REFIT_DRAFTER else 'A + reload(B)'} vs cold B")
    print(f"  tokens identical: {cold[0] == warm[0]}")
    print(f"  acceptance rate: refit {warm[1]:.2f}, cold B {cold[1]:.2f}")
    print(f"  {PROBED}[:4] cold B:  {cold[2]}")
    print(f"  {PROBED}[:4] refit:   {warm[2]}")
    return 1 if warm[2]["drafter"] != cold[2]["drafter"] or warm[1] != cold[1] else 0


if __name__ == "__main__":
    sys.exit(main())

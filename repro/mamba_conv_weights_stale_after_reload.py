"""On an AVX512-BF16 CPU, vLLM's reload_weights leaves a Mamba2 mixer's conv weights stale (bf16).

Standalone (vLLM, torch and transformers only; no refit-harness): two tiny random bf16
checkpoints A and B of a Mamba2 family (Mamba2 by default; ``--family nemotron-h`` or
``granitemoe-hybrid`` for the hybrids, ``--family all`` for the three), then
- cold B: greedy tokens, and every ``MambaMixer2.conv_weights`` buffer;
- cold A, ``collective_rpc("reload_weights", weights_path=B)``, the same tokens and buffers.

Why: on a CPU where ``torch.cpu._is_avx512_bf16_supported()`` is true (or ARM with bf16), the
CPU backend's post-load hook (``dispatch_cpu_unquantized_gemm`` in
``vllm/model_executor/layers/utils.py``) prepacks each bf16 causal-conv1d weight:
``layer.weight.data = ops.causal_conv1d_weight_pack(unpacked)``, stashing the unpacked copy in
``conv1d._cpu_unpacked_conv_weight``. ``MambaMixer2.__init__`` registered ``conv_weights`` (the
tensor the CPU conv kernels read) as a non-persistent view of the *original* weight storage.
After the prepack the view and the parameter no longer share storage; the layerwise reload
writes the new weight into the parameter (packed) and skips non-persistent buffers, so
``conv_weights`` keeps checkpoint A's values and the tokens diverge from cold B. On an
AVX2-only CPU nothing is prepacked, the buffer stays a view of the reloaded parameter, and
the reload is correct.

Exits 1 while a ``conv_weights`` buffer differs from cold B after the reload; 0 otherwise,
with a note when the prepack was not taken on this CPU (the bug cannot show here).
``--as-avx2`` masks the AVX-512/AMX capabilities torch reports (the engine runs in this
process), so vLLM takes the AVX2 branch on this machine: the prepack is skipped and the
reload is correct, which shows the prepack is the cause.

``--sharded-state`` shows the prepack's second symptom: vLLM's sharded-state saver writes the
prepacked conv1d weight, and a new engine started from that state (``load_format="sharded_state"``)
raises copying it into the fresh ``[dim, 1, 4]`` parameter; exits 1 while it raises.
Run: python repro/mamba_conv_weights_stale_after_reload.py [--family mamba2|nemotron-h|granitemoe-hybrid|all]
     [--as-avx2] [--sharded-state]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
from pathlib import Path

# The zoo's tiny configs (hidden 128, vocabulary 512): config class, model class, kwargs.
FAMILIES = {
    "mamba2": (
        "Mamba2Config",
        "Mamba2ForCausalLM",
        dict(
            vocab_size=512,
            hidden_size=128,
            num_hidden_layers=2,
            num_heads=8,
            head_dim=32,
            state_size=16,
            n_groups=1,
            expand=2,
            chunk_size=64,
            tie_word_embeddings=False,
        ),
    ),
    "nemotron-h": (
        "NemotronHConfig",
        "NemotronHForCausalLM",
        dict(
            vocab_size=512,
            hidden_size=128,
            layers_block_type=["mamba", "attention", "mlp"],
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            intermediate_size=256,
            mamba_num_heads=8,
            mamba_head_dim=32,
            ssm_state_size=16,
            n_groups=1,
            chunk_size=64,
            max_position_embeddings=512,
            tie_word_embeddings=False,
        ),
    ),
    "granitemoe-hybrid": (
        "GraniteMoeHybridConfig",
        "GraniteMoeHybridForCausalLM",
        dict(
            vocab_size=512,
            hidden_size=128,
            num_hidden_layers=2,
            max_position_embeddings=512,
            tie_word_embeddings=False,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=64,
            shared_intermediate_size=64,
            num_local_experts=4,
            num_experts_per_tok=2,
            layer_types=["mamba", "attention"],
            mamba_n_heads=8,
            mamba_d_head=32,
            mamba_d_state=16,
            mamba_n_groups=1,
            mamba_chunk_size=64,
            position_embedding_type="rope",
        ),
    ),
}
_MASKED = ("avx512", "amx")  # capability-name prefixes an AVX2-only x86 CPU does not report


def mask_to_avx2() -> None:
    """Make torch report an AVX2-only CPU in this process (before vLLM is imported)."""
    import types

    import torch

    real = dict(torch.cpu.get_capabilities())
    masked = types.MappingProxyType({k: (False if k.startswith(_MASKED) and v is True else v) for k, v in real.items()})
    torch.cpu.get_capabilities = lambda: masked  # torch.cpu._is_avx512_bf16_supported() & co. read this


def tiny(family: str, directory: Path, seed: int) -> str:
    import torch
    import transformers

    config_class, model_class, kwargs = FAMILIES[family]
    torch.manual_seed(seed)
    model = getattr(transformers, model_class)(getattr(transformers, config_class)(**kwargs))
    with torch.no_grad():  # norms around 1 (not exactly 1), so every tensor differs between A and B
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape))
    model.save_pretrained(directory, safe_serialization=True)
    return str(directory)


def conv_state(worker) -> dict:
    """Per MambaMixer2: its conv_weights buffer, whether the conv weight was prepacked, and
    whether the buffer still shares storage with the parameter."""
    out = {}
    for name, module in worker.get_model().named_modules():
        conv_weights = module._buffers.get("conv_weights") if hasattr(module, "_buffers") else None
        if conv_weights is None or not hasattr(module, "conv1d"):
            continue
        weight = module.conv1d.weight
        out[name] = dict(
            conv_weights=conv_weights.detach().clone(),
            prepacked=hasattr(module.conv1d, "_cpu_unpacked_conv_weight"),
            shares_storage=conv_weights.untyped_storage().data_ptr() == weight.untyped_storage().data_ptr(),
        )
    return out


def run_family(family: str, work: Path) -> bool:
    """True when the reload leaves a conv_weights buffer stale."""
    import torch
    from vllm import LLM, SamplingParams

    a, b = tiny(family, work / family / "A", 0), tiny(family, work / family / "B", 1)
    draw = random.Random(0)
    prompts = [{"prompt_token_ids": [draw.randrange(1, 512) for _ in range(12 + 3 * i)]} for i in range(4)]
    params = SamplingParams(temperature=0.0, max_tokens=12, detokenize=False)
    settings = dict(
        skip_tokenizer_init=True,
        dtype="bfloat16",
        enforce_eager=True,
        kv_cache_memory_bytes=64 << 20,
        max_model_len=256,
        max_num_seqs=8,
        seed=0,
    )

    def tokens(llm):
        return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params, use_tqdm=False)]

    llm = LLM(model=b, **settings)
    cold_b, cold_b_conv = tokens(llm), llm.collective_rpc(conv_state)[0]
    del llm
    llm = LLM(model=a, **settings)
    cold_a_conv = llm.collective_rpc(conv_state)[0]
    llm.collective_rpc("reload_weights", kwargs={"weights_path": b})
    warm, warm_conv = tokens(llm), llm.collective_rpc(conv_state)[0]
    del llm

    print(f"== {family} (bf16): {len(cold_b_conv)} MambaMixer2 layer(s)")
    stale_any = False
    for name, cold in cold_b_conv.items():
        got = warm_conv[name]["conv_weights"]
        fresh = torch.equal(got, cold["conv_weights"])
        stale = torch.equal(got, cold_a_conv[name]["conv_weights"])
        stale_any |= not fresh
        print(
            f"  {name}.conv_weights after reload_weights(B): "
            + ("equal to cold B" if fresh else "STALE (equal to cold A)" if stale else "CORRUPT (neither A nor B)")
            + f" | conv weight prepacked: {cold['prepacked']}, buffer shares the parameter's storage: "
            + f"{cold['shares_storage']}"
        )
    for i, (want, got) in enumerate(zip(cold_b, warm)):
        first = next((j for j, (x, y) in enumerate(zip(want, got)) if x != y), None)
        print(f"  prompt {i}: cold B {want}")
        print(f"  prompt {i}: A + reload_weights(B) {got}" + ("" if first is None else f" <- differs at token {first}"))
    prepacked = any(c["prepacked"] for c in cold_b_conv.values())
    if not prepacked and not stale_any:
        print(
            "  note: the causal-conv1d prepack was not taken here (no AVX512-BF16, or --as-avx2), so conv_weights "
            "stays a view of the reloaded weight: the bug cannot show on this CPU"
        )
    return stale_any


def sharded_state_round_trip(family: str, work: Path) -> bool:
    """True when a new engine cannot start from the state a cold engine saved."""
    import shutil

    from vllm import LLM

    b = tiny(family, work / family / "B", 1)
    settings = dict(
        skip_tokenizer_init=True,
        dtype="bfloat16",
        enforce_eager=True,
        kv_cache_memory_bytes=64 << 20,
        max_model_len=256,
        max_num_seqs=8,
        seed=0,
    )
    llm = LLM(model=b, **settings)
    state = work / family / "state"
    state.mkdir(parents=True)
    prepacked = any(c["prepacked"] for c in llm.collective_rpc(conv_state)[0].values())
    llm.collective_rpc("save_sharded_state", kwargs={"path": str(state)})
    del llm
    for f in Path(b).iterdir():  # the saver writes tensors only; the engine reads the config beside them
        if f.is_file() and not f.name.endswith(".safetensors"):
            shutil.copy2(f, state / f.name)
    print(f"== {family} (bf16): conv1d weight prepacked: {prepacked}; state saved, starting a new engine from it")
    try:
        restarted = LLM(model=str(state), load_format="sharded_state", **settings)
    except RuntimeError as exc:
        print(f"  load_format='sharded_state' raised: {str(exc).splitlines()[0]}")
        return True
    del restarted
    print("  the new engine started from the saved state")
    return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", choices=[*FAMILIES, "all"], default="mamba2")
    parser.add_argument(
        "--as-avx2",
        action="store_true",
        help="mask AVX-512/AMX in this process, so vLLM takes its AVX2 branch on this machine",
    )
    parser.add_argument(
        "--sharded-state",
        action="store_true",
        help="save the engine's sharded state and start a new engine from it, instead of reloading",
    )
    args = parser.parse_args()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process: a callable RPC
    if args.as_avx2:
        mask_to_avx2()
    import torch

    print(
        f"torch reports avx512_bf16={torch.cpu._is_avx512_bf16_supported()} "
        f"amx_tile={torch.cpu._is_amx_tile_supported()}" + (" (masked: --as-avx2)" if args.as_avx2 else "")
    )
    work = Path(tempfile.mkdtemp(prefix="vllm-mamba-conv-repro-"))
    families = list(FAMILIES) if args.family == "all" else [args.family]
    if args.sharded_state:
        failed = [f for f in families if sharded_state_round_trip(f, work)]
        print("sharded-state round trip fails:", ", ".join(failed) if failed else "no")
        return 1 if failed else 0
    stale = [f for f in families if run_family(f, work)]
    print("conv_weights stale after reload_weights:", ", ".join(stale) if stale else "no")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())

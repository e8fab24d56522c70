"""A kernel-format reload on vLLM's CPU backend leaves every packed GEMM kernel with the old weights.

Standalone (vLLM, torch and transformers only; no refit-harness): two tiny random Qwen3-MoE
checkpoints A and B (the zoo's config), then
- cold B: the output of every linear layer's kernel (``quant_method.apply``) on a fixed input;
- cold A; ``reload_weights(B)`` and vLLM's sharded-state saver (the engine's own kernel-format
  tensors of B); ``reload_weights(A)``; then ``reload_weights(weights_iterator=<saved B>,
  is_checkpoint_format=False)``, the kernel-format reload; the same outputs again.

Why: vLLM's CPU post-load hook (``dispatch_cpu_unquantized_gemm``) binds each linear to a
packed copy of its weight: an SGL ``weight_packed_linear`` (AMX CPUs, bf16, weights up to
1 MiB), a oneDNN handle (fp32 everywhere; bf16 wherever oneDNN takes bf16, i.e. any AVX-512
CPU), or plain ``torch.nn.functional.linear`` (bf16 on an AVX2-only CPU, where oneDNN refuses
bf16). The packed branches empty the ``weight`` Parameter (``remove_weight=True``; the
embedding and ``lm_head`` keep theirs). A kernel-format reload copies tensors into parameters
and runs no post-load hook, so every packed kernel keeps A's weights, with no error or
warning; the saved state does not even hold the emptied weights.

Prints each kernel's CPU branch and its status (OK: equal to cold B; STALE: equal to cold A)
and exits 1 while a kernel is STALE; 0 where none is (e.g. bf16 on an AVX2-only CPU: nothing
is packed). ``--dtype float32`` shows the oneDNN branch on any CPU. ``--as-avx2`` masks
AVX-512/AMX in this process and caps oneDNN at AVX2 (``ONEDNN_MAX_CPU_ISA``), so vLLM takes the
AVX2 branch on this machine.
Run: python repro/cpu_kernel_format_reload_leaves_packed_gemm_stale.py [--dtype float32] [--as-avx2]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import types
from pathlib import Path


def mask_to_avx2() -> None:
    """Make torch report an AVX2-only CPU in this process (before vLLM is imported)."""
    import torch

    real = dict(torch.cpu.get_capabilities())
    masked = types.MappingProxyType(
        {k: (False if k.startswith(("avx512", "amx")) and v is True else v) for k, v in real.items()}
    )
    torch.cpu.get_capabilities = lambda: masked


def tiny_qwen3_moe(directory: Path, seed: int) -> str:
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(seed)
    config = Qwen3MoeConfig(
        vocab_size=512,
        hidden_size=128,
        num_hidden_layers=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        intermediate_size=256,
        moe_intermediate_size=64,
        num_experts=4,
        num_experts_per_tok=2,
        decoder_sparse_step=1,
        norm_topk_prob=True,
        rms_norm_eps=1e-6,
    )
    model = Qwen3MoeForCausalLM(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape))
    model.save_pretrained(directory, safe_serialization=True)
    return str(directory)


def branch(module) -> str:
    """Which branch of dispatch_cpu_unquantized_gemm bound the layer's cpu_linear (its closure says)."""
    import torch

    fn = getattr(module, "cpu_linear", None)
    if fn is None:
        return "no cpu_linear"
    if fn is torch.nn.functional.linear:
        return "torch linear"
    free = set(getattr(getattr(fn, "__code__", None), "co_freevars", ()))
    return (
        "sgl weight_packed_linear"
        if "packed_weight" in free
        else "oneDNN onednn_mm"
        if "handler" in free
        else "zentorch"
        if "zen_weight" in free
        else "torch linear (fallback)"
    )


def kernels(worker) -> dict:
    """Every linear kernel's output on a fixed input, with its branch and its weight's size."""
    import torch

    gen = torch.Generator().manual_seed(0)
    out = {}
    with torch.inference_mode():
        for name, m in worker.get_model().named_modules():
            method = getattr(m, "quant_method", None)
            width = getattr(m, "input_size_per_partition", None) or getattr(m, "input_size", None)
            if method is None or not hasattr(method, "apply") or not isinstance(width, int) or "experts" in name:
                continue
            x = torch.randn(3, width, generator=gen).to(getattr(m, "params_dtype", torch.float32))
            weight = getattr(m, "weight", None)
            out[name] = dict(
                y=method.apply(m, x, None).clone(), branch=branch(m), weight=0 if weight is None else weight.numel()
            )
    return out


def save_state(worker, path: str) -> None:
    Path(path).mkdir(parents=True, exist_ok=True)
    worker.save_sharded_state(path=path)


def reload_kernel_format(worker, path: str) -> None:
    import torch
    from safetensors.torch import load_file

    params = {n for n, _ in worker.get_model().named_parameters(remove_duplicate=False)}
    tensors = {}
    for f in sorted(Path(path).glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    with torch.no_grad():  # vLLM copies with a plain param.copy_, which a leaf requiring grad refuses
        worker.reload_weights(
            weights_iterator=iter([(n, t) for n, t in tensors.items() if n in params]), is_checkpoint_format=False
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    parser.add_argument("--as-avx2", action="store_true", help="take vLLM's AVX2 branch on this machine")
    args = parser.parse_args()
    if args.as_avx2 and os.environ.get("ONEDNN_MAX_CPU_ISA") != "AVX2":
        # oneDNN reads its cap when it starts: run again with it set from the start.
        env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}
        return subprocess.run([sys.executable, *sys.argv], env=env).returncode
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process: a callable RPC
    if args.as_avx2:
        mask_to_avx2()
    import torch
    from vllm import LLM

    work = Path(tempfile.mkdtemp(prefix="vllm-kernel-format-repro-"))
    a, b = tiny_qwen3_moe(work / "A", 0), tiny_qwen3_moe(work / "B", 1)
    settings = dict(
        skip_tokenizer_init=True,
        dtype=args.dtype,
        enforce_eager=True,
        kv_cache_memory_bytes=64 << 20,
        max_model_len=256,
        max_num_seqs=8,
        seed=0,
    )
    llm = LLM(model=b, **settings)
    cold_b = llm.collective_rpc(kernels)[0]
    del llm
    llm = LLM(model=a, **settings)
    cold_a = llm.collective_rpc(kernels)[0]
    llm.collective_rpc("reload_weights", kwargs={"weights_path": b})
    llm.collective_rpc(save_state, args=(str(work / "state-B"),))
    llm.collective_rpc("reload_weights", kwargs={"weights_path": a})
    llm.collective_rpc(reload_kernel_format, args=(str(work / "state-B"),))
    warm = llm.collective_rpc(kernels)[0]
    del llm

    print(
        f"{args.dtype}; torch reports avx512_bf16={torch.cpu._is_avx512_bf16_supported()} "
        f"amx_tile={torch.cpu._is_amx_tile_supported()}" + (" (masked: --as-avx2)" if args.as_avx2 else "")
    )
    stale = []
    for name, cold in cold_b.items():
        got = warm[name]["y"]
        status = "OK" if torch.equal(got, cold["y"]) else "STALE" if torch.equal(got, cold_a[name]["y"]) else "CORRUPT"
        if status != "OK":
            stale.append(name)
        print(f"  {name:36} {cold['branch']:26} weight Parameter numel {cold['weight']:6}: {status}")
    print("kernels left with the old weights by the kernel-format reload:", len(stale) or "none")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())

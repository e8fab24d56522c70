"""CPU W8A8 int8 on an AMX CPU: the first forward kills the engine's process, two ways.

Standalone (vLLM, torch, safetensors and transformers only; no refit-harness): a tiny random
Qwen3 written as a compressed-tensors W8A8 int8 checkpoint (static per-channel int8 weights,
dynamic symmetric per-token int8 activations). On a CPU with AMX, vLLM's CPU int8 kernel takes
its SGL path (``csrc/cpu/sgl-kernels/gemm_int8.cpp``) for symmetric activations. The engine
loads and then dies at the first request, with no Python exception:

- **bfloat16: SIGILL**, in vLLM's bf16 attention kernel (gdb: ``cpu_attn_amx.hpp:460``), not in
  the int8 GEMM that runs before it: its AMX path runs tile instructions without asking Linux
  for the AMX state (``arch_prctl(ARCH_REQ_XCOMP_PERM)``, what ``torch._C._cpu._init_amx()`` and
  oneDNN do), and this 4-token prompt makes nothing else ask first
  (repro/amx_attention_kills_a_fresh_engine.py). ``--request-amx`` asks first, and the same
  engine generates.
- **float16 (``--float16``, with ``--request-amx``): SIGABRT.** The kernel has no float16 output;
  its first GEMM throws ``c10::Error("...: scalar path not implemented!")`` in a parallel region,
  and ``std::terminate`` aborts the process.

The engine runs in a child process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: the worker is that
process) so that its death can be seen. vLLM 0.32.0 on an AMX Xeon: exit 1 while the child dies
(its signal and native message are printed), 0 once it generates.
Run: python repro/amx_int8_gemm_kills_the_engine.py [--request-amx] [--float16]
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

DTYPE = "float16" if "--float16" in sys.argv else "bfloat16"
REQUEST_AMX = "--request-amx" in sys.argv


def write_w8a8_int8_qwen3(directory: Path) -> None:
    """A tiny random Qwen3 in compressed-tensors W8A8 int8, symmetric activations."""
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
    Qwen3ForCausalLM(config).save_pretrained(directory, safe_serialization=True)
    tensors = {}
    for name, w in load_file(str(directory / "model.safetensors")).items():
        if name.endswith("_proj.weight") and ".layers." in name:
            scale = w.float().abs().amax(dim=1, keepdim=True) / 127.0
            tensors[name] = torch.round(w.float() / scale).clamp(-128, 127).to(torch.int8)
            tensors[name.removesuffix("weight") + "weight_scale"] = scale
        else:
            tensors[name] = w.contiguous()
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((directory / "config.json").read_text())
    scheme = {"num_bits": 8, "type": "int", "symmetric": True}
    cfg["quantization_config"] = {
        "quant_method": "compressed-tensors",
        "format": "int-quantized",
        "quantization_status": "compressed",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {**scheme, "strategy": "channel", "dynamic": False},
                "input_activations": {**scheme, "strategy": "token", "dynamic": True},
            }
        },
        "ignore": ["lm_head"],
    }
    (directory / "config.json").write_text(json.dumps(cfg))


def generate(model: str) -> None:
    """The child: start the engine in ``DTYPE`` and generate once."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import torch

    if REQUEST_AMX:
        print(f"AMX state requested: {torch._C._cpu._init_amx()}", flush=True)
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=model,
        dtype=DTYPE,
        skip_tokenizer_init=True,
        enforce_eager=True,
        kv_cache_memory_bytes=64 << 20,
        max_model_len=256,
        max_num_seqs=4,
    )
    out = llm.generate(
        [{"prompt_token_ids": [5, 9, 13, 17]}], SamplingParams(temperature=0, max_tokens=4, detokenize=False)
    )
    print(f"generated {list(out[0].outputs[0].token_ids)}", flush=True)


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        generate(sys.argv[2])
        return 0
    model = Path(tempfile.mkdtemp(prefix="w8a8-int8-fp16-"))
    write_w8a8_int8_qwen3(model)
    child = subprocess.run(
        [sys.executable, __file__, "--child", str(model), *sys.argv[1:]], capture_output=True, text=True
    )
    said = [ln.strip() for ln in child.stderr.splitlines() if "what():" in ln or "Exception raised from" in ln]
    amx = "AMX state requested first" if REQUEST_AMX else "nothing requested the AMX state"
    died = f" ({signal.Signals(-child.returncode).name})" if child.returncode < 0 else ""
    print(
        f"W8A8 int8 (symmetric activations) in {DTYPE}, {amx}: the engine's process exited with {child.returncode}{died}"
    )
    last = (child.stdout.strip() or child.stderr.strip()).splitlines()[-1:]
    print("\n".join(said or last))
    return 0 if child.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

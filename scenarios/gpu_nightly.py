"""The GPU nightly gate: a real model on every path, eager and compiled, TP 1 and 2; and the
HPC QK-norm configuration (the bug this project was built around) on a tiny HunYuan V3.

The model comes from ``REFIT_HARNESS_NIGHTLY_MODEL`` (a checkpoint directory, or a hub id
on hosts with hub access), or ``--refit-model`` / ``--model`` at run time.

The HPC cell runs HunYuan V3 with ``attention_backend=HPC_ATTN``: with Tencent's ``hpc``
package (hpc-ops, built for sm90) installed, every attention layer builds an ``HpcRopeNorm``
whose fused kernel does RoPE, QK-norm and the KV write in one launch and reads the QK-norm
weights itself. Before vLLM PR #56706 it read float32 mirror parameters
(``hpc_rope_norm.qnorm_weight`` / ``knorm_weight``) filled by a post-load hook that only the
cold start runs; since, ``q_norm`` / ``k_norm`` are built in float32 and read directly. The
cell's expected census names both forms and HpcRopeNorm's own ``cos_sin_cache``: a run where the
HPC path was not active (the model fell back to the eager norms) is INCONCLUSIVE, not a PASS.

The drafter cells (``DRAFTER_PATHS``) run the main model with speculative decoding: the CPU zoo
has the same cells on its tiny families, and the GPU adds level-2 sleep, whose loss of the
drafter's weights was reported on GPUs (vllm #52487). The preflight builds their engine
configuration, speculative decoding included, before any GPU is held.
Elsewhere than sm90 the cell is SKIPPED with that reason. The iHC fused ops of the same PR
(``HpcIHCPre``/``HpcIHCHead``, which read their owner's ``hc_fn.weight``, ``hc_scale``,
``hc_base`` and ``hc_head_*`` through an alias) belong to HunYuan V4 on sm100/sm103 only
(``hpc_ihc._SUPPORTED_CAPABILITIES``): ``IHC_ALIASES`` names them for such a cell.

The nightly runs in bf16 (the production dtype), eager and compiled (torch.compile with CUDA
graphs), with a KV cache sized from each model's own config (every sequence of
``max_num_seqs`` at ``max_model_len``, with a margin: a fixed 64 MiB cannot hold one 512-token
fp32 sequence of Qwen3-0.6B). The main model's cells pin the production attention backend
(``REFIT_HARNESS_NIGHTLY_ATTENTION``, default ``FLASH_ATTN``), so an engine that cannot run it
fails instead of silently testing another one.

``refit-harness preflight -s gpu-nightly`` checks every cell on any machine, CPU included:
its engine arguments, its KV cache, each backend's trainer, the optional packages and the
Ray placement of every arm and trainer (``docs/gpu-nightly.md``).
"""

import os

from harness.settings import NIGHTLY_ATTENTION_ENV, NIGHTLY_MODEL_ENV
from harness.spec.engine_config import EngineConfig, encode
from harness.spec.run import EngineSpec
from harness.spec.scenario import ModelRef, ScenarioSpec

GPU_PATHS = (
    "reload_weights",
    "reload_weights_iterator",
    "discard_reload",
    "dummy_start",
    "prefix_cache",
    "http_reload",
    "http_weight_transfer",
    "trainer_steps",
    "trainer_steps_gloo",
    "sleep_level1",
    "sleep_level2",
    "transfer_nccl",
    "transfer_ipc",
    "transfer_sparse_nccl",
    "transfer_sharded_rdt",
    "transfer_nccl_m2n",
    # The refit calls RL frameworks make (issue 21): raw load_weights runs on a GPU (its CPU refusal
    # is vLLM's design), and the LoRA paths.
    "raw_load_weights",
    "lora_inplace",
    "lora_inplace_prefix_cache",
    "lora_inplace_same_path",
    "lora_base_reload",
)


DRAFTER_PATHS = ("reload_weights", "reload_weights_drafter", "sleep_level2")
"""The drafter cell's paths (issue 35): every engine drafts 2 tokens with a ``draft_model`` drafter of
its own checkpoint; ``reload_weights`` is judged on the acceptance rate (it refits the target only),
``reload_weights_drafter`` refits the drafter too, and level-2 sleep discards the drafter's weights
with the target's before the reload (vllm #52487)."""

HUNYUAN = ModelRef(label="hunyuan-v3", builder="zoo:hunyuan-v3")

HPC_QK_NORM = (
    r"\.self_attn\.(hpc_rope_norm\.qnorm_weight|q_norm\.weight)$",
    r"\.self_attn\.(hpc_rope_norm\.knorm_weight|k_norm\.weight)$",
    r"\.self_attn\.hpc_rope_norm\.cos_sin_cache$",
)
"""What HpcRopeNorm's fused kernel reads, on a build before PR #56706 (its float32 mirrors) or
after (the float32 norms themselves), and its own RoPE cache (present only when HPC is active)."""

IHC_ALIASES = (
    r"\.hc_(attn|mlp)_layer\.hc_pre\.hc_fn\.weight$",
    r"\.hc_(attn|mlp)_layer\.hc_pre\.hc_(scale|base)$",
    r"\.hc_head\.hc_head_fn\.weight$",
    r"\.hc_head\.hc_head_(base|scale)$",
)
"""The weights HunYuan V4's fused iHC ops read through their owner alias (sm100/sm103 only)."""

HPC_OPS = (
    "hpc",
    "attention_backend=HPC_ATTN and HpcRopeNorm need Tencent's hpc-ops (https://github.com/Tencent/hpc-ops), which "
    "is not on PyPI and no extra installs: build it into the runner image (docs/gpu-nightly.md, 'Building hpc-ops')",
)
"""The module the HPC cell's engines import, and where to get it."""

HPC_ATTN = EngineConfig(
    label="hpc",
    args=encode({"attention_backend": "HPC_ATTN"}),
    models=(HUNYUAN.label,),
    expect_census=HPC_QK_NORM,
    devices=("sm90",),
    skip_reason="the HPC QK-norm configuration (attention_backend=HPC_ATTN with Tencent's hpc-ops) runs on sm90 only",
    packages=(HPC_OPS,),
    paths=GPU_PATHS,
)


def gpu_nightly() -> ScenarioSpec:
    model = os.environ.get(NIGHTLY_MODEL_ENV, "Qwen/Qwen3-0.6B")
    label = model.rstrip("/").split("/")[-1]
    attention = os.environ.get(NIGHTLY_ATTENTION_ENV, "FLASH_ATTN")
    pinned = encode({"attention_backend": attention}) if attention else ()
    return ScenarioSpec(
        name="gpu-nightly",
        description=(
            f"every path on {model}, bf16, eager+compiled (CUDA graphs), TP 1 and 2, {attention or 'vLLM'}'s "
            "attention; the same model with a drafter of its own checkpoint; and the HPC QK-norm cell on HunYuan V3 "
            "(GPU)"
        ),
        models=(ModelRef(label=label, path=model), HUNYUAN),
        engine_configs=(
            EngineConfig(models=(label,), args=pinned, paths=GPU_PATHS),
            EngineConfig(label="drafter", models=(label,), args=pinned, draft_tokens=2, paths=DRAFTER_PATHS),
            HPC_ATTN,
        ),
        paths=GPU_PATHS + ("reload_weights_drafter",),
        modes=("eager", "compiled"),
        dtypes=("bfloat16",),
        tp_sizes=(1, 2),
        engine=EngineSpec(kv_cache_memory_bytes=None),
        arm_timeout_s=1800.0,
        device="cuda",
    )

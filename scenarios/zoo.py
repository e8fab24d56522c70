"""The model zoo: one cell group per stock architecture family vLLM runs, each a tiny
random checkpoint built from a transformers config (``harness.checkpoints.zoo``), in bf16 and
fp16 (what users run: vLLM's x86 CPU backend runs both, and its kernels take a path per dtype;
``--dtype float32`` for the fp32 grid). ``refit-harness run -s zoo`` gives an architecture x
dtype x path verdict grid.

Beside the stock families: a vision-language family whose prompts carry generated images
(``idefics3``, with path ``encoder_cache``), a tied-embedding variant of each dense one (``<family>-tied``), and
a Qwen3 with checkpoint KV-cache scales run with an fp8 KV cache (``qwen3-fp8kv``, its engine
arguments come with the family). Each attention family runs again with a speculative-decoding
drafter of its own checkpoint (``DRAFTER_PATHS``), the Llama once more with an EAGLE head, and a
MiMo and a DeepSeek-V3 with the multi-token-prediction layer their checkpoints carry (``mimo``,
``deepseek-v3-mtp``: MTP drafters)."""

from harness.checkpoints.zoo import FAMILIES, KV_FAMILIES, MTP_FAMILIES, TIED_FAMILIES, VISION_FAMILIES
from harness.spec.engine_config import EngineConfig
from harness.spec.scenario import ModelRef, ScenarioSpec
from scenarios.default import CPU_PATHS

ZOO_DTYPES = ("bfloat16", "float16")
"""The zoo's dtypes: both half-precision formats vLLM's CPU backend supports on x86."""
VISION_PATHS = ("encoder_cache",)
"""Paths about images: they run on the vision-language family and are SKIPPED, without an engine,
on the text ones."""
ZOO_FAMILIES = FAMILIES + VISION_FAMILIES + TIED_FAMILIES + KV_FAMILIES + MTP_FAMILIES
ZOO_MODELS = tuple(ModelRef(label=f.label, builder=f"zoo:{f.label}", engine_args=f.engine_args) for f in ZOO_FAMILIES)
SSM_FAMILIES = ("mamba2", "nemotron-h", "granitemoe-hybrid")
"""Families with Mamba layers, left out of the drafter cells: with a draft_model drafter vLLM 0.32
raises a bare ``assert is_prefilling is not None`` (mamba_attn.py) at the first forward (measured on
mamba2, docs/paths.md), which no harness can read as a refusal."""
DRAFTER_PATHS = ("reload_weights", "reload_weights_drafter")
"""The drafter cells' paths (issue 35): each family again with a ``draft_model`` drafter of its own
checkpoint drafting 2 tokens. ``reload_weights`` leaves the drafter at A, a FAIL ("drafter stale",
by its tensors and its acceptance rate; tokens identical); ``reload_weights_drafter`` refits it too."""
DRAFTER_MODELS = tuple(f.label for f in FAMILIES if f.label not in SSM_FAMILIES)
"""The drafter cells' families: the text ones without Mamba layers. Not the vision-language one: vLLM
0.32's draft_model proposer cannot start with an Idefics3 drafter (``AttributeError: 'Idefics3Config'
object has no attribute 'image_token_index'``, measured in bf16), an unsupported configuration that
vLLM does not word as a refusal."""
EAGLE_MODELS = ("llama",)
"""The EAGLE drafter cells' family: vLLM 0.32 runs an EAGLE head (method ``eagle``) for a Llama-family
target only (``EagleLlamaForCausalLM``); the harness derives each checkpoint's head from its last
layer (``harness.checkpoints.eagle``)."""
MTP_MODELS = tuple(f.label for f in MTP_FAMILIES)
"""The MTP drafter cells' families: vLLM 0.32's MiMo MTP layer drafts one token a step (its forward
asserts ``spec_step_idx == 0``), and so do DeepSeek-V3's, as the cells run them."""
ZOO_ENGINE_CONFIGS = (
    EngineConfig(paths=CPU_PATHS + VISION_PATHS),
    EngineConfig(label="drafter", models=DRAFTER_MODELS, draft_tokens=2, paths=DRAFTER_PATHS),
    EngineConfig(label="eagle", models=EAGLE_MODELS, draft_tokens=2, drafter="eagle", paths=DRAFTER_PATHS),
    EngineConfig(label="mtp", models=MTP_MODELS, draft_tokens=1, drafter="mtp", paths=DRAFTER_PATHS),
)


def zoo() -> ScenarioSpec:
    return ScenarioSpec(
        name="zoo",
        description=f"{len(FAMILIES)} stock architecture families, {len(VISION_FAMILIES)} vision-language one, "
        f"{len(TIED_FAMILIES)} tied-embedding variants, an fp8 KV cache with checkpoint scales, and a MiMo and a "
        "DeepSeek-V3 with an MTP layer x every CPU path, bf16 and fp16",
        models=ZOO_MODELS,
        engine_configs=ZOO_ENGINE_CONFIGS,
        paths=CPU_PATHS + VISION_PATHS + ("reload_weights_drafter",),
        dtypes=ZOO_DTYPES,
    )


DENSE = ("llama", "qwen3", "qwen2", "phi3", "gemma3")
"""The zoo's dense transformer families (no experts, no SSM layers)."""
RL_PATHS = (
    "raw_load_weights",
    "lora_inplace",
    "lora_inplace_prefix_cache",
    "lora_inplace_same_path",
    "lora_base_reload",
    "http_weight_transfer",
    "trainer_steps",
    "trainer_steps_gloo",
)
"""The refit calls RL frameworks make (issue 21): raw load_weights, LoRA in place, the RL HTTP
API with requests in flight, a live trainer's parameters (over a callable RPC and over gloo)."""


def rl_paths() -> ScenarioSpec:
    return ScenarioSpec(
        name="rl-paths",
        description=f"the dense zoo families x the RL frameworks' refit calls, bf16 ({len(DENSE)} families)",
        models=tuple(m for m in ZOO_MODELS if m.label in DENSE),
        paths=RL_PATHS,
        dtypes=("bfloat16",),
    )

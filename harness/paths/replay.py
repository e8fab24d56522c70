"""A refit delivered at least once: a trainer that retries a bucket sends some tensors twice
within one refit. Every copy of a tensor carries the target's value, so the engine must still
end at cold B, exactly as if each tensor had arrived once."""

from __future__ import annotations

from harness.paths import reload_path
from harness.paths.base import Engine, ReloadPath
from harness.spec.known_issues import THROUGH_034, KnownIssue
from harness.spec.requirements import EngineRequirements, RefitTarget

DELIVERIES = 2
"""How often each bucket arrives: once, and once more as the trainer's retry."""


def retried_feed(tensors: list, deliveries: int = DELIVERIES) -> list:
    """The checkpoint's (name, tensor) pairs as the engine receives them when every bucket (one
    tensor each, in checkpoint order) is retried: each pair ``deliveries`` times in a row. A
    tensor of a fused layer (q of qkv_proj, gate of gate_up_proj) thus arrives again before the
    layer's other tensors, as when a retried bucket ends in the middle of a layer."""
    return [pair for pair in tensors for _ in range(deliveries)]


@reload_path
class RetriedBuckets(ReloadPath):
    name = "reload_retried_buckets"
    exercises = (
        "reload_weights(weights_iterator=...) fed a trainer's buckets (one tensor each, in checkpoint "
        "order), every bucket delivered twice in a row as a trainer that retries a send does: part of a "
        "layer arrives again before the rest of it. Every copy holds the target's value, so the result "
        "must be cold B"
    )
    sabotage = "the positive-control tensor left out of the retried feed"
    # Its refit raises on stock vLLM 0.32 on the CPU (the known issue below) and leaves the engine
    # mid-reload: an engine of its own, so the raise takes no other path's evidence with it
    # (measured: in the shared engine, reload_weights' twins were not run and the paths INCONCLUSIVE).
    requirements = EngineRequirements(isolated=True)
    known_issues = (
        KnownIssue(
            device="cpu",
            vllm=THROUGH_034,  # 0.34: the same error, and the repro holds (`-s regressions --build stock=...`)
            error_contains="object has no attribute 'weight_loader'",
            title="Layerwise reload finishes a fused layer early when part of it is sent twice, and the rest of "
            "the layer's loads then fail",
            reason="vLLM's layerwise reload decides that a layer has loaded by counting elements "
            "(load_numel >= load_numel_total, reload/layerwise.py), so a shard sent twice counts twice: "
            "gate_proj's second copy brings gate_up_proj to its total (q and k do the same for qkv_proj), the "
            "layer is processed with up_proj's rows still the empty_strided allocation, and the CPU post-load "
            "hook swaps in a new Parameter; up_proj's load then raises AttributeError: 'Parameter' object has "
            "no attribute 'weight_loader' (measured on 0.32 on the CPU, float32 and bfloat16, and on a 0.34 CPU build). Where the "
            "parameter keeps its loader the late load is dropped as 'excessive loading' instead, silently. "
            "RFC vllm-project/vllm#48312; its fix #50075 was closed unmerged "
            "(repro/layerwise_duplicate_tensor_finishes_layer_early.py, docs/findings/layerwise-duplicate-tensor.md)",
        ),
    )

    def _feed(self, checkpoint_dir: str, exclude: tuple[str, ...] = ()) -> list:
        from harness import safetensors_files

        tensors = list(safetensors_files.tensors(safetensors_files.files(checkpoint_dir), exclude=exclude))
        return retried_feed(tensors)

    def refit(self, engine: Engine, checkpoint_dir: str, target: RefitTarget) -> None:
        engine.rpc("refit_harness_load_tensors", {"tensors": self._feed(checkpoint_dir)})

    def sabotaged_refit(self, engine: Engine, target: RefitTarget) -> None:
        engine.rpc(
            "refit_harness_load_tensors",
            {"tensors": self._feed(self.checkpoints.directory(target), exclude=(self.left_out,))},
        )

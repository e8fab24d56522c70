"""The raw ``model.load_weights(iterator)`` call that colocated trainers make inside the worker."""

from __future__ import annotations

from harness.paths import reload_path
from harness.paths.base import Engine, ReloadPath
from harness.spec.known_issues import Refusal
from harness.spec.requirements import EngineRequirements, RefitTarget

CPU_EMPTIED_WEIGHTS = Refusal(
    device="cpu",
    error_contains="into parameter (torch.Size([0]))",
    reason=(
        "vLLM's CPU backend moves every linear weight into a prepacked GEMM handle after loading (oneDNN, or the "
        "SGL kernels on AMX) and leaves its Parameter empty, so a raw model.load_weights() has nowhere to write; "
        "vLLM's refit API on the CPU is reload_weights, which restores the Parameters around the load"
    ),
)


@reload_path
class RawLoadWeights(ReloadPath):
    name = "raw_load_weights"
    exercises = (
        "model.load_weights(iterator over B) under torch.no_grad() inside the worker, as colocated trainers do "
        "(verl, TRL colocate, SkyRL): the model's own loader, no layerwise reload lifecycle, no post-load hook"
    )
    # A refused first refit ends its engine's arm: the other paths' segments must not share it.
    requirements = EngineRequirements(isolated=True)
    refusals = (CPU_EMPTIED_WEIGHTS,)
    sabotage = "the positive-control tensor left out of the iterator handed to model.load_weights"

    def refit(self, engine: Engine, checkpoint_dir: str, target: RefitTarget, exclude: tuple[str, ...] = ()) -> None:
        engine.rpc("refit_harness_raw_load_weights", {"checkpoint_dir": checkpoint_dir, "exclude": list(exclude)})

    def sabotaged_refit(self, engine: Engine, target: RefitTarget) -> None:
        self.refit(engine, self.checkpoints.directory(target), target, exclude=(self.left_out,))

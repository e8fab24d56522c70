"""Layerwise in-place reload (``reload_weights``): from a directory, from an in-memory
iterator, and after discarding the weights."""

from __future__ import annotations

from typing import TYPE_CHECKING

from harness.paths.base import RefitTarget, ReloadPath

if TYPE_CHECKING:
    from harness.engine.handles import Engine


class ReloadWeightsFromDirectory(ReloadPath):
    name = "reload_weights"
    exercises = ("collective_rpc('reload_weights', weights_path=DIR): vLLM's layerwise reload "
                 "(initialize_layerwise_reload -> model.load_weights -> finalize_layerwise_reload)")

    def refit(self, engine: Engine, checkpoint_dir: str, target: RefitTarget) -> None:
        engine.rpc("reload_weights", {"weights_path": checkpoint_dir})


class ReloadWeightsFromIterator(ReloadPath):
    name = "reload_weights_iterator"
    exercises = ("reload_weights(weights_iterator=...) with in-memory checkpoint-format tensors, fed inside the "
                 "worker as a colocated trainer does")

    def refit(self, engine: Engine, checkpoint_dir: str, target: RefitTarget) -> None:
        engine.rpc("refit_harness_reload_from_iterator", {"checkpoint_dir": checkpoint_dir})


class DiscardThenReload(ReloadPath):
    name = "discard_reload"
    exercises = ("collective_rpc('reset_weights') (every parameter zeroed, as when weight memory is lost), then "
                 "reload_weights from a directory: the CPU-capable stand-in for sleep level 2")

    def refit(self, engine: Engine, checkpoint_dir: str, target: RefitTarget) -> None:
        engine.rpc("reset_weights")
        engine.rpc("reload_weights", {"weights_path": checkpoint_dir})

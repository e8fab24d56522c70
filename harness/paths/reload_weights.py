"""Layerwise in-place reload from a checkpoint directory."""

from __future__ import annotations

from typing import Any

from harness.paths.base import ReloadPath


class ReloadWeightsFromDirectory(ReloadPath):
    name = "reload_weights"
    exercises = ("collective_rpc('reload_weights', weights_path=DIR): vLLM's layerwise reload "
                 "(initialize_layerwise_reload -> model.load_weights -> finalize_layerwise_reload)")

    def refit(self, llm: Any, checkpoint_dir: str) -> None:
        llm.collective_rpc("reload_weights", kwargs={"weights_path": checkpoint_dir})

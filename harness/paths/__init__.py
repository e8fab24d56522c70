"""Reload paths: one class per module, registered by name, imported on lookup."""

from harness.registry import Registry

PATHS: Registry = Registry("reload path")
PATHS.register("reload_weights", "harness.paths.reload_weights:ReloadWeightsFromDirectory")

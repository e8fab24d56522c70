"""The resolved checkpoints of a run, as plain data.

Apart from ``harness.checkpoints.prepare`` (which prepares them, with torch), so that the planner and
the reports can name them without importing anything that touches tensors.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CheckpointSet:
    """The three checkpoints an oracle run needs."""

    a: str
    """Directory of checkpoint A (the starting weights)."""
    b: str
    """Directory of checkpoint B (the refit target); differs from A in every tensor."""
    b_control: str
    """Directory of B' = B with ``control_tensor`` scaled: the planted difference."""
    control_tensor: str
    """Checkpoint name of the tensor scaled in B'."""
    control_reason: str = ""
    """Why this tensor: given by the user, or how it was chosen automatically."""
    b_without_control: str | None = None
    """B with ``control_tensor`` left out, for sabotaged refits (None unless asked for):
    a refit from it leaves that one tensor where it was."""
    b_damaged: str | None = None
    """B heavily damaged (``--accuracy`` only): the accuracy probe's discriminating-power arm
    cold-starts on it."""

    def directory(self, key: str) -> str:
        found = {"A": self.a, "B": self.b, "B_control": self.b_control, "B_damaged": self.b_damaged}[key]
        if found is None:
            raise ValueError(f"no checkpoint {key} was prepared for this run")
        return found


PEFT_PREFIX = "base_model.model."
"""The prefix PEFT gives every tensor of an adapter."""


def adapted_weight(adapter_tensor: str) -> str:
    """The base weight a LoRA adapter tensor adapts, under the checkpoint's name:
    ``base_model.model.X.lora_A.weight`` -> ``X.weight`` (vLLM loads the pair into ``X``'s LoRA
    layer, or into the fused layer that packs ``X``); other names are returned unchanged."""
    name = adapter_tensor.removeprefix(PEFT_PREFIX)
    for part in (".lora_A.weight", ".lora_B.weight"):
        if name.endswith(part):
            return name[: -len(part)] + ".weight"
    return adapter_tensor

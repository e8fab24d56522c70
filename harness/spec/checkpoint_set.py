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
    architecture: str | None = None
    """``architectures[0]`` of A's config.json: the model class known issues are scoped on when no
    engine ever observed the model (a cold start that raised). Older records: None."""
    tied_embeddings: bool | None = None
    """A's config.json ``tie_word_embeddings`` (``lm_head`` is the embedding), which known issues
    can be scoped on; None where the config does not say and for older records."""
    quantization: str | None = None
    """A's quantization format (``checkpoints.quantize.describe``, e.g.
    ``compressed-tensors/float/block``), which known issues can be scoped on; None for a float
    checkpoint and older records."""

    def directory(self, key: str) -> str:
        found = {"A": self.a, "B": self.b, "B_control": self.b_control, "B_damaged": self.b_damaged}[key]
        if found is None:
            raise ValueError(f"no checkpoint {key} was prepared for this run")
        return found

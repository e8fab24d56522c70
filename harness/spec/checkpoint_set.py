"""The resolved checkpoints of a run, as plain data.

Apart from ``harness.checkpoints.prepare`` (which prepares them, with torch), so that the planner and
the reports can name them without importing anything that touches tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.errors import CheckpointError


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
    """A's quantization format (``checkpoints.quantize.describe_quantization``, e.g.
    ``compressed-tensors/float/block``), which known issues can be scoped on; None for a float
    checkpoint and older records."""

    control_scale: float = 1.01
    """The factor ``control_tensor`` is scaled by in B' (``ControlSpec.scale``); a trainer scales
    its own copy of that tensor by it for its positive control."""
    trainer_steps: tuple[str, ...] = ()
    """The live trainer's ``save_pretrained`` after each optimizer step (``T1``, ``T2``...), made
    when a trainer path runs (see ``harness.spec.run.TrainerSpec``); empty otherwise."""
    drafter_heads: tuple[tuple[str, str], ...] = ()
    """``(checkpoint directory, its EAGLE head's directory)`` for A, B and B' when the engines draft
    with an EAGLE head (``EngineSpec.drafter``, ``harness.checkpoints.eagle``); empty otherwise:
    a drafter loads the target's own checkpoint."""

    def drafter_checkpoint(self, directory: str) -> str:
        """What the drafter loads beside the target checkpoint ``directory``: its EAGLE head, or
        the checkpoint itself (a ``draft_model`` drafter). An engine starts with it, and a refit
        that reaches the drafter reloads it from it."""
        return dict(self.drafter_heads).get(directory, directory)

    def directory(self, key: str) -> str:
        step = trainer_step(key)
        if step is not None:
            if not 1 <= step[0] <= len(self.trainer_steps):
                raise ValueError(f"no trainer step {step[0]} was prepared for this run")
            # T<k>_control: the trainer's own step-k weights, the control tensor scaled as it is sent.
            return self.trainer_steps[step[0] - 1]
        found = {"A": self.a, "B": self.b, "B_control": self.b_control, "B_damaged": self.b_damaged}[key]
        if found is None:
            raise ValueError(f"no checkpoint {key} was prepared for this run")
        return found


PEFT_PREFIX = "base_model.model."
"""The prefix PEFT gives every tensor of an adapter."""


MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The ``max_lora_rank`` values vLLM accepts (``vllm.config.lora.MaxLoRARanks``, a ``Literal``
that its config validates: any other value refuses the engine)."""


def lora_max_rank(rank: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that holds an adapter of ``rank``; above the
    largest, no engine can serve the adapter (``CheckpointError``)."""
    allowed = next((r for r in MAX_LORA_RANKS if rank <= r), None)
    if allowed is None:
        raise CheckpointError(f"LoRA rank {rank} is above vLLM's largest max_lora_rank ({MAX_LORA_RANKS[-1]})")
    return allowed


def adapted_weight(adapter_tensor: str) -> str:
    """The base weight a LoRA adapter tensor adapts, under the checkpoint's name:
    ``base_model.model.X.lora_A.weight`` -> ``X.weight`` (vLLM loads the pair into ``X``'s LoRA
    layer, or into the fused layer that packs ``X``); other names are returned unchanged."""
    name = adapter_tensor.removeprefix(PEFT_PREFIX)
    for part in (".lora_A.weight", ".lora_B.weight"):
        if name.endswith(part):
            return name[: -len(part)] + ".weight"
    return adapter_tensor


def trainer_target(step: int, control: bool = False) -> str:
    """The refit target of a trainer's optimizer step: ``T<k>``, or ``T<k>_control`` (the step's
    weights with the positive-control tensor scaled)."""
    return f"T{step}" + ("_control" if control else "")


def trainer_step(target: str) -> tuple[int, bool] | None:
    """``(step, control)`` of a trainer target (``T2`` -> ``(2, False)``); None for A, B, B'."""
    head, _, tail = target.partition("_")
    if len(head) < 2 or head[0] != "T" or not head[1:].isdigit() or tail not in ("", "control"):
        return None
    return int(head[1:]), tail == "control"

"""Checkpoints A, B and B' (the positive control) as safetensors directories: the one entry
point that resolves a run's checkpoints (``CheckpointSet``)."""

from __future__ import annotations

import json
from pathlib import Path

from harness.checkpoints.control import choose_control_tensor
from harness.checkpoints.derived import damaged, perturbed, with_control, without_tensor
from harness.checkpoints.eagle import eagle_head
from harness.checkpoints.quantize import describe_quantization, quantization_config
from harness.checkpoints.read import check_target, read_headers
from harness.checkpoints.source import resolve_model
from harness.settings import DEFAULT_CACHE
from harness.spec.checkpoint_set import CheckpointSet
from harness.spec.run import ControlSpec, PerturbSpec


def prepare(
    model: str,
    target: str | None,
    perturb: PerturbSpec,
    control: ControlSpec,
    cache: Path = DEFAULT_CACHE,
    sabotage: bool = False,
    damage: float | None = None,
    online_quantization: str | None = None,
    eagle: bool = False,
) -> CheckpointSet:
    """Resolve A (a directory or a hub id), check or make B, and make B' (and B without the
    control tensor, for sabotaged refits; B damaged by ``damage``, for the accuracy probe).
    ``online_quantization``: the engines' ``quantization`` argument, if any (the automatic
    control is then a tensor the quantized kernels read). ``eagle``: each of A, B and B' also gets
    its EAGLE drafter head (``harness.checkpoints.eagle``)."""
    a = resolve_model(model)
    headers = read_headers(a)
    if target:
        b = resolve_model(target)
        check_target(a, b)
    else:
        b = perturbed(a, perturb, cache)
    if control.tensor:
        tensor, reason = control.tensor, "given with --control-tensor"
    else:
        tensor, reason = choose_control_tensor(
            headers, quantized=quantization_config(a) is not None, online_quantization=online_quantization
        )
        control = ControlSpec(tensor=tensor, scale=control.scale)
    b_control = with_control(b, control, cache)
    b_without = str(without_tensor(b, tensor, cache).resolve()) if sabotage else None
    b_damaged = str(damaged(b, damage, cache).resolve()) if damage is not None else None
    a, b, b_control = (str(Path(d).resolve()) for d in (a, b, b_control))
    return CheckpointSet(
        a=a,
        b=b,
        b_control=b_control,
        control_tensor=tensor,
        control_reason=reason,
        b_without_control=b_without,
        b_damaged=b_damaged,
        architecture=(_config(a).get("architectures") or [None])[0],
        tied_embeddings=_tied(_config(a)),
        quantization=describe_quantization(quantization_config(a)),
        drafter_heads=tuple((d, str(eagle_head(d, cache))) for d in (a, b, b_control)) if eagle else (),
    )


def _config(directory: str | Path) -> dict:
    try:
        config = json.loads((Path(directory) / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def _tied(config: dict) -> bool | None:
    tied = config.get("tie_word_embeddings", (config.get("text_config") or {}).get("tie_word_embeddings"))
    return tied if isinstance(tied, bool) else None

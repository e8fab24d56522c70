"""Models named by what builds them, as checkpoint directories (built and cached on first use).

Two spellings name them: a scenario's ``ModelRef.builder`` (``tiny-qwen3``,
``tiny-qwen3:<Architecture>``, ``zoo:<family>``) and a regression corpus entry's model
(``tiny-qwen3``, ``fixture:<Architecture>``, ``zoo:<family>``, ``fp8kv:<model>``). Resolving
them is preparation (the embedded model is written with torch), so it happens here, when a run
is planned, never in the spec that names them.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from harness.spec.scenario import CellGroup


def with_model(group: CellGroup, override: str | None = None) -> CellGroup:
    """``group`` with its model filled in: an override, a builder (embedded tiny Qwen3, a zoo
    family), or the given path (a directory, or a hub id that ``prepare`` fetches)."""
    from harness.checkpoints.tiny import tiny_qwen3

    builder = group.model.builder
    if override:
        path = override
    elif builder == "tiny-qwen3":
        path = str(tiny_qwen3())
    elif builder and builder.startswith("tiny-qwen3:"):
        path = str(tiny_qwen3(architecture=builder.removeprefix("tiny-qwen3:")))
    elif builder and builder.startswith("zoo:"):
        from harness.checkpoints.zoo import tiny_model

        path = str(tiny_model(builder.removeprefix("zoo:")))
    else:
        path = group.model.path or ""
    return replace(group, spec=replace(group.spec, model=path))


def corpus_model(model: str) -> str:
    """A checkpoint directory for a regression corpus entry's model."""
    from harness.checkpoints.tiny import tiny_qwen3

    kind, _, name = model.partition(":")
    if model == "tiny-qwen3":
        return str(tiny_qwen3())
    if kind == "zoo":
        from harness.checkpoints.zoo import tiny_model

        return str(tiny_model(name))
    if kind == "fixture":
        return str(tiny_qwen3(architecture=name))
    if kind == "fp8kv":
        from harness.checkpoints.variants import fp8_kv_scales

        return str(fp8_kv_scales(Path(corpus_model(name))))
    raise ValueError(f"unknown model {model!r}")

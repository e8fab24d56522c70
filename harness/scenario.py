"""Scenarios: a declarative release-gate matrix (models x paths x modes x TP x perturbation).

A scenario factory (registered in ``scenarios/``) returns a ``ScenarioSpec``. ``expand``
turns it into cell groups: one oracle run (``RunSpec``) per model x mode x TP x
perturbation, covering every path of the scenario, so the reference arms are shared by
all paths of a group. Each (group, path) is one cell with a readable id, e.g.
``reload_weights[tiny-qwen3-eager-tp1]``. Pure: no torch, no vLLM.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

from harness.spec import EngineSpec, JudgePolicy, Mode, PerturbSpec, PromptSpec, RunSpec


@dataclass(frozen=True)
class ModelRef:
    """Where a scenario's model comes from."""

    label: str
    """Short name used in cell ids."""
    path: str | None = None
    """A checkpoint directory (or, on machines with hub access, a hub id)."""
    builder: Literal["tiny-qwen3"] | None = None
    """Build the embedded tiny model instead of reading ``path``."""


@dataclass(frozen=True)
class ScenarioSpec:
    """A matrix of oracle runs."""

    name: str
    """Registry name."""
    description: str
    """One line for ``refit-harness list``."""
    models: tuple[ModelRef, ...]
    """Models to test (each is its own checkpoint A)."""
    paths: tuple[str, ...]
    """Reload paths (registered names)."""
    modes: tuple[Mode, ...] = ("eager",)
    """Engine modes."""
    tp_sizes: tuple[int, ...] = (1,)
    """Tensor-parallel sizes."""
    perturbations: tuple[PerturbSpec, ...] = (PerturbSpec(),)
    """How B is made from A (ignored when ``target`` is set)."""
    target: str | None = None
    """A fixed checkpoint B for every model, instead of a perturbation."""
    prompts: PromptSpec = field(default_factory=PromptSpec)
    """Prompts for every cell."""
    judge: JudgePolicy = field(default_factory=JudgePolicy)
    """Tolerances and policies."""
    arm_timeout_s: float = 900.0
    """Per-arm timeout."""
    device: Literal["cpu", "gpu"] = "cpu"
    """Where the scenario is meant to run; its pytest items carry this marker (a path
    that needs CUDA is always ``gpu``)."""
    builds: tuple[str, ...] = ()
    """Names of the vLLM builds it compares, base first and pr last, each given at run time
    as ``--build NAME=PATH``; empty: one run under the harness's own interpreter."""
    expect: Mapping[str, str] = field(default_factory=dict)
    """Expected verdict of every cell per build, e.g. ``{"base": "FAIL", "pr": "PASS"}``;
    a build that misses it fails the run (exit 1)."""


@dataclass(frozen=True)
class CellGroup:
    """One oracle run of a scenario: a model in one mode, TP size and perturbation."""

    id: str
    """e.g. ``tiny-qwen3-eager-tp1`` (with ``-p<seed>`` when several perturbations)."""
    model: ModelRef
    """Checkpoint A."""
    spec: RunSpec
    """The run; ``spec.model`` is filled in when the model is resolved."""

    def cell_ids(self) -> tuple[str, ...]:
        return tuple(f"{p}[{self.id}]" for p in self.spec.paths)


def expand(s: ScenarioSpec, only: tuple[str, ...] = (), skip: tuple[str, ...] = ()) -> tuple[CellGroup, ...]:
    """Every cell group, keeping only cells matching an ``only`` glob (if any) and none of ``skip``."""
    groups = []
    for m in s.models:
        for mode in s.modes:
            for tp in s.tp_sizes:
                for perturb in s.perturbations:
                    gid = f"{m.label}-{mode}-tp{tp}" + (f"-p{perturb.seed}" if len(s.perturbations) > 1 else "")
                    paths = tuple(p for p in s.paths if _keep(f"{p}[{gid}]", only, skip))
                    if not paths:
                        continue
                    spec = RunSpec(model=m.path or "", target=s.target, paths=paths,
                                   engine=EngineSpec(mode=mode, tensor_parallel_size=tp), prompts=s.prompts,
                                   perturb=perturb, judge=s.judge, arm_timeout_s=s.arm_timeout_s)
                    groups.append(CellGroup(id=gid, model=m, spec=spec))
    return tuple(groups)


def _matches(cell: str, pattern: str) -> bool:
    # Cell ids contain brackets; in a pattern they are literal, and only * and ? are wild.
    literal = "".join({"[": "[[]", "]": "[]]"}.get(ch, ch) for ch in pattern)
    return fnmatch.fnmatchcase(cell, literal)


def _keep(cell: str, only: tuple[str, ...], skip: tuple[str, ...]) -> bool:
    if only and not any(_matches(cell, pat) for pat in only):
        return False
    return not any(_matches(cell, pat) for pat in skip)


def resolve_model(group: CellGroup, override: str | None = None) -> CellGroup:
    """Fill in the model directory: an override, the embedded builder, or the given path."""
    if override:
        path = override
    elif group.model.builder == "tiny-qwen3":
        from harness import checkpoints

        path = str(checkpoints.tiny_qwen3())
    else:
        path = _local_model(group.model.path or "")
    return replace(group, spec=replace(group.spec, model=path))


def _local_model(path_or_hub_id: str) -> str:
    """A directory as is; anything else is taken as a hub id and downloaded (GPU hosts
    with hub access; this machine has none)."""
    from pathlib import Path

    if Path(path_or_hub_id).exists() or "/" not in path_or_hub_id or path_or_hub_id.startswith((".", "/")):
        return path_or_hub_id
    from huggingface_hub import snapshot_download

    return snapshot_download(path_or_hub_id, allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt"])

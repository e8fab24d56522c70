"""Scenarios: a declarative release-gate matrix (models x engine configurations x paths x
modes x TP x dtypes x perturbations).

A scenario factory (registered in ``scenarios/``) returns a ``ScenarioSpec``. ``expand``
turns it into cell groups: one oracle run (``RunSpec``) per model x engine configuration x
mode x TP x dtype x perturbation, covering every path of the scenario, so the reference arms
are shared by all paths of a group. Each (group, path) is one cell with a readable id, e.g.
``reload_weights[tiny-qwen3-eager-tp1]``, or ``reload_weights[tiny-qwen3-fp8kv-eager-tp1]``
for an engine configuration labelled ``fp8kv``. Pure: no torch, no vLLM.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from harness.device import Device
from harness.errors import UsageError
from harness.settings import DEFAULT_ARM_TIMEOUT_S
from harness.spec.engine_config import EngineArgs, EngineConfig, merge
from harness.spec.run import (
    ControlSpec,
    DigestChoice,
    EngineSpec,
    JudgePolicy,
    Mode,
    PerturbSpec,
    PromptSpec,
    RunSpec,
)


@dataclass(frozen=True)
class ModelRef:
    """Where a scenario's model comes from."""

    label: str
    """Short name used in cell ids."""
    path: str | None = None
    """A checkpoint directory (or, on machines with hub access, a hub id)."""
    builder: str | None = None
    """Build a model instead of reading ``path``: ``tiny-qwen3`` (the embedded one),
    ``tiny-qwen3:<Architecture>`` (its weights under a planted-bug fixture's class,
    ``harness.spec.architectures``) or ``zoo:<family>`` (a tiny stock architecture,
    ``harness.checkpoints.zoo``), built when a run is planned (``harness.checkpoints.builders``)."""
    engine_args: EngineArgs = ()
    """vLLM engine arguments this model always runs with (a zoo family's fp8 KV cache, an online
    quantization); an engine configuration's arguments go on top of them."""


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
    dtypes: tuple[str, ...] = ("float32",)
    """Model dtypes (``bfloat16``, ``float16``, ``float32``); cell ids name any but float32."""
    tp_sizes: tuple[int, ...] = (1,)
    """Tensor-parallel sizes."""
    perturbations: tuple[PerturbSpec, ...] = (PerturbSpec(),)
    """How B is made from A (ignored when ``target`` is set)."""
    target: str | None = None
    """A fixed checkpoint B for every model, instead of a perturbation."""
    lora: str | None = None
    """A fixed PEFT adapter A for the LoRA paths of every model (None: the harness writes one per model)."""
    lora_target: str | None = None
    """A fixed PEFT adapter B for ``lora_inplace`` (None: adapter A perturbed)."""
    prompts: PromptSpec = field(default_factory=PromptSpec)
    """Prompts for every cell."""
    judge: JudgePolicy = field(default_factory=JudgePolicy)
    """Tolerances and policies."""
    arm_timeout_s: float = DEFAULT_ARM_TIMEOUT_S
    """Per-arm timeout."""
    sabotage: bool = True
    """Run each path's sabotaged twin beside it (a release gate wants every PASS earned)."""
    control: ControlSpec = field(default_factory=ControlSpec)
    """The positive control of every cell (its tensor chosen per model unless named)."""
    engine_core_process: bool = False
    """Run vLLM's engine core in a process of its own in every arm (``EngineSpec``)."""
    digest: DigestChoice = "auto"
    """How every cell's arms digest tensors (``harness.spec.run.DigestChoice``)."""
    engine_configs: tuple[EngineConfig, ...] = (EngineConfig(),)
    """vLLM engine configurations, one cell group each per model (a configuration x path grid);
    the default is vLLM's own defaults under the harness's settings. Labels must be unique."""
    engine: EngineSpec = field(default_factory=EngineSpec)
    """The engine settings of every cell; each cell sets its own mode, TP size and dtype in it
    (and ``engine_core_process`` from above)."""
    cpu_isa: str = "native"
    """The CPU capability level every arm's vLLM is made to see (``EngineSpec.cpu_isa``)."""
    device: Device = "cpu"
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
    """e.g. ``tiny-qwen3-eager-tp1`` (with ``-bf16``/``-fp16`` for those dtypes, and ``-p<seed>``
    when several perturbations)."""
    model: ModelRef
    """Checkpoint A."""
    spec: RunSpec
    """The run; ``spec.model`` is filled in when the model is resolved."""

    def cell_ids(self) -> tuple[str, ...]:
        return tuple(f"{p}[{self.id}]" for p in self.spec.paths)


def expand(s: ScenarioSpec, only: tuple[str, ...] = (), skip: tuple[str, ...] = ()) -> tuple[CellGroup, ...]:
    """Every cell group, keeping only cells matching an ``only`` glob (if any) and none of ``skip``."""
    labels = [c.label for c in s.engine_configs]
    if len(set(labels)) != len(labels):
        raise UsageError(f"scenario {s.name!r}: engine configuration labels must be unique, got {labels}")
    groups = []
    for m, config in ((m, c) for m in s.models for c in s.engine_configs if c.applies_to(m.label)):
        for mode in s.modes:
            for tp in s.tp_sizes:
                for dtype in s.dtypes:
                    for perturb in s.perturbations:
                        gid = (
                            f"{m.label}"
                            + (f"-{config.label}" if config.label else "")
                            + f"-{mode}-tp{tp}"
                            + _DTYPE_TAG.get(dtype, f"-{dtype}")
                            + (f"-p{perturb.seed}" if len(s.perturbations) > 1 else "")
                        )
                        paths = tuple(
                            p
                            for p in s.paths
                            if (not config.paths or p in config.paths) and _keep(f"{p}[{gid}]", only, skip)
                        )
                        if not paths:
                            continue
                        spec = RunSpec(
                            model=m.path or "",
                            target=s.target,
                            paths=paths,
                            engine=replace(
                                s.engine,
                                mode=mode,
                                tensor_parallel_size=tp,
                                dtype=dtype,
                                engine_core_process=s.engine_core_process,
                                engine_args=merge(m.engine_args, config.args),
                                cpu_isa=s.cpu_isa,
                                reload_mode=config.reload_mode,
                                draft_tokens=config.draft_tokens,
                                drafter=config.drafter,
                            ),
                            control=s.control,
                            prompts=s.prompts,
                            perturb=perturb,
                            judge=s.judge,
                            arm_timeout_s=s.arm_timeout_s,
                            sabotage=s.sabotage,
                            digest=s.digest,
                            expected_census=config.expect_census,
                            requires_device=config.devices,
                            requires_reason=config.skip_reason,
                            requires_packages=config.packages,
                            lora=s.lora,
                            lora_target=s.lora_target,
                        )
                        groups.append(CellGroup(id=gid, model=m, spec=spec))
    return tuple(groups)


_DTYPE_TAG = {"float32": "", "bfloat16": "-bf16", "float16": "-fp16"}


def _matches(cell: str, pattern: str) -> bool:
    # Cell ids contain brackets; in a pattern they are literal, and only * and ? are wild.
    literal = "".join({"[": "[[]", "]": "[]]"}.get(ch, ch) for ch in pattern)
    return fnmatch.fnmatchcase(cell, literal)


def _keep(cell: str, only: tuple[str, ...], skip: tuple[str, ...]) -> bool:
    if only and not any(_matches(cell, pat) for pat in only):
        return False
    return not any(_matches(cell, pat) for pat in skip)

"""Spec -> plan: which engine arms to run, in which order, doing what. Pure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from harness.checkpoints import CheckpointSet
from harness.records import ArmRole
from harness.spec import EngineSpec, PromptSpec, RunSpec

CheckpointKey = Literal["A", "B", "B_control"]


@dataclass(frozen=True)
class Step:
    """One thing an arm does after its cold start."""

    action: Literal["observe", "refit"]
    """``observe``: census + greedy outputs; ``refit``: update weights through the arm's path."""
    argument: str
    """For ``observe``, the observation label; for ``refit``, the checkpoint key (A, B, B_control)."""


@dataclass(frozen=True)
class ArmPlan:
    """One engine lifetime, run in isolation with a timeout."""

    name: str
    """Unique arm name (also its file name under ``arms/``)."""
    role: ArmRole
    """reference, noise or subject."""
    path: str | None
    """Reload path used by ``refit`` steps (subjects only)."""
    start: CheckpointKey
    """Checkpoint the engine cold-starts on."""
    steps: tuple[Step, ...]
    """What to do after the cold start, in order."""
    engine: EngineSpec
    """Engine settings."""
    prompts: PromptSpec
    """Prompts for every observation."""
    checkpoints: CheckpointSet
    """Where A, B and B' live."""
    timeout_s: float
    """Kill the arm after this long."""


@dataclass(frozen=True)
class SkippedPath:
    """A requested path that cannot run here, with the reason."""

    path: str
    """Path name."""
    reason: str
    """Why it cannot run (shown in the report)."""


@dataclass(frozen=True)
class Plan:
    """All arms of a run, plus the paths planned out."""

    arms: tuple[ArmPlan, ...]
    """Reference and noise arms first, then one subject arm per runnable path."""
    skipped: tuple[SkippedPath, ...]
    """Paths that will be reported SKIPPED."""


SUBJECT_STEPS: tuple[Step, ...] = (
    Step("observe", "cold_A"),
    Step("refit", "B"), Step("observe", "warm_B"),
    Step("refit", "B"), Step("observe", "warm_B_again"),      # idempotency
    Step("refit", "A"), Step("observe", "warm_A"),            # round trip
    Step("refit", "B_control"), Step("observe", "warm_B_control"),  # positive control
)


def make_plan(spec: RunSpec, checkpoints: CheckpointSet, unavailable: dict[str, str]) -> Plan:
    """``unavailable`` maps path name -> reason it cannot run on this machine."""
    common = dict(engine=spec.engine, prompts=spec.prompts, checkpoints=checkpoints, timeout_s=spec.arm_timeout_s)
    runnable = [p for p in spec.paths if p not in unavailable]
    skipped = tuple(SkippedPath(p, unavailable[p]) for p in spec.paths if p in unavailable)
    if not runnable:
        return Plan(arms=(), skipped=skipped)
    cold_b = (Step("observe", "cold_B"),)
    arms = [
        ArmPlan(name="reference", role="reference", path=None, start="B", steps=cold_b, **common),
        ArmPlan(name="noise", role="noise", path=None, start="B", steps=cold_b, **common),
    ]
    arms += [ArmPlan(name=f"subject-{p}", role="subject", path=p, start="A", steps=SUBJECT_STEPS, **common)
             for p in runnable]
    return Plan(arms=tuple(arms), skipped=skipped)

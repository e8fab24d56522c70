"""Spec -> plan: which engine arms to run, in which order, doing what. Pure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from harness.builds import BuildSpec
from harness.checkpoints import CheckpointSet
from harness.paths.base import EngineRequirements, RefitTarget
from harness.records import ArmRole
from harness.spec import EngineSpec, PromptSpec, RunSpec, ThroughputSpec

OBSERVATION_OF = {"B": "warm_B", "B_control": "warm_B_control", "A": "warm_A"}


@dataclass(frozen=True)
class Step:
    """One thing an arm does after its cold start."""

    action: Literal["observe", "refit", "measure"]
    """``observe``: census + greedy outputs; ``refit``: update weights through ``path``;
    ``measure``: the throughput probe."""
    argument: str
    """For ``observe`` and ``measure``, the label; for ``refit``, the checkpoint key (A, B, B_control)."""
    path: str | None = None
    """Reload path of a ``refit`` step."""


@dataclass(frozen=True)
class ArmPlan:
    """One engine lifetime, run in isolation with a timeout."""

    name: str
    """Unique arm name (also its file name under ``arms/``)."""
    role: ArmRole
    """reference, noise or subject."""
    paths: tuple[str, ...]
    """Reload paths this subject engine exercises, one segment each, in order."""
    start: RefitTarget
    """Checkpoint the engine cold-starts on."""
    steps: tuple[Step, ...]
    """What to do after the cold start, in order."""
    engine: EngineSpec
    """Engine settings."""
    requirements: EngineRequirements
    """How the engine is built (shared by every path of the arm)."""
    prompts: PromptSpec
    """Prompts for every observation."""
    checkpoints: CheckpointSet
    """Where A, B and B' live."""
    timeout_s: float
    """Kill the arm after this long."""
    build: BuildSpec | None = None
    """Interpreter (vLLM build) the arm runs under; None: the harness's own."""
    throughput: ThroughputSpec | None = None
    """Settings of the arm's ``measure`` steps, if any."""

    @property
    def cold_label(self) -> str:
        return "cold_dummy" if self.requirements.load_format == "dummy" else f"cold_{self.start}"


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
    """Reference and noise arms first, then one subject arm per group of paths."""
    skipped: tuple[SkippedPath, ...]
    """Paths that will be reported SKIPPED."""

    def subject_of(self, path: str) -> ArmPlan | None:
        return next((a for a in self.arms if path in a.paths), None)


def segment(path: str, targets: tuple[RefitTarget, ...]) -> tuple[Step, ...]:
    """Refit/observe steps of one path; a second refit to B is observed as ``warm_B_again``."""
    steps: list[Step] = []
    seen: set[str] = set()
    for target in targets:
        label = OBSERVATION_OF[target]
        if label in seen:
            label += "_again"
        seen.add(label)
        steps += [Step("refit", target, path), Step("observe", f"{path}/{label}")]
    return tuple(steps)


def make_plan(spec: RunSpec, checkpoints: CheckpointSet, paths: dict[str, tuple[EngineRequirements, tuple[RefitTarget, ...]]],
              unavailable: dict[str, str]) -> Plan:
    """``paths`` maps each requested path to its engine requirements and refit targets;
    ``unavailable`` maps a path to the reason it cannot run on this machine."""
    common = dict(engine=spec.engine, prompts=spec.prompts, checkpoints=checkpoints, timeout_s=spec.arm_timeout_s,
                  build=spec.build, throughput=spec.throughput)
    runnable = [p for p in spec.paths if p not in unavailable]
    skipped = tuple(SkippedPath(p, unavailable[p]) for p in spec.paths if p in unavailable)
    if not runnable:
        return Plan(arms=(), skipped=skipped)
    cold_b = (Step("observe", "cold_B"),)
    if spec.throughput:
        cold_b += (Step("measure", "cold_B/throughput"),)
    plain = EngineRequirements()
    arms = [ArmPlan(name="reference", role="reference", paths=(), start="B", steps=cold_b, requirements=plain, **common),
            ArmPlan(name="noise", role="noise", paths=(), start="B", steps=cold_b, requirements=plain, **common)]
    groups: dict[EngineRequirements, list[str]] = {}
    for p in runnable:
        groups.setdefault(paths[p][0], []).append(p)
    for requirements, members in groups.items():
        probe = ArmPlan(name="", role="subject", paths=(), start="A", steps=(), requirements=requirements, **common)
        steps = (Step("observe", probe.cold_label),) + tuple(s for p in members for s in segment(p, paths[p][1]))
        if spec.throughput:  # right after the first path's refit to B: the refit engine's speed
            at = steps.index(Step("observe", f"{members[0]}/warm_B")) + 1 if Step(
                "observe", f"{members[0]}/warm_B") in steps else len(steps)
            steps = steps[:at] + (Step("measure", f"{members[0]}/throughput"),) + steps[at:]
        arms.append(ArmPlan(name="subject-" + "+".join(members), role="subject", paths=tuple(members), start="A",
                            steps=steps, requirements=requirements, **common))
    return Plan(arms=tuple(arms), skipped=skipped)

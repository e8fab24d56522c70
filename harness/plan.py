"""Spec -> plan: which engine arms to run, in which order, doing what. Pure."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from harness.records import ArmRole, ObservationLabel, ProbeLabel
from harness.spec.build import BuildSpec
from harness.spec.checkpoint_set import CheckpointSet, trainer_target
from harness.spec.requirements import EngineRequirements, RefitTarget
from harness.spec.run import AccuracyPrompts, DigestChoice, EngineSpec, PromptSpec, RunSpec, ThroughputSpec, TrainerSpec

OBSERVATION_OF = {"B": "warm_B", "B_control": "warm_B_control", "A": "warm_A"}
SABOTAGE = "~sabotage"
"""Suffix of a path's sabotaged twin: its observations are labelled ``<path>~sabotage/...``."""


def sabotaged_twin(path: str) -> str:
    return path + SABOTAGE


@dataclass(frozen=True)
class PathNeeds:
    """What the planner needs to know of a path class."""

    requirements: EngineRequirements
    """How its subject engine is built (equal requirements share an engine)."""
    refit_targets: tuple[RefitTarget, ...]
    """Its segment's refits, in order."""
    sabotage_targets: tuple[RefitTarget, ...] = ("B", "A")
    """Its sabotaged twin's refits: the first is sabotaged, the rest are real refits that
    leave the engine as the next segment expects (none in the arm's last twin)."""
    trains: bool = False
    """A live trainer makes its targets: its refits are the trainer's optimizer steps
    (``trainer_targets``), each judged against a cold start on that step's weights."""
    runs_last: bool = False
    """vLLM may raise midway through its refit: in a shared engine its segment and its twin
    come after every other path's (``ReloadPath.runs_last``)."""

    @classmethod
    def of(cls, path_class) -> PathNeeds:
        """What a reload path class declares (``harness.paths.base.ReloadPath`` attributes)."""
        return cls(
            path_class.requirements,
            path_class.refit_targets,
            path_class.sabotage_targets,
            trains=getattr(path_class, "trains", False),
            runs_last=getattr(path_class, "runs_last", False),
        )


def trainer_targets(steps: int, sabotage: bool = False) -> tuple[RefitTarget, ...]:
    """A trainer path's refits: each optimizer step ``T1``..``TK``; the last step sent again
    (idempotency) and with the control tensor scaled (positive control); back to A (round trip).
    Its sabotaged twin (``sabotage``): one more step, ``T<K+1>``, sent without one parameter, then A."""
    if sabotage:
        return (trainer_target(steps + 1), "A")
    last = trainer_target(steps)
    return tuple(trainer_target(k) for k in range(1, steps + 1)) + (last, trainer_target(steps, control=True), "A")


def trainer_reference_name(step: int) -> str:
    """The arm that cold-starts on the trainer's step ``step``: the reference of that step."""
    return f"reference-{trainer_target(step)}"


def observation_stage(target: RefitTarget) -> str:
    """The stage observed after a refit to ``target`` (``warm_B``, ``warm_T2``...)."""
    return OBSERVATION_OF.get(target) or f"warm_{target}"


@dataclass(frozen=True)
class Observe:
    """Census, one recorded forward and greedy outputs."""

    label: ObservationLabel
    """Where in the arm's life."""


@dataclass(frozen=True)
class Refit:
    """Update the weights through a reload path."""

    target: RefitTarget
    """Checkpoint to refit to."""
    path: str
    """Reload path that does it."""
    sabotaged: bool = False
    """Refit through the path's sabotaged twin: the one step the path exists for is
    skipped or broken, so the check that follows must fail."""
    segment: str = ""
    """The segment this refit belongs to (``path`` or its sabotaged twin): a twin's later
    refits are real, yet a failure there is the twin's, not the path's. Empty in plans
    written before it existed."""

    @property
    def owner(self) -> str:
        """The segment a failure of this refit is charged to."""
        return self.segment or (sabotaged_twin(self.path) if self.sabotaged else self.path)


@dataclass(frozen=True)
class Probe:
    """The throughput probe (timed generation) or the accuracy probe (completions)."""

    label: ProbeLabel
    """Which probe, and the point it follows."""


Step = Observe | Refit | Probe
"""One thing an arm does after its cold start."""


@dataclass(frozen=True)
class ArmPlan:
    """One engine lifetime, run in isolation with a timeout."""

    name: str
    """Unique arm name (also its file name under ``arms/``)."""
    role: ArmRole
    """reference, noise or subject."""
    paths: tuple[str, ...]
    """Reload paths this subject engine exercises, one segment each, in order."""
    start: RefitTarget | Literal["B_damaged"]
    """Checkpoint the engine cold-starts on (``B_damaged``: the accuracy probe's damaged copy of B)."""
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
    accuracy: AccuracyPrompts | None = None
    """Prompts of the arm's ``accuracy`` steps, if any."""
    digest: DigestChoice = "auto"
    """How the arm digests tensors; the algorithm it resolved to is in its result's environment."""
    adapters: CheckpointSet | None = None
    """The run's LoRA adapters A, B and B' (a LoRA engine serves one of them); None without LoRA."""

    @property
    def refit_checkpoints(self) -> CheckpointSet:
        """What this arm's A, B and B' are: the adapters for a LoRA ``adapter`` engine, else the
        base weights."""
        if self.requirements.lora == "adapter":
            assert self.adapters is not None, "a LoRA adapter arm without adapters"
            return self.adapters
        return self.checkpoints

    trainer: TrainerSpec | None = None
    """The live trainer of the arm's trainer paths (``PathNeeds.trains``); None without one."""

    @property
    def cold_label(self) -> ObservationLabel:
        return ObservationLabel("cold_dummy" if self.requirements.load_format == "dummy" else f"cold_{self.start}")


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
    reused: tuple[str, ...] = ()
    """Arms not run because their results come from the reference cache (``harness.orchestrate.reference``)."""

    def subject_of(self, path: str) -> ArmPlan | None:
        return next((a for a in self.arms if path in a.paths), None)


def segment(path: str, targets: tuple[RefitTarget, ...], sabotaged: bool = False) -> tuple[Step, ...]:
    """Refit/observe steps of one path; a second refit to B is observed as ``warm_B_again``.
    ``sabotaged``: the segment of the path's sabotaged twin, whose first refit is sabotaged."""
    steps: list[Step] = []
    seen: set[str] = set()
    owner = sabotaged_twin(path) if sabotaged else path
    for i, target in enumerate(targets):
        stage = observation_stage(target)
        if stage in seen:
            stage += "_again"
        seen.add(stage)
        steps += [
            Refit(target, path, sabotaged=sabotaged and i == 0, segment=owner),
            Observe(ObservationLabel(stage, owner)),
        ]
    return tuple(steps)


def lora_reference_name(role: str) -> str:
    """The cold-B LoRA arm of a LoRA role (``adapter``: base A serving adapter B; ``base``: base
    B serving adapter A)."""
    return f"reference-lora-{role}"


def lora_noise_name(role: str) -> str:
    """The second cold-B LoRA arm of a role: the noise floor of LoRA engines."""
    return f"noise-lora-{role}"


def mode_reference_name(mode: str) -> str:
    """The cold-B arm in engine mode ``mode``, for subjects whose mode is not the run's."""
    return f"reference-{mode}"


BatchShape = tuple[str, ...]
"""How an engine batches and schedules the observed prompts, as tags (``batch_shape``)."""


def batch_shape(requirements: EngineRequirements, engine: EngineSpec) -> BatchShape:
    """What decides the batch composition and scheduling of an engine's observed generation:
    ``http`` (``vllm serve``, sent one request at a time: prefills of one prompt, decode steps of
    one sequence), ``prefix-cache`` (the prompts' shared prefix served from the cache: prefills of
    the suffix only). Empty: ``LLM.generate`` of every prompt at once, every token prefilled. On a
    GPU, bf16 GEMM and attention kernels pick tiles and reduction orders by these shapes."""
    prefix = requirements.enable_prefix_caching
    cached = engine.setting("enable_prefix_caching") if prefix is None else prefix
    return (("http",) if requirements.kind == "http" else ()) + (("prefix-cache",) if cached else ())


def shape_reference_requirements(requirements: EngineRequirements, engine: EngineSpec) -> EngineRequirements:
    """A cold B built to observe in the same batch shapes (and LoRA role and mode) as a subject
    of ``requirements``, and nothing else of the subject's engine."""
    shape = batch_shape(requirements, engine)
    return EngineRequirements(
        kind="http" if "http" in shape else "llm",
        enable_prefix_caching="prefix-cache" in shape,
        mode=requirements.mode,
        lora=requirements.lora,
    )


def shape_reference_name(requirements: EngineRequirements, engine: EngineSpec) -> str:
    """The name of ``shape_reference_requirements``' arm: ``reference-http``,
    ``reference-lora-adapter-prefix-cache``..."""
    r = shape_reference_requirements(requirements, engine)
    tags = ((f"lora-{r.lora}",) if r.lora else ()) + ((r.mode,) if r.mode else ()) + batch_shape(r, engine)
    return "reference-" + "-".join(tags)


def base_reference_requirements(requirements: EngineRequirements) -> EngineRequirements:
    """The requirements of the reference a subject's noise floor comes from: plain, or a cold
    LoRA engine of its role."""
    return EngineRequirements(lora=requirements.lora)


def make_plan(
    spec: RunSpec,
    checkpoints: CheckpointSet,
    paths: dict[str, PathNeeds],
    unavailable: dict[str, str],
    adapters: CheckpointSet | None = None,
) -> Plan:
    """``paths`` maps each requested path to what the planner needs of it; ``unavailable``
    maps a path to the reason it cannot run on this machine. With ``spec.sabotage`` each
    subject engine runs its paths' sabotaged twins after all the real segments, so a
    sabotage can never leak into a real path's verdict; a path that may raise midway
    (``runs_last``) runs, with its twin, after both."""
    accuracy = AccuracyPrompts(spec.accuracy.prompts, spec.accuracy.max_tokens) if spec.accuracy else None

    def arm_plan(
        name: str,
        role: ArmRole,
        paths: tuple[str, ...],
        start: RefitTarget | Literal["B_damaged"],
        steps: tuple[Step, ...],
        requirements: EngineRequirements,
    ) -> ArmPlan:
        return ArmPlan(
            name=name,
            role=role,
            paths=paths,
            start=start,
            steps=steps,
            requirements=requirements,
            engine=spec.engine,
            prompts=spec.prompts,
            checkpoints=checkpoints,
            timeout_s=spec.arm_timeout_s,
            build=spec.build,
            throughput=spec.throughput,
            accuracy=accuracy,
            digest=spec.digest,
            adapters=adapters,
        )

    runnable = [p for p in spec.paths if p not in unavailable]
    skipped = tuple(SkippedPath(p, unavailable[p]) for p in spec.paths if p in unavailable)
    if not runnable:
        return Plan(arms=(), skipped=skipped)
    cold = ObservationLabel("cold_B")
    cold_b: tuple[Step, ...] = (Observe(cold),)
    if spec.throughput:
        cold_b += (Probe(ProbeLabel("throughput", cold)),)
    if accuracy:
        cold_b += (Probe(ProbeLabel("accuracy", cold)),)
    plain = EngineRequirements()
    # Equal requirements share an engine, except an isolated path's: it gets one of its own.
    by_engine: dict[tuple[EngineRequirements, str], list[str]] = {}
    for p in runnable:
        r = paths[p].requirements
        by_engine.setdefault((r, p if r.isolated else ""), []).append(p)
    groups = [r for r, _ in by_engine]
    arms: list[ArmPlan] = []
    if any(r.lora is None for r in groups) or accuracy:
        arms += [
            arm_plan(name="reference", role="reference", paths=(), start="B", steps=cold_b, requirements=plain),
            arm_plan(name="noise", role="noise", paths=(), start="B", steps=cold_b, requirements=plain),
        ]
    # A LoRA subject is judged against cold LoRA engines of its own kind (their census holds the
    # LoRA layers' stacked adapter buffers, and the served adapter decides the outputs).
    for role in sorted({r.lora for r in groups if r.lora}):
        own = EngineRequirements(lora=role)
        arms += [
            arm_plan(
                name=lora_reference_name(role),
                role="lora_reference",
                paths=(),
                start="B",
                steps=(Observe(cold),),
                requirements=own,
            ),
            arm_plan(
                name=lora_noise_name(role),
                role="lora_noise",
                paths=(),
                start="B",
                steps=(Observe(cold),),
                requirements=own,
            ),
        ]

    def targets(p: str, sabotage: bool = False) -> tuple[RefitTarget, ...]:
        if paths[p].trains:
            return trainer_targets(spec.trainer.steps, sabotage)
        return paths[p].sabotage_targets if sabotage else paths[p].refit_targets

    def real(members: list[str]) -> tuple[Step, ...]:
        return tuple(s for p in members for s in segment(p, targets(p)))

    def twins(members: list[str], ends_arm: bool) -> tuple[Step, ...]:
        if not spec.sabotage:
            return ()
        twin = [segment(p, targets(p, sabotage=True), sabotaged=True) for p in members]
        if ends_arm and twin:
            # A twin's refits after its sabotaged one only leave the engine as the next segment
            # expects; the arm's last twin has no next segment.
            twin[-1] = twin[-1][:2]
        return tuple(s for steps in twin for s in steps)

    for (requirements, _), group in by_engine.items():
        # Twins after every real segment (a sabotage never leaks into a real verdict); a path
        # that may raise midway, with its twin, after all of those (``PathNeeds.runs_last``).
        first = [p for p in group if not paths[p].runs_last]
        raising = [p for p in group if paths[p].runs_last]
        members = first + raising
        probe = arm_plan(name="", role="subject", paths=(), start="A", steps=(), requirements=requirements)
        steps = (
            (Observe(probe.cold_label),)
            + real(first)
            + twins(first, ends_arm=not raising)
            + real(raising)
            + twins(raising, ends_arm=True)
        )
        # Right after the first path's refit to B: the refit engine's speed and accuracy.
        warm_b = ObservationLabel("warm_B", members[0])
        at = steps.index(Observe(warm_b)) + 1 if Observe(warm_b) in steps else len(steps)
        probes = ((Probe(ProbeLabel("throughput", warm_b)),) if spec.throughput else ()) + (
            (Probe(ProbeLabel("accuracy", warm_b)),) if accuracy else ()
        )
        steps = steps[:at] + probes + steps[at:]
        subject = arm_plan(
            name="subject-" + "+".join(members),
            role="subject",
            paths=tuple(members),
            start="A",
            steps=steps,
            requirements=requirements,
        )
        arms.append(replace(subject, trainer=spec.trainer) if any(paths[p].trains for p in members) else subject)
    # A subject in another engine mode than the run's (the compiled path in an eager run) is
    # compared with a cold B in its own mode: compiled and eager kernels round differently
    # (bf16, measured: logprobs 0.004 apart and tokens diverging, with every tensor equal).
    for mode in sorted({r.mode for r in groups if r.mode and r.mode != spec.engine.mode}):
        arms.insert(
            2,
            arm_plan(
                name=mode_reference_name(mode),
                role="mode_reference",
                paths=(),
                start="B",
                steps=(Observe(cold),),
                requirements=EngineRequirements(mode=mode),
            ),
        )
    # A subject that batches or schedules the observed prompts otherwise than its reference (vllm
    # serve's one request at a time; the prefix cache's suffix-only prefills) is compared with a
    # cold B observed in its own shapes: on a GPU, bf16 kernels round by batch shape, and the
    # noise floor (two cold starts of one shape) cannot show it.
    shaped: dict[str, EngineRequirements] = {}
    for r in groups:
        if batch_shape(r, spec.engine) != batch_shape(base_reference_requirements(r), spec.engine):
            shaped.setdefault(shape_reference_name(r, spec.engine), shape_reference_requirements(r, spec.engine))
    for name, requirements in sorted(shaped.items(), reverse=True):
        arms.insert(
            2,
            arm_plan(
                name=name,
                role="shape_reference",
                paths=(),
                start="B",
                steps=(Observe(cold),),
                requirements=requirements,
            ),
        )
    # One cold start per trainer step, shared by every trainer path: their trainers start from
    # A and compute the same steps (the arms check it against the prepared steps).
    if any(paths[p].trains for p in runnable):
        last = spec.trainer.steps + (1 if spec.sabotage else 0)
        for k in range(1, last + 1):
            arms.insert(
                2,
                arm_plan(
                    name=trainer_reference_name(k),
                    role="trainer_reference",
                    paths=(),
                    start=trainer_target(k),
                    steps=(Observe(ObservationLabel(f"cold_{trainer_target(k)}")),),
                    requirements=plain,
                ),
            )
    if accuracy:  # the eval's discriminating power: does a damaged B score lower than B?
        arms.append(
            arm_plan(
                name="damaged",
                role="damaged",
                paths=(),
                start="B_damaged",
                steps=(Probe(ProbeLabel("accuracy", ObservationLabel("cold_B_damaged"))),),
                requirements=plain,
            )
        )
    return Plan(arms=tuple(arms), skipped=skipped)


@dataclass(frozen=True)
class PreflightArm:
    """One arm the preflight checks without starting it."""

    plan: ArmPlan
    """The arm, as the planner makes it for the cell (on a stand-in checkpoint)."""
    gpus: float
    """GPUs the arm's Ray actor asks for (``harness.orchestrate.fanout.arm_resources``)."""


@dataclass(frozen=True)
class PreflightCell:
    """One cell group of a scenario, planned for a machine with ``gpus`` GPUs."""

    id: str
    """The group id (``Qwen3-0.6B-eager-tp2-bf16``)."""
    gpus: int
    """GPUs of the machine it is planned for."""
    arms: tuple[PreflightArm, ...]
    """Its arms."""
    skipped: tuple[SkippedPath, ...]
    """Its paths that would be SKIPPED there, with the reason."""
    packages: tuple[tuple[str, str], ...] = ()
    """The modules its engine configuration imports (``RunSpec.requires_packages``): the engine
    side looks for them in its own interpreter, and a missing one SKIPs the cell."""


@dataclass(frozen=True)
class PreflightRequest:
    """What the preflight's arm-side process checks (``python -m harness.arm.preflight``)."""

    scenario: str
    """The scenario's name."""
    cells: tuple[PreflightCell, ...]
    """Every cell group, once per simulated GPU count."""
    cuda_capability: tuple[int, int] = (9, 0)
    """Compute capability the attention backend is checked for (the nightly runner's GPU)."""
    placement_timeout_s: float = 30.0
    """How long a round of stand-ins may go without one more of them placed before those not
    placed count as unplaceable. Each stand-in is a Ray worker process to start: on a loaded
    2-core machine (two pytest workers) three of them took over 5 s, and a placeable trainer
    rank was reported unplaceable (CI of stop 27)."""


@dataclass(frozen=True)
class PreflightFinding:
    """One line of the preflight's answer."""

    kind: Literal["problem", "skip", "ok"]
    """``problem``: the cell would crash or hang; ``skip``: it would be SKIPPED with a reason;
    ``ok``: a check that passed, with what it checked."""
    cell: str
    """The cell (``path[group]``), group or arm it concerns."""
    check: str
    """Which check: ``engine-args``, ``kv-cache``, ``attention``, ``trainer``, ``packages``, ``placement``."""
    detail: str
    """What was found, in one line."""

    def line(self) -> str:
        return f"{self.kind.upper()} {self.check}: {self.cell}: {self.detail}"

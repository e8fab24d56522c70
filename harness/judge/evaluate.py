"""Judge a run from its directory alone: every path's comparison, verdict and sabotage
outcome, from the records on disk (``refit-harness report DIR`` re-judges without vLLM)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from harness import store
from harness.errors import SchemaError
from harness.judge.diff import PathComparison, compare_path, one_digest
from harness.judge.evaluation import Evaluation, RunRecord
from harness.judge.verdict import (
    Verdict,
    VerdictStatus,
    judge,
    judge_sabotage,
    rebound_fails,
    skipped,
    with_expected_census,
    with_sabotage,
    without_twin,
)
from harness.plan import (
    ArmPlan,
    Observe,
    Refit,
    batch_shape,
    lora_noise_name,
    lora_reference_name,
    mode_reference_name,
    sabotaged_twin,
    shape_reference_name,
    trainer_reference_name,
)
from harness.records import ArmResult, ObservationLabel
from harness.run_dir import RunDir
from harness.spec.checkpoint_set import adapted_weight, trainer_target
from harness.spec.known_issues import MOE_KERNEL, Refusal, Subject, quantization_of
from harness.spec.path_declaration import PathLookup
from harness.spec.run import JudgePolicy


def evaluate(out: Path, path_for: PathLookup) -> Evaluation:
    """Judge a run from its directory alone; ``path_for`` gives what each path declares
    (``harness.paths.PATHS.get``, passed in by the caller: the judge does not import the paths)."""
    record = store.load(RunRecord, RunDir(out).record, "run_record")
    results: dict[str, ArmResult] = {}
    for arm in record.plan.arms:
        result_file = RunDir(out).arm(arm).result
        if result_file.exists():
            try:
                results[arm.name] = store.load(ArmResult, result_file, "arm_result")
            except SchemaError as exc:  # one damaged arm must not hide the others
                results[arm.name] = ArmResult(
                    arm=arm.name,
                    role=arm.role,
                    paths=arm.paths,
                    status="error",
                    error=f"its record cannot be read: {exc}",
                    observations=(),
                    seconds=0.0,
                )
    one_digest(results.values(), str(out))
    reference, noise = results.get("reference"), results.get("noise")
    comparisons, verdicts = [], []
    skipped_paths = {s.path: s.reason for s in record.plan.skipped}
    ref_arm = next((a for a in record.plan.arms if a.role == "reference"), None)
    for path in record.spec.paths:
        if path in skipped_paths:
            verdicts.append(skipped(path, skipped_paths[path]))
            continue
        arm_or_none = record.plan.subject_of(path)
        subject = results.get(arm_or_none.name) if arm_or_none else None
        if arm_or_none is None or subject is None:
            verdicts.append(Verdict(path, VerdictStatus.ERROR, ("subject arm never ran",)))
            continue
        # A LoRA subject has cold LoRA engines of its own kind for reference and noise.
        own_ref, own_noise, own_ref_arm = reference, noise, ref_arm
        if arm_or_none.requirements.lora:
            role = arm_or_none.requirements.lora
            own_ref, own_noise = results.get(lora_reference_name(role)), results.get(lora_noise_name(role))
            own_ref_arm = next((a for a in record.plan.arms if a.name == lora_reference_name(role)), None)
        refusal = next((a.refused for a in (subject, own_ref) if a is not None and a.refused), None)
        if refusal:  # nothing to refit: vLLM will not run this engine here
            verdicts.append(skipped(path, f"vLLM cannot start this engine here: {refusal}"))
            continue
        arm = arm_or_none
        cls = path_for(path)
        # The control is localized under the model's own name for it (vLLM may rename it on load).
        renamed = dict(next((o.model.weight_names for o in subject.observations), ()))
        planted = arm.refit_checkpoints.control_tensor
        # An adapter tensor is localized under the base weight it adapts (its LoRA layer's buffers).
        planted = adapted_weight(planted) if arm.requirements.lora == "adapter" else planted
        control = renamed.get(planted, planted)
        env = dict(subject.environment)
        device = env.get("device", "cpu")
        # A cold start that raised observed nothing: the checkpoint says which model it is.
        architecture = (
            next((o.model.architecture for o in subject.observations), None) or record.checkpoints.architecture
        )
        # What the known issues' scopes match: the same for the path's every verdict.
        facts = Subject(
            device,
            env.get("vllm"),
            architecture,
            record.spec.engine.dtype,
            cpu_flags_of(subject, record),
            (
                *next((o.model.quant_kernels for o in subject.observations), ()),
                *(f"{MOE_KERNEL}{k.path}" for k in subject.kernel_paths if k.kind == "moe"),
            ),
            quantization_of(record.checkpoints.quantization, record.spec.engine.vllm_kwargs()),
            record.checkpoints.tied_embeddings,
            record.spec.engine.reload_mode,
            any(o.encoder_cache is not None for o in subject.observations),
        )
        # The path's own engine mode decides whether a moved address matters (a compiled
        # path in an eager run captures graphs all the same).
        mode = arm.requirements.mode or arm.engine.mode
        same_mode = own_ref_arm is not None and mode == (own_ref_arm.requirements.mode or own_ref_arm.engine.mode)
        fail_on_rebound = rebound_fails(record.spec.judge, mode, device)
        graphs = mode == "compiled" and not device.startswith("cpu")  # captured CUDA graphs replay addresses

        # Segments in the order the engine ran them, as planned (twins after the real segments,
        # a path that may raise after both: ``plan.make_plan``).
        order = segment_order(arm)

        # Plans made before mode references existed have none: the run's reference then serves.
        own_mode = None if same_mode else results.get(mode_reference_name(mode))
        # The refit is compared with a cold B observed in the subject's own batch shapes.
        shaped = shape_reference(arm, own_ref_arm, record.plan.arms, results)
        if isinstance(shaped, Verdict):
            # A subject that itself died says why first: its reference was cancelled after it.
            own = (subject.error,) if subject.error and not subject.observations else ()
            verdicts.append(replace(shaped, path=path, reasons=(*own, *shaped.reasons)))
            continue

        def compared(
            owner: str,
            subject=subject,
            order=order,
            control=control,
            arm=arm,
            same_mode=same_mode,
            own_mode=shaped or own_mode,
            own_ref=own_ref,
            own_noise=own_noise,
        ):
            return compare_path(
                owner,
                charged_to_segment(subject, owner, order),
                own_ref,
                own_noise,
                control,
                record.spec.judge.logprob_atol,
                _labels(arm, owner),
                same_mode=same_mode,
                same_engine=not arm.requirements.restarts,
                refit_reference=own_mode,
            )

        if cls.trains:
            known = cls.known_issues_for(facts)
            found = trainer_step_verdicts(
                path,
                charged_to_segment(subject, path, order),
                charged_to_segment(subject, sabotaged_twin(path), order) if record.spec.sabotage else None,
                results,
                reference,
                noise,
                control,
                record.spec.trainer.steps,
                record.spec.judge,
                fail_on_rebound,
                known,
                _packed_mapping(subject),
                sabotage=cls.sabotage,
            )
            comparisons += found[0]
            verdicts += found[1]
            continue

        c = compared(path)
        comparisons.append(c)
        declined = refused_refit(cls.refusals, device, c.errors)
        if declined:  # vLLM declines this refit here by design: nothing to judge, and no twin
            verdicts.append(skipped(path, declined))
            continue
        verdict = judge(
            c,
            record.spec.judge,
            fail_on_rebound,
            known=cls.known_issues_for(facts),
            require_cache_hits=cls.needs_cache_hits,
            graphs=graphs,
        )
        if record.spec.sabotage:
            twin = compared(sabotaged_twin(path))
            comparisons.append(twin)
            outcome = judge_sabotage(
                twin,
                judge(twin, record.spec.judge, fail_on_rebound, graphs=graphs),
                cls.sabotage,
                cls.sabotage_evidence,
                control,
                _packed_mapping(subject),
                policy=record.spec.judge,
            )
            verdict = with_sabotage(verdict, outcome)
        if record.spec.expected_census:
            census = {t.name for o in (reference.observations[:1] if reference else ()) for t in o.tensors}
            verdict = with_expected_census(verdict, record.spec.expected_census, census)
        verdicts.append(verdict)
    return Evaluation(
        record=record,
        arms=tuple(results.values()),
        comparisons=tuple(comparisons),
        verdicts=tuple(without_twin(v) for v in verdicts),
    )


def shape_reference(
    arm: ArmPlan, base: ArmPlan | None, planned: tuple[ArmPlan, ...], results: dict[str, ArmResult]
) -> ArmResult | Verdict | None:
    """The cold B a subject arm's refit is compared with when it observes in other batch shapes
    (``plan.batch_shape``) than its base reference ``base``: the planned shape reference's result.
    None when the shapes are the same. A verdict when it cannot be judged: the plan has no such
    arm (made before the rule: refused, since bf16 kernels on a GPU round by batch shape and the
    noise floor cannot show it), or the arm left no result."""
    if base is None:
        return None
    shape, base_shape = batch_shape(arm.requirements, arm.engine), batch_shape(base.requirements, base.engine)
    if shape == base_shape:
        return None
    name = shape_reference_name(arm.requirements, arm.engine)
    shown = "/".join(shape or ("batched",)), "/".join(base_shape or ("batched",))
    if not any(a.name == name for a in planned):
        return Verdict(
            arm.name,
            VerdictStatus.INCONCLUSIVE,
            (
                f"the subject observes in other batch shapes ({shown[0]}) than its reference {base.name} "
                f"({shown[1]}), and no cold B of its shapes ({name}) was planned: a difference could be the "
                "kernels' batch-shape rounding alone, so the comparison is refused",
            ),
        )
    if name not in results:
        return Verdict(arm.name, VerdictStatus.ERROR, (f"{name} (cold B in the subject's batch shapes) never ran",))
    return results[name]


def cpu_flags_of(subject: ArmResult, record: RunRecord) -> tuple[str, ...] | None:
    """The CPU capabilities the subject's vLLM saw (its worker's record), else the machine's
    as the run recorded it; None in records from before capabilities were recorded."""
    cpu = subject.cpu or record.cpu
    return cpu.flags if cpu is not None else None


def _labels(arm: ArmPlan, owner: str) -> tuple[str, ...]:
    """Stages the plan said ``owner`` (a path or its sabotaged twin) would observe."""
    return tuple(s.label.stage for s in arm.steps if isinstance(s, Observe) and s.label.path == owner)


def _packed_mapping(subject: ArmResult) -> tuple[tuple[str, tuple[str, ...]], ...]:
    return subject.observations[0].model.packed_modules_mapping if subject.observations else ()


def segment_order(arm: ArmPlan) -> tuple[str, ...]:
    """The segments (paths and sabotaged twins) of a subject arm, in the order its steps run them."""
    return tuple(dict.fromkeys(s.owner for s in arm.steps if isinstance(s, Refit)))


def charged_to_segment(subject: ArmResult, path: str, order: tuple[str, ...]) -> ArmResult:
    """A shared engine that failed in one path's segment: the segments that completed before
    it are judged as they are; the failing segment carries the error, named (path, step);
    later segments never ran. A failure before any segment (the cold start) stays on all."""
    if subject.status != "error" or subject.failed_path not in order or path not in order:
        return subject
    failing, here = order.index(subject.failed_path), order.index(path)
    where = f"segment {subject.failed_path}, step {subject.failed_step}"
    if here < failing:
        return replace(subject, status="ok", error=None)
    if here == failing:
        return replace(subject, error=f"failed in {where}: {subject.error}")
    return replace(subject, error=f"not run: the shared engine failed earlier, in {where}: {subject.error}")


def refused_refit(refusals: tuple[Refusal, ...], device: str, errors: tuple[str, ...]) -> str | None:
    """The SKIPPED reason when a path's segment failed with an error vLLM declines the refit
    with by design on this device (``ReloadPath.refusals``), quoting vLLM's own words."""
    for refusal in refusals:
        said = next((e for e in errors if refusal.matches(device, e)), None)
        if said is not None:
            words = said.split("Worker failed with error ", 1)[-1]
            return f"vLLM declines this refit on {refusal.device}: {refusal.reason}. vLLM said: {words[:400]}"
    return None


def step_verdict_name(path: str, step: int) -> str:
    """The verdict of one trainer step: ``trainer_steps@T2``."""
    return f"{path}@{trainer_target(step)}"


def _step_view(subject: ArmResult, owner: str, step: int, last: bool, control_step: int) -> ArmResult:
    """The subject as ``compare_path`` reads one A->B oracle: trainer step ``step`` is its B.
    The step before it (for ``step`` > 1) is the value a stale tensor keeps; the last step also
    carries its repeat (idempotency), its positive control and the round trip back to A."""
    stage = {f"warm_{trainer_target(step)}": "warm_B"}
    if last:
        stage.update(
            {
                f"warm_{trainer_target(control_step)}_again": "warm_B_again",
                f"warm_{trainer_target(control_step, control=True)}": "warm_B_control",
                "warm_A": "warm_A",
            }
        )
    kept, seen_own = [], False
    for o in subject.observations:
        if o.label.path != owner:
            if not seen_own:
                kept.append(o)
            continue
        seen_own = True
        if step > 1 and o.label.stage == f"warm_{trainer_target(step - 1)}":
            kept.append(replace(o, label=ObservationLabel(f"before_{trainer_target(step)}")))
        elif o.label.stage in stage:
            kept.append(replace(o, label=ObservationLabel(stage[o.label.stage], owner)))
    # The step before, relabelled outside the segment, must come last of the non-segment ones.
    before = [o for o in kept if o.label.path != owner]
    own = [o for o in kept if o.label.path == owner]
    return replace(subject, observations=tuple(before + own))


def trainer_step_verdicts(
    path: str,
    subject: ArmResult,
    twin_subject: ArmResult | None,
    results: dict[str, ArmResult],
    reference: ArmResult | None,
    noise: ArmResult | None,
    control: str,
    steps: int,
    policy: JudgePolicy,
    fail_on_rebound: bool,
    known,
    packed: tuple[tuple[str, tuple[str, ...]], ...],
    sabotage: str,
) -> tuple[list[PathComparison], list[Verdict]]:
    """One verdict per optimizer step of a trainer path: the engine after step ``k`` against a
    cold start on step ``k``'s weights (the noise floor stays the run's cold-B pair). The
    positive control (sent after the last step) and the sabotaged twin (one more step, one
    parameter not sent) belong to the whole trainer, so every step's verdict carries them."""

    def compared(owner: str, view: ArmResult, k: int, expected: tuple[str, ...]) -> PathComparison:
        step_ref = results.get(trainer_reference_name(k))
        c = compare_path(
            owner,
            view,
            reference,
            noise,
            control,
            policy.logprob_atol,
            expected,
            refit_reference=step_ref,
        )
        if step_ref is None or not step_ref.observations:
            c = replace(c, errors=(*c.errors, f"{trainer_reference_name(k)} (cold start on step {k}) never observed"))
        return c

    last_expected = ("warm_B", "warm_B_again", "warm_B_control", "warm_A")
    comparisons = []
    for k in range(1, steps + 1):
        last = k == steps
        view = _step_view(subject, path, k, last, steps)
        c = compared(path, view, k, last_expected if last else ("warm_B",))
        comparisons.append(replace(c, path=step_verdict_name(path, k)))
    control_outcome = comparisons[-1].control
    comparisons = [c if c.control is not None else replace(c, control=control_outcome) for c in comparisons]
    outcome = None
    twin = None
    if twin_subject is not None:
        owner = sabotaged_twin(path)
        view = _step_view(twin_subject, owner, steps + 1, False, steps)
        twin = replace(
            compared(owner, view, steps + 1, ("warm_B",)), path=sabotaged_twin(step_verdict_name(path, steps + 1))
        )
        outcome = judge_sabotage(
            twin, judge(twin, policy, fail_on_rebound), sabotage, "tensor", control, packed, policy=policy
        )
    verdicts = [with_sabotage(judge(c, policy, fail_on_rebound, known=known), outcome) for c in comparisons]
    return comparisons + ([twin] if twin is not None else []), verdicts

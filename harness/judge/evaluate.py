"""Judge a run from its directory alone: every path's comparison, verdict and sabotage
outcome, from the records on disk (``refit-harness report DIR`` re-judges without vLLM)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from harness import store
from harness.errors import SchemaError
from harness.judge.diff import compare_path, one_digest
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
)
from harness.plan import ArmPlan, Observe, mode_reference_name, sabotaged_twin
from harness.records import ArmResult
from harness.settings import arm_files


def evaluate(out: Path) -> Evaluation:
    """Judge a run from its directory alone."""
    from harness.paths import PATHS

    record = store.load(RunRecord, out / "run.json", "run_record")
    results: dict[str, ArmResult] = {}
    for arm in record.plan.arms:
        result_file = arm_files(out, arm)[1]
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
        refusal = next((a.refused for a in (subject, reference) if a is not None and a.refused), None)
        if refusal:  # nothing to refit: vLLM will not run this engine here
            verdicts.append(skipped(path, f"vLLM cannot start this engine here: {refusal}"))
            continue
        arm = arm_or_none
        cls = PATHS.get(path)
        # The control is localized under the model's own name for it (vLLM may rename it on load).
        renamed = dict(next((o.model.weight_names for o in subject.observations), ()))
        control = renamed.get(record.checkpoints.control_tensor, record.checkpoints.control_tensor)
        env = dict(subject.environment)
        device = env.get("device", "cpu")
        # A cold start that raised observed nothing: the checkpoint says which model it is.
        architecture = (
            next((o.model.architecture for o in subject.observations), None) or record.checkpoints.architecture
        )
        kernels = next((o.model.quant_kernels for o in subject.observations), ())
        # The path's own engine mode decides whether a moved address matters (a compiled
        # path in an eager run captures graphs all the same).
        mode = arm.requirements.mode or arm.engine.mode
        same_mode = ref_arm is not None and mode == (ref_arm.requirements.mode or ref_arm.engine.mode)
        fail_on_rebound = rebound_fails(record.spec.judge, mode, device)

        # Segments in the order the engine ran them: the real ones, then the sabotaged twins.
        order = arm.paths + (tuple(sabotaged_twin(p) for p in arm.paths) if record.spec.sabotage else ())

        # Plans made before mode references existed have none: the run's reference then serves.
        own_mode = None if same_mode else results.get(mode_reference_name(mode))

        def compared(
            owner: str, subject=subject, order=order, control=control, arm=arm, same_mode=same_mode, own_mode=own_mode
        ):
            return compare_path(
                owner,
                charged_to_segment(subject, owner, order),
                reference,
                noise,
                control,
                record.spec.judge.logprob_atol,
                _labels(arm, owner),
                same_mode=same_mode,
                same_engine=not arm.requirements.restarts,
                refit_reference=own_mode,
            )

        c = compared(path)
        comparisons.append(c)
        verdict = judge(
            c,
            record.spec.judge,
            fail_on_rebound,
            known=cls.known_issues_for(
                device,
                env.get("vllm"),
                architecture,
                record.spec.engine.dtype,
                kernels,
                record.checkpoints.quantization,
                record.checkpoints.tied_embeddings,
            ),
            require_cache_hits=cls.needs_cache_hits,
        )
        if record.spec.sabotage:
            twin = compared(sabotaged_twin(path))
            comparisons.append(twin)
            outcome = judge_sabotage(
                twin,
                judge(twin, record.spec.judge, fail_on_rebound),
                cls.sabotage,
                cls.sabotage_evidence,
                control,
                _packed_mapping(subject),
            )
            verdict = with_sabotage(verdict, outcome)
        if record.spec.expected_census:
            census = {t.name for o in (reference.observations[:1] if reference else ()) for t in o.tensors}
            verdict = with_expected_census(verdict, record.spec.expected_census, census)
        verdicts.append(verdict)
    return Evaluation(
        record=record, arms=tuple(results.values()), comparisons=tuple(comparisons), verdicts=tuple(verdicts)
    )


def _labels(arm: ArmPlan, owner: str) -> tuple[str, ...]:
    """Stages the plan said ``owner`` (a path or its sabotaged twin) would observe."""
    return tuple(s.label.stage for s in arm.steps if isinstance(s, Observe) and s.label.path == owner)


def _packed_mapping(subject: ArmResult) -> tuple[tuple[str, tuple[str, ...]], ...]:
    return subject.observations[0].model.packed_modules_mapping if subject.observations else ()


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

"""The oracle's batch-shape rule on a real CPU engine. vLLM's CPU kernels give the same numbers
whatever the batch at these sizes; a GPU's bf16 kernels do not. ``BatchShapeQwen3ForCausalLM``
plants that on the CPU: its final norm rounds by the number of tokens in the forward. With it,
``http_reload`` (one request at a time) and ``prefix_cache`` (suffix-only prefills) FAIL against
the plain reference although every refit is right, and PASS, their twins caught, against a cold
B observed in their own batch shapes. One run gives both: the plain verdicts are re-judged from
its records, as the judge did before the rule."""

from __future__ import annotations

import pytest

from harness.checkpoints.tiny import tiny_qwen3

pytestmark = [pytest.mark.cpu]
SHAPED = ("prefix_cache", "http_reload")
OWN_REFERENCE = {"prefix_cache": "reference-prefix-cache", "http_reload": "reference-http"}


@pytest.fixture(scope="module")
def shaped(run_oracle):
    model = str(tiny_qwen3(architecture="BatchShapeQwen3ForCausalLM"))
    return run_oracle("batch_shape", "--model", model, "--paths", ",".join(SHAPED), "--sabotage")


def _records(run):
    from harness import store
    from harness.judge.evaluation import RunRecord
    from harness.records import ArmResult
    from harness.run_dir import RunDir

    record = store.load(RunRecord, run.out / "run.json", "run_record")
    results = {a.name: store.load(ArmResult, RunDir(run.out).arm(a).result, "arm_result") for a in record.plan.arms}
    return record, results


def _judged_against(run, path: str, reference_arm: str | None):
    """The path's verdict with its refit compared to ``reference_arm`` (None: the plain reference,
    as before the rule), the noise floor the run's reference/noise pair."""
    from harness.judge.diff import compare_path
    from harness.judge.evaluate import _labels
    from harness.judge.verdict import judge

    record, results = _records(run)
    arm = record.plan.subject_of(path)
    c = compare_path(
        path,
        results[arm.name],
        results["reference"],
        results["noise"],
        arm.refit_checkpoints.control_tensor,
        record.spec.judge.logprob_atol,
        _labels(arm, path),
        refit_reference=results[reference_arm] if reference_arm else None,
    )
    return c, judge(c, record.spec.judge, fail_on_rebound=False, require_cache_hits=path == "prefix_cache")


def test_with_a_reference_of_their_own_shapes_they_pass_and_catch_their_twins(shaped):
    assert shaped.exit_code == 0, shaped.output[-4000:]
    summary = shaped.summary
    arms = {a["arm"]: (a["role"], a["status"]) for a in summary["arms"]}
    for path in SHAPED:
        assert arms[OWN_REFERENCE[path]] == ("shape_reference", "ok"), arms
        p = summary["paths"][path]
        assert p["verdict"] == "PASS", (path, p["reasons"])
        assert p["sabotage"]["caught"], (path, p["sabotage"])


def test_the_fixture_makes_two_cold_starts_of_other_shapes_differ(shaped):
    """Without this, the test below would prove nothing: cold B in the plain shapes and cold B in
    each path's shapes, same weights, differ beyond the tolerance; two plain cold starts do not."""
    from harness.judge.diff import compare_outputs

    record, results = _records(shaped)
    cold = {name: results[name].observations[0] for name in ("reference", "noise", *OWN_REFERENCE.values())}
    noise = max(d.max_logprob_diff for d in compare_outputs("noise", cold["noise"], cold["reference"]))
    assert noise == 0.0
    for name in OWN_REFERENCE.values():
        diff = max(d.max_logprob_diff for d in compare_outputs("refit", cold[name], cold["reference"]))
        assert diff > record.spec.judge.logprob_atol, (name, diff)


def test_against_the_plain_reference_a_right_refit_fails(shaped):
    """The judge not told of the shapes (the code before the rule): a false FAIL on both paths,
    on the outputs alone, every tensor right; against their own shapes the same records PASS."""
    for path in SHAPED:
        c, verdict = _judged_against(shaped, path, None)
        assert verdict.status.value == "FAIL", (path, verdict.reasons)
        assert not [d for d in c.tensors if d.check == "refit" and d.status.value in ("STALE", "CORRUPT")], path
        _, own = _judged_against(shaped, path, OWN_REFERENCE[path])
        assert own.status.value == "PASS", (path, own.reasons)

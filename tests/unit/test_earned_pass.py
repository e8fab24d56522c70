"""Issue 9 on synthetic records: every PASS must be earned (no vLLM, no torch)."""

from __future__ import annotations

import dataclasses
from typing import get_args

import pytest

from harness import store
from harness.judge.diff import TensorStatus, classify, compare_consumed, compare_path
from harness.judge.evaluate import evaluate
from harness.judge.evaluation import RunRecord
from harness.judge.verdict import VerdictStatus, judge, judge_sabotage, with_sabotage
from harness.paths import PATHS
from harness.paths.base import ReloadPath
from harness.plan import PathNeeds, make_plan
from harness.records import ConsumedTensor
from harness.spec.checkpoint_set import CheckpointSet
from harness.spec.path_declaration import SabotageEvidence
from harness.spec.run import JudgePolicy, RunSpec
from tests.records import CONTROL, EXPECTED, QWEN_PACKED, A, B, arm, obs, output, segment, subject, tensor

POLICY = JudgePolicy()


def compared(subj, path="p", expected=EXPECTED):
    ref = arm("reference", "reference", obs("cold_B", B))
    noise = arm("noise", "noise", obs("cold_B", B))
    return compare_path(path, subj, ref, noise, "q_proj.weight", POLICY.logprob_atol, expected)


# ---- one classifier for census tensors and kernel inputs ----------------------------


def consumed(name: str, digest: str, nan_count: int = 0, address: int = 1000) -> ConsumedTensor:
    return ConsumedTensor(
        name=name,
        op_index=0,
        op="aten.mul.Tensor",
        arg=1,
        module="m",
        dtype="float32",
        shape=(4,),
        address=address,
        digest=digest,
        nan_count=nan_count,
    )


def test_a_nan_kernel_input_is_a_difference_even_with_identical_bytes():
    nan = consumed("w", "same", nan_count=1)
    subject_obs = dataclasses.replace(obs("warm_B", B), consumed=(nan,))
    reference_obs = dataclasses.replace(obs("cold_B", B), consumed=(nan,))
    [diff] = compare_consumed(subject_obs, reference_obs, witness=None, before=None, noise=None)
    assert diff.status is TensorStatus.CORRUPT


def test_a_recording_of_one_more_engine_step_is_judged_on_the_steps_both_made():
    step = (consumed("w", "new"), dataclasses.replace(consumed("norm", "n"), op="aten.add.Tensor"))
    reference_obs = dataclasses.replace(obs("cold_B", B), consumed=step + step)  # the prefill in two steps
    right = dataclasses.replace(obs("warm_B", B), consumed=step)
    diffs = compare_consumed(right, reference_obs, witness=None, before=None, noise=None)
    assert [d.status for d in diffs] == [TensorStatus.OK, TensorStatus.OK]
    # A stale weight in the one step the subject recorded is still caught.
    stale = dataclasses.replace(obs("warm_B", B), consumed=(consumed("w", "old"), step[1]))
    diffs = compare_consumed(stale, reference_obs, witness=stale, before=None, noise=None)
    assert [d.status for d in diffs] == [TensorStatus.STALE, TensorStatus.UNJUDGEABLE]  # norm: equal in the witness
    # An op the subject never ran is still MISSING, however many steps either side recorded.
    partial = dataclasses.replace(obs("warm_B", B), consumed=step[:1])
    assert TensorStatus.MISSING in {
        d.status for d in compare_consumed(partial, reference_obs, witness=None, before=None, noise=None)
    }


def test_a_noise_floor_of_fewer_engine_steps_still_judges_every_step_of_the_other_two():
    """CI, --engine-core-process: the reference and subject recorded the prefill in two steps, the
    noise arm in one; a oneDNN handle (its bytes are pointers, so two cold starts differ) was
    NOISY in the first step and CORRUPT in the second, failing a correct refit."""

    def step(handle: str) -> tuple[ConsumedTensor, ...]:
        return (consumed("w", "new"), dataclasses.replace(consumed("handle", handle), op="_C.onednn_mm.default"))

    reference_obs = dataclasses.replace(obs("cold_B", B), consumed=step("ptr-ref") * 2)
    noise_obs = dataclasses.replace(obs("cold_B", B), consumed=step("ptr-noise"))
    warm = dataclasses.replace(obs("warm_B", B), consumed=step("ptr-warm") * 2)
    diffs = compare_consumed(warm, reference_obs, witness=None, before=None, noise=noise_obs)
    assert sorted(d.status.name for d in diffs) == ["NOISY", "NOISY", "OK", "OK"], diffs
    # A stale weight in the second step is still STALE against a one-step witness.
    cold_a = dataclasses.replace(obs("cold_A", A), consumed=(consumed("w", "old"),))
    stale = dataclasses.replace(obs("warm_B", B), consumed=step("ptr-warm") + (consumed("w", "old"),))
    diffs = compare_consumed(stale, reference_obs, witness=cold_a, before=None, noise=noise_obs)
    assert [d.status.name for d in diffs if d.name == "w"] == ["OK", "STALE"], diffs


def test_kernel_inputs_and_tensors_share_one_ladder():
    # dtype and shape count for kernel inputs as they do for census tensors.
    wider = dataclasses.replace(consumed("w", "d"), dtype="bfloat16")
    assert classify(wider, consumed("w", "d")) is TensorStatus.CORRUPT
    assert classify(tensor("w", "d"), tensor("w", "d"), tensor("w", "old")) is TensorStatus.OK
    assert classify(tensor("w", "old"), tensor("w", "d"), tensor("w", "old")) is TensorStatus.STALE
    assert classify(consumed("w", "old"), consumed("w", "d"), consumed("w", "old")) is TensorStatus.STALE


# ---- UNJUDGEABLE ----------------------------------------------------------------------


def test_a_tensor_equal_before_and_after_the_refit_is_unjudgeable_never_ok():
    assert classify(tensor("r", "const"), tensor("r", "const"), tensor("r", "const")) is TensorStatus.UNJUDGEABLE
    assert classify(tensor("r", "const"), tensor("r", "const")) is TensorStatus.OK  # no witness: nothing to say
    assert classify(tensor("r", "junk"), tensor("r", "const"), tensor("r", "const")) is TensorStatus.CORRUPT


def test_a_path_whose_only_evidence_is_unjudgeable_is_inconclusive():
    # A --target equal to A: nothing moves, so nothing could have shown a missed refit.
    subj = arm("subject-p", "subject", obs("cold_A", B), *segment("p", warm_a=B), paths=("p",))
    c = compared(subj)
    assert {d.status for d in c.tensors if d.check == "refit"} == {TensorStatus.UNJUDGEABLE}
    v = judge(c, POLICY, False)
    assert v.status is VerdictStatus.INCONCLUSIVE
    assert any(r.startswith("no judgeable evidence") for r in v.reasons)


def test_unjudgeable_tensors_are_counted_beside_a_pass():
    subj = arm(
        "subject-p",
        "subject",
        obs("cold_A", {**A, "buf": "int"}),
        *segment("p", warm_b={**B, "buf": "int"}, warm_a={**A, "buf": "int"}, control={**CONTROL, "buf": "int"}),
        paths=("p",),
    )
    ref = arm("reference", "reference", obs("cold_B", {**B, "buf": "int"}))
    noise = arm("noise", "noise", obs("cold_B", {**B, "buf": "int"}))
    c = compare_path("p", subj, ref, noise, "q_proj.weight", POLICY.logprob_atol, EXPECTED)
    v = judge(c, POLICY, False)
    assert v.status is VerdictStatus.PASS
    assert any("1 tensor(s) UNJUDGEABLE" in r and "buf" in r for r in v.notes)


# ---- prefix-cache hits ---------------------------------------------------------------


def with_hits(observations, hits):
    return [
        dataclasses.replace(o, outputs=tuple(dataclasses.replace(x, cached_tokens=hits) for x in o.outputs))
        for o in observations
    ]


def test_prefix_cache_path_without_cache_hits_fails():
    subj = arm("subject-p", "subject", obs("cold_A", A), *with_hits(segment("p"), 0), paths=("p",))
    c = compared(subj)
    assert c.cache_hits == 0
    v = judge(c, POLICY, False, require_cache_hits=True)
    assert v.status is VerdictStatus.FAIL and v.reasons[0].startswith("no prefix-cache hits after the refit")
    assert judge(c, POLICY, False).status is VerdictStatus.PASS  # paths that need no hits are unaffected
    hit = compared(arm("subject-p", "subject", obs("cold_A", A), *with_hits(segment("p"), 256), paths=("p",)))
    assert hit.cache_hits == 256  # one prompt
    assert judge(hit, POLICY, False, require_cache_hits=True).status is VerdictStatus.PASS


# ---- sabotage controls ---------------------------------------------------------------

TWIN = ("warm_B", "warm_A")


def twin_arm(warm_b, outputs_b=None):
    own = segment("p", drop=())
    twin = [
        dataclasses.replace(o, label=dataclasses.replace(o.label, path="p~sabotage"))
        for o in segment("p", warm_b=warm_b, outputs_b=outputs_b, drop=("warm_B_again", "warm_B_control"))
    ]
    return arm("subject-p", "subject", obs("cold_A", A), *own, *twin, paths=("p",))


def sabotage_outcome(subj, evidence="tensor", planted="q_proj.weight"):
    twin = compared(subj, "p~sabotage", TWIN)
    return judge_sabotage(
        twin, judge(twin, POLICY, False), "left q_proj out", evidence, planted, QWEN_PACKED, policy=POLICY
    )


def test_a_caught_sabotage_names_the_planted_tensor_and_keeps_the_pass():
    outcome = sabotage_outcome(twin_arm({**B, "qkv_proj.<kernel-output>": A["qkv_proj.<kernel-output>"]}))
    assert outcome.caught and outcome.verdict is VerdictStatus.FAIL
    assert outcome.detail == "caught: qkv_proj.<kernel-output> STALE"
    v = with_sabotage(judge(compared(twin_arm(B)), POLICY, False), outcome)
    assert v.status is VerdictStatus.PASS and v.sabotage is outcome


def test_a_sabotage_nobody_caught_makes_the_path_inconclusive():
    outcome = sabotage_outcome(twin_arm(B))  # the sabotaged refit changed nothing visible
    assert not outcome.caught and outcome.verdict is not VerdictStatus.FAIL
    v = with_sabotage(judge(compared(twin_arm(B)), POLICY, False), outcome)
    assert v.status is VerdictStatus.INCONCLUSIVE
    assert v.reasons[0].startswith("sabotaged twin not caught (left q_proj out): this path cannot fail here")


def test_a_twin_failing_elsewhere_than_it_planted_is_not_caught():
    outcome = sabotage_outcome(twin_arm({**B, "norm": A["norm"]}))  # fails, but not at q_proj
    assert outcome.verdict is VerdictStatus.FAIL and not outcome.caught
    assert "not with what its sabotage plants" in outcome.detail


def test_a_token_evidence_sabotage_is_caught_by_a_divergence():
    stale_kv = twin_arm(B, outputs_b=[output(0, (1, 9, 9))])
    outcome = sabotage_outcome(stale_kv, evidence="tokens", planted=None)
    assert outcome.caught and outcome.detail.startswith("caught: prompt 0 (refit) diverges at token 1: "), outcome
    assert not sabotage_outcome(twin_arm(B), evidence="tokens", planted=None).caught


def test_a_token_evidence_sabotage_that_moves_only_logprobs_is_caught_beyond_the_tolerance():
    """Stale KV in a small fp16 model can move the logprobs and no greedy token (measured on the
    tied zoo families): beyond the tolerance that is the outputs differing; within it, nothing."""
    moved = sabotage_outcome(twin_arm(B, outputs_b=[output(0, (1, 2, 3), -1.02)]), evidence="tokens", planted=None)
    assert moved.caught and "logprobs differ by 0.02 > tolerance" in moved.detail, moved
    within = -1.0 - POLICY.logprob_atol / 2
    missed = sabotage_outcome(twin_arm(B, outputs_b=[output(0, (1, 2, 3), within)]), evidence="tokens", planted=None)
    assert not missed.caught and missed.verdict is not VerdictStatus.FAIL, missed


def test_a_failing_path_keeps_its_fail_whatever_its_twin():
    stale = {**B, "norm": A["norm"]}
    v = judge(compared(subject(warm_b=stale, warm_b_again=stale)), POLICY, False)
    assert with_sabotage(v, sabotage_outcome(twin_arm(B))).status is VerdictStatus.FAIL


def test_every_path_declares_a_sabotage_with_evidence():
    for name in PATHS.names():
        cls = PATHS.get(name)
        assert cls.sabotaged_refit is not ReloadPath.sabotaged_refit, name  # the base only raises
        assert cls.sabotage and cls.sabotage_evidence in get_args(SabotageEvidence), name
        assert cls.sabotage_targets[0] == "B", name  # only B has a sabotaged checkpoint
    assert PATHS.get("prefix_cache").sabotage_evidence == "tokens" and PATHS.get("prefix_cache").needs_cache_hits


# ---- REBOUND is judged with the path's own mode -------------------------------------


def write_run(tmp_path, device: str, paths=("compiled",), rebound="auto"):
    spec = RunSpec(model="/a", paths=paths, judge=JudgePolicy(rebound=rebound))  # an eager run
    cs = CheckpointSet(a="/a", b="/b", b_control="/c", control_tensor="q_proj.weight")
    needs = {p: PathNeeds.of(PATHS.get(p)) for p in paths}
    plan = make_plan(spec, cs, needs, {})
    store.dump(
        RunRecord(spec=spec, checkpoints=cs, plan=plan, git_sha="test", started="now"),
        tmp_path / "run.json",
        "run_record",
    )
    env = (("device", device),)
    moved = [tensor(n, d, address=2000 if n == "norm" else 1000) for n, d in B.items()]
    for a in plan.arms:
        if a.role == "subject":
            result = arm(
                a.name, "subject", obs("cold_A", A), *segment(paths[0], warm_b=moved, warm_b_again=moved), paths=a.paths
            )
        else:
            result = arm(a.name, a.role, obs("cold_B", B))
        store.dump(
            dataclasses.replace(result, environment=env), tmp_path / "arms" / f"{a.name}.result.json", "arm_result"
        )
    return tmp_path


@pytest.mark.parametrize(
    "device, verdict", [("NVIDIA H100 80GB HBM3", VerdictStatus.FAIL), ("cpu (x86_64)", VerdictStatus.PASS)]
)
def test_a_compiled_path_in_an_eager_run_fails_a_rebound_on_a_gpu(tmp_path, device, verdict):
    ev = evaluate(write_run(tmp_path, device), PATHS.get)
    assert ev.record.spec.engine.mode == "eager"
    [v] = ev.verdicts
    assert v.status is verdict, v.reasons
    if verdict is VerdictStatus.FAIL:
        assert v.first_divergent_tensor == "norm (REBOUND, refit)"


def test_an_eager_path_on_a_gpu_reports_a_rebound_without_failing(tmp_path):
    [v] = evaluate(write_run(tmp_path, "NVIDIA H100 80GB HBM3", paths=("reload_weights",)), PATHS.get).verdicts
    assert v.status is VerdictStatus.PASS
    assert any("REBOUND, not failing" in r for r in v.notes)


# ---- earned by default: twins run unless --no-sabotage, and an unearned PASS says so ------


def run_spec(*flags: str):
    from harness.cli import build_parser
    from harness.cli.run import spec_from_args

    return spec_from_args(build_parser().parse_args(["run", "--model", "/m", *flags]))


def test_a_plain_run_runs_the_twins_and_no_sabotage_turns_them_off():
    assert run_spec().sabotage and run_spec("--sabotage").sabotage
    assert not run_spec("--no-sabotage").sabotage


def test_a_pass_without_a_twin_is_shown_as_such_and_is_not_earned(tmp_path):
    [v] = evaluate(write_run(tmp_path, "cpu (x86_64)", paths=("reload_weights",)), PATHS.get).verdicts  # no twin ran
    assert v.status is VerdictStatus.PASS and not v.earned
    assert v.shown == "PASS (no twin)" and v.reasons[0].startswith("no sabotaged twin ran (--no-sabotage)")
    assert "not earned" in v.headline
    caught = sabotage_outcome(twin_arm({**B, "qkv_proj.<kernel-output>": A["qkv_proj.<kernel-output>"]}))
    earned = with_sabotage(judge(compared(twin_arm(B)), POLICY, False), caught)
    assert earned.earned and earned.shown == "PASS" and "was caught" in earned.headline


def test_an_unearned_pass_meets_no_pass_expectation_and_is_no_regression():
    from harness.judge.crossbuild import VerdictRow, check_expectations, parse_expectation

    row = VerdictRow("reload_weights", "FAIL", "PASS (no twin)", None, "changed", "", "")
    [met] = check_expectations((row,), (parse_expectation("pr=PASS"),))
    assert not met.met and met.actual == (("reload_weights", "PASS (no twin)"),)
    [implied] = check_expectations((VerdictRow("p", "PASS (no twin)", "PASS", None, "changed", "", ""),), ())
    assert implied.met  # an unearned PASS exits 0: moving to an earned one is no regression


def test_the_grid_and_summary_show_an_unearned_pass(tmp_path):
    from harness.report.matrix import matrix_summary
    from harness.report.summary import summary_dict
    from harness.spec.scenario import CellGroup, ModelRef

    ev = evaluate(write_run(tmp_path, "cpu (x86_64)", paths=("reload_weights",)), PATHS.get)
    entry = summary_dict(ev)["paths"]["reload_weights"]
    assert entry["verdict"] == "PASS" and entry["shown"] == "PASS (no twin)" and entry["earned"] is False
    group = CellGroup(id="g", model=ModelRef("m", path="/a"), spec=ev.record.spec)
    s = matrix_summary("s", [(group, ev)])
    assert s["grid"]["g"]["reload_weights"] == "PASS (no twin)" and s["cells"]["reload_weights[g]"]["earned"] is False

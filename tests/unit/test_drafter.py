"""A speculative-decoding drafter (``--draft-tokens``): its acceptance rate judged against cold
B's, its census entries as the evidence of ``reload_weights_drafter``'s sabotaged twin, and the
engine arguments that give every arm a drafter of its own checkpoint. From records alone; the
real engines are in ``tests/integration/test_drafter.py``."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

from harness.arm.engines import SPEC_DECODE_COUNTERS, draft_counts_of, engine_args
from harness.judge.diff import compare_path
from harness.judge.verdict import VerdictStatus, judge, judge_sabotage
from harness.orchestrate.execute import unavailable_here
from harness.paths import PATHS
from harness.plan import PathNeeds, make_plan
from harness.records import DRAFTER_PREFIX, Observation
from harness.spec.checkpoint_set import CheckpointSet
from harness.spec.requirements import EngineRequirements
from harness.spec.run import EngineSpec, JudgePolicy, RunSpec
from tests.helpers import cli
from tests.records import EXPECTED, QWEN_PACKED, A, B, arm, obs, segment

POLICY = JudgePolicy()
DRAFTED_A = {**A, DRAFTER_PREFIX + "norm": "a-dn"}
DRAFTED_B = {**B, DRAFTER_PREFIX + "norm": "b-dn"}
ALL_ACCEPTED = (48, 48)


def drafting(o: Observation, drafts: tuple[int, int] | None) -> Observation:
    return dataclasses.replace(o, drafts=drafts)


def comparison(warm_drafts, cold_drafts=ALL_ACCEPTED, noise_drafts=ALL_ACCEPTED, warm_b=DRAFTED_B):
    steps = [drafting(o, warm_drafts) for o in segment("p", warm_b=warm_b, warm_a=DRAFTED_A)]
    subj = arm("subject-p", "subject", obs("cold_A", DRAFTED_A), *steps, paths=("p",))
    ref = arm("reference", "reference", drafting(obs("cold_B", DRAFTED_B), cold_drafts))
    noise = arm("noise", "noise", drafting(obs("cold_B", DRAFTED_B), noise_drafts))
    return compare_path("p", subj, ref, noise, "q_proj.weight", POLICY.logprob_atol, EXPECTED)


def test_a_drafter_left_behind_fails_on_its_acceptance_rate_with_identical_tokens():
    stale = judge(comparison(warm_drafts=(1, 48)), POLICY, False)
    assert stale.status is VerdictStatus.FAIL
    assert stale.reasons[0] == "drafter stale: acceptance rate 0.02 vs cold B's 1.00; tokens identical"
    same = judge(comparison(warm_drafts=ALL_ACCEPTED), POLICY, False)
    assert same.status is VerdictStatus.PASS, same.reasons
    assert "drafter: acceptance rate 1.00 after the refit, as cold B's" in same.notes


def test_an_acceptance_rate_two_cold_starts_disagree_on_is_no_evidence():
    c = comparison(warm_drafts=(1, 48), noise_drafts=(40, 48))
    assert c.acceptance is None and judge(c, POLICY, False).status is VerdictStatus.PASS
    assert comparison(warm_drafts=None).acceptance is None  # an engine without a drafter


def test_the_twin_of_a_drafter_refit_is_caught_only_by_a_drafter_tensor():
    left_behind = comparison(warm_drafts=(1, 48), warm_b={**B, DRAFTER_PREFIX + "norm": "a-dn"})
    outcome = judge_sabotage(
        left_behind, judge(left_behind, POLICY, False), "drafter skipped", "drafter", None, QWEN_PACKED, policy=POLICY
    )
    assert outcome.caught and outcome.detail == f"caught: {DRAFTER_PREFIX}norm STALE", outcome
    # The target left behind instead: a FAIL, but not with what skipping the drafter plants.
    target = comparison(warm_drafts=ALL_ACCEPTED, warm_b={**DRAFTED_B, "norm": "a-n"})
    missed = judge_sabotage(
        target, judge(target, POLICY, False), "drafter skipped", "drafter", None, QWEN_PACKED, policy=POLICY
    )
    assert missed.verdict is VerdictStatus.FAIL and not missed.caught, missed


def test_draft_counts_come_from_vllms_two_counters():
    accepted, proposed = SPEC_DECODE_COUNTERS
    metrics = [SimpleNamespace(name=accepted, value=7), SimpleNamespace(name=proposed, value=9)]
    assert draft_counts_of(metrics + [SimpleNamespace(name="vllm:num_requests_running", value=1)]) == (7, 9)
    assert draft_counts_of(metrics[:1]) is None


CS = CheckpointSet(a="/a", b="/b", b_control="/c", control_tensor="norm")
NEEDS = {
    "reload_weights": PathNeeds(EngineRequirements(), ("B", "B", "B_control", "A")),
    "reload_weights_drafter": PathNeeds(EngineRequirements(), ("B", "B", "B_control", "A")),
}


def test_every_arm_drafts_with_its_own_checkpoint():
    spec = RunSpec(model="/a", paths=tuple(NEEDS), engine=EngineSpec(draft_tokens=3))
    for planned in make_plan(spec, CS, NEEDS, {}).arms:
        args = engine_args(planned)
        assert args["speculative_config"] == {
            "method": "draft_model",
            "model": args["model"],
            "num_speculative_tokens": 3,
        }, planned.name
    (reference,) = [a for a in make_plan(spec, CS, NEEDS, {}).arms if a.role == "reference"]
    assert engine_args(reference, {"model": "/b2"})["speculative_config"]["model"] == "/b2"  # a restart's model
    plain = RunSpec(model="/a", paths=("reload_weights",))
    assert all("speculative_config" not in engine_args(a) for a in make_plan(plain, CS, NEEDS, {}).arms)


def test_a_drafter_refit_without_a_drafter_is_skipped_with_why():
    classes = {name: PATHS.get(name) for name in NEEDS}
    without = unavailable_here(RunSpec(model="/a", paths=tuple(NEEDS)), classes)
    assert set(without) == {"reload_weights_drafter"} and "--draft-tokens" in without["reload_weights_drafter"]
    assert unavailable_here(RunSpec(model="/a", paths=tuple(NEEDS), engine=EngineSpec(draft_tokens=2)), classes) == {}


def test_draft_tokens_with_a_scenario_is_one_line_and_exit_2(tmp_path):
    proc = cli("run", "-s", "zoo", "--draft-tokens", "2", "--out", str(tmp_path / "out"), timeout=120)
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("refit-harness: error:")]
    assert proc.returncode == 2 and len(errors) == 1 and "--draft-tokens" in errors[0], proc.stderr


def test_a_drafter_vllm_cannot_set_up_is_a_refusal_and_other_assertions_stay_errors():
    """vLLM asserts that every drafting layer shares one KV-cache group; a model with sliding-window
    and full layers fails that assertion at start-up (measured: gemma3, granite-swa). Raised where
    vLLM raises it, it is vLLM declining; another assertion, or the same words elsewhere, is not."""
    import vllm.v1.spec_decode.llm_base_proposer as proposer

    from harness.arm.process import refused_by_vllm

    def raised_in_vllm(message: str) -> AssertionError:
        try:
            exec(compile(f"assert False, {message!r}", proposer.__file__, "exec"), {})
        except AssertionError as exc:
            return exc
        raise RuntimeError("the assertion did not raise")

    words = "All drafting layers should belong to the same kv cache group"
    assert refused_by_vllm(raised_in_vllm(words))
    assert not refused_by_vllm(raised_in_vllm("shapes differ"))
    assert not refused_by_vllm(AssertionError(words))  # no vLLM frame raised it

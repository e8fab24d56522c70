"""A speculative-decoding drafter (``--draft-tokens``): its acceptance rate judged against cold
B's, its census entries as the evidence of ``reload_weights_drafter``'s sabotaged twin, and the
engine arguments that give every arm a drafter of its own checkpoint. From records alone; the
real engines are in ``tests/integration/test_drafter.py``."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from harness.arm.engines import SPEC_DECODE_COUNTERS, draft_counts_of, draft_counts_of_exposition, engine_args
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


def test_served_draft_counts_are_summed_over_the_data_parallel_engines():
    """``vllm serve`` exposes the counters as Prometheus text, one sample per engine."""
    from prometheus_client import CollectorRegistry, Counter, generate_latest

    registry = CollectorRegistry()
    accepted, proposed = (Counter(n, n, ["model_name", "engine"], registry=registry) for n in SPEC_DECODE_COUNTERS)
    Counter("vllm:spec_decode_num_drafts", "drafts", ["engine"], registry=registry).labels("0").inc(50)
    for engine, (a, p) in enumerate([(3, 8), (4, 6)]):
        accepted.labels("m", str(engine)).inc(a)
        proposed.labels("m", str(engine)).inc(p)
    text = generate_latest(registry).decode()
    assert "vllm:spec_decode_num_accepted_tokens_total{" in text and "_created{" in text
    assert draft_counts_of_exposition(text) == (7, 14)

    plain = CollectorRegistry()
    Counter(SPEC_DECODE_COUNTERS[1], "proposed only", registry=plain).inc(5)
    assert draft_counts_of_exposition(generate_latest(plain).decode()) is None


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


EAGLE_CS = dataclasses.replace(CS, drafter_heads=(("/a", "/a-head"), ("/b", "/b-head"), ("/c", "/c-head")))


class RecordingEngine:
    def __init__(self) -> None:
        self.calls: list[tuple[str, dict]] = []

    def rpc(self, method, kwargs=None):
        self.calls.append((method, kwargs or {}))
        return [None]


def test_an_eagle_drafter_starts_and_refits_with_the_head_of_each_checkpoint():
    spec = RunSpec(model="/a", paths=tuple(NEEDS), engine=EngineSpec(draft_tokens=2, drafter="eagle"))
    for planned in make_plan(spec, EAGLE_CS, NEEDS, {}).arms:
        args = engine_args(planned)
        assert args["speculative_config"] == {
            "method": "eagle",
            "model": args["model"] + "-head",
            "num_speculative_tokens": 2,
        }, planned.name
    engine = RecordingEngine()
    path = PATHS.get("reload_weights_drafter")(EAGLE_CS)
    path.refit(engine, "/b", "B")
    assert engine.calls == [
        ("reload_weights", {"weights_path": "/b"}),
        ("refit_harness_reload_drafter", {"weights_path": "/b-head"}),
    ]
    assert CS.drafter_checkpoint("/b") == "/b"  # a draft_model drafter loads the target's own


def test_an_eagle_head_is_the_checkpoints_last_layer_behind_a_pass_through_fc(tmp_path):
    import torch
    from safetensors.torch import load_file, save_file

    from harness.checkpoints.eagle import HEAD_LAYER, eagle_head
    from harness.errors import CheckpointError

    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text('{"num_hidden_layers": 2, "hidden_size": 4}')
    layers = {f"model.layers.{i}.{leaf}": torch.full((4, 4), float(i)) for i in (0, 1) for leaf in HEAD_LAYER}
    save_file({**layers, "model.embed_tokens.weight": torch.ones(8, 4)}, str(target / "model.safetensors"))
    head = eagle_head(target, cache=tmp_path / "cache")
    tensors = load_file(str(head / "model.safetensors"))
    assert set(tensors) == {f"layers.0.{leaf}" for leaf in HEAD_LAYER} | {"fc.weight"}
    assert all(torch.equal(tensors[f"layers.0.{leaf}"], layers[f"model.layers.1.{leaf}"]) for leaf in HEAD_LAYER)
    hidden = torch.arange(4.0)
    assert torch.equal(tensors["fc.weight"] @ torch.cat([torch.ones(4), hidden]), hidden)  # the hidden state passes
    assert '"num_hidden_layers": 1' in (head / "config.json").read_text()
    other = tmp_path / "other"  # a last layer of another shape: no head, and why
    other.mkdir()
    (other / "config.json").write_text('{"num_hidden_layers": 2, "hidden_size": 4}')
    save_file({"model.layers.1.mlp.up_proj.weight": torch.ones(4, 4)}, str(other / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"no EAGLE head can be made .* missing layers\.0\.mlp\.down_proj"):
        eagle_head(other, cache=tmp_path / "cache")


def test_a_drafter_refit_without_a_drafter_is_skipped_with_why():
    classes = {name: PATHS.get(name) for name in NEEDS}
    without = unavailable_here(RunSpec(model="/a", paths=tuple(NEEDS)), classes)
    assert set(without) == {"reload_weights_drafter"} and "--draft-tokens" in without["reload_weights_drafter"]
    assert unavailable_here(RunSpec(model="/a", paths=tuple(NEEDS), engine=EngineSpec(draft_tokens=2)), classes) == {}


def test_draft_tokens_with_a_scenario_is_one_line_and_exit_2(tmp_path):
    proc = cli("run", "-s", "zoo", "--draft-tokens", "2", "--out", str(tmp_path / "out"), timeout=120)
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("refit-harness: error:")]
    assert proc.returncode == 2 and len(errors) == 1 and "--draft-tokens" in errors[0], proc.stderr
    alone = cli("run", "--drafter", "eagle", "--out", str(tmp_path / "alone"), timeout=120)
    errors = [ln for ln in alone.stderr.splitlines() if ln.startswith("refit-harness: error:")]
    assert alone.returncode == 2 and len(errors) == 1 and "--draft-tokens" in errors[0], alone.stderr


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

import math

from harness.judge.diff import (
    TensorStatus,
    compare_control,
    compare_outputs,
    compare_path,
    compare_tensors,
    control_targets,
)
from harness.records import ObservationLabel
from tests.records import EXPECTED, QWEN_PACKED, A, B, arm, obs, output, segment, subject, tensor


def statuses(diffs):
    return {d.tensor: d.status for d in diffs}


def test_value_statuses_against_reference_and_witness():
    warm = obs("warm_B", {"ok": "b1", "stale": "a2", "corrupt": "x3", "extra": "e"})
    ref = obs("cold_B", {"ok": "b1", "stale": "b2", "corrupt": "b3", "missing": "m"})
    wit = obs("cold_A", {"ok": "a1", "stale": "a2", "corrupt": "a3", "missing": "m"})
    got = statuses(compare_tensors("refit", warm, ref, witness=wit))
    assert got == {
        "ok": TensorStatus.OK,
        "stale": TensorStatus.STALE,
        "corrupt": TensorStatus.CORRUPT,
        "missing": TensorStatus.MISSING,
        "extra": TensorStatus.EXTRA,
    }


def test_moved_address_is_rebound_only_when_value_is_right():
    before = obs("cold_A", [tensor("w", "a", address=1), tensor("k", "a", address=5, kind="kernel")])
    warm = obs("warm_B", [tensor("w", "b", address=2), tensor("k", "b", address=6, kind="kernel")])
    ref = obs("cold_B", [tensor("w", "b", address=9), tensor("k", "b", address=9, kind="kernel")])
    got = statuses(compare_tensors("refit", warm, ref, witness=before, before=before))
    assert got == {"w": TensorStatus.REBOUND, "k": TensorStatus.OK}  # kernel outputs have no stable address


def test_nan_counts_as_difference_even_with_identical_bytes():
    warm = obs("warm_B", [tensor("w", "same", nan_count=1)])
    ref = obs("cold_B", [tensor("w", "same", nan_count=1)])
    assert statuses(compare_tensors("refit", warm, ref))["w"] is TensorStatus.CORRUPT


def test_noisy_tensors_are_not_judged():
    warm = obs("warm_B", {"w": "x"})
    ref = obs("cold_B", {"w": "y"})
    assert statuses(compare_tensors("refit", warm, ref, noisy=frozenset({"w"})))["w"] is TensorStatus.NOISY


def test_first_divergence_and_logprob_difference():
    s = obs("warm_B", {}, [output(0, (1, 2, 3), -1.0), output(1, (4, 5, 6), -1.0)])
    r = obs("cold_B", {}, [output(0, (1, 2, 3), -1.25), output(1, (4, 9, 6), -1.0)])
    d = {x.prompt: x for x in compare_outputs("refit", s, r)}
    assert d[0].first_divergence is None and math.isclose(d[0].max_logprob_diff, 0.25)
    assert d[1].first_divergence == 1


def test_shorter_output_diverges_where_it_ends():
    s = obs("warm_B", {}, [output(0, (1, 2))])
    r = obs("cold_B", {}, [output(0, (1, 2, 3))])
    assert compare_outputs("refit", s, r)[0].first_divergence == 2


def test_nan_logprob_is_infinite_difference():
    s = obs("warm_B", {}, [output(0, (1,), float("nan"))])
    r = obs("cold_B", {}, [output(0, (1,), float("nan"))])
    assert compare_outputs("refit", s, r)[0].max_logprob_diff == math.inf


def test_control_targets_follow_packed_modules():
    assert control_targets("model.layers.0.self_attn.q_proj.weight", QWEN_PACKED) == (
        "model.layers.0.self_attn.q_proj",
        "model.layers.0.self_attn.qkv_proj",
    )
    assert control_targets("model.norm.weight", QWEN_PACKED) == ("model.norm",)


def test_control_detected_only_at_its_target():
    base = obs("warm_B", {"model.layers.0.self_attn.qkv_proj.<kernel-output>": "k", "model.norm.weight": "n"})
    hit = obs(
        "warm_B_control",
        {"model.layers.0.self_attn.qkv_proj.<kernel-output>": "k2", "model.norm.weight": "n"},
        [output(0, (1, 2, 3), -2.0)],
    )
    elsewhere = obs(
        "warm_B_control", {"model.layers.0.self_attn.qkv_proj.<kernel-output>": "k", "model.norm.weight": "n2"}
    )
    name = "model.layers.0.self_attn.q_proj.weight"
    good = compare_control(name, hit, base, logprob_floor=1e-4)
    assert good.detected and good.tokens_moved
    bad = compare_control(name, elsewhere, base, logprob_floor=1e-4)
    assert not bad.detected and bad.changed == ("model.norm.weight",)


def test_compare_path_runs_every_check():
    ref = arm("reference", "reference", obs("cold_B", B))
    noise = arm("noise", "noise", obs("cold_B", B))
    c = compare_path("p", subject(), ref, noise, "q_proj.weight", 1e-4, EXPECTED)
    assert {d.check for d in c.tensors} == {"noise", "refit", "idempotency", "round_trip"}
    assert not c.errors and not c.missing_observations
    assert all(d.status is TensorStatus.OK for d in c.tensors)
    assert c.control is not None and c.control.detected


def test_compare_path_reports_missing_observations_and_errors():
    ref = arm("reference", "reference", obs("cold_B", B))
    c = compare_path("p", subject(drop=("warm_A", "warm_B_control")), ref, None, "q_proj.weight", 1e-4, EXPECTED)
    assert c.missing_observations == ("warm_B_control", "warm_A")
    assert c.control is None
    dead = arm("reference", "reference", error="boom")
    c2 = compare_path("p", subject(), dead, None, "q_proj.weight", 1e-4, EXPECTED)
    assert any("boom" in e for e in c2.errors)


def test_shared_engine_segments_use_the_state_before_each_segment_as_witness():
    # Path p1 leaves "norm" stale at A's value; path p2 then refits correctly except for
    # "norm", which still holds the value it had before p2's segment began.
    p1 = segment("p1", warm_b={**B, "norm": A["norm"]}, warm_b_again={**B, "norm": A["norm"]})
    p2 = segment("p2", warm_b={**B, "norm": "left-by-p1"}, warm_b_again={**B, "norm": "left-by-p1"})
    p1[-1] = obs(ObservationLabel("warm_A", "p1"), {**A, "norm": "left-by-p1"})
    shared = arm("subject-p1+p2", "subject", obs("cold_A", A), *p1, *p2, paths=("p1", "p2"))
    ref = arm("reference", "reference", obs("cold_B", B))
    c1 = compare_path("p1", shared, ref, None, "q_proj.weight", 1e-4, EXPECTED)
    c2 = compare_path("p2", shared, ref, None, "q_proj.weight", 1e-4, EXPECTED)
    refit = lambda c: {d.tensor: d.status for d in c.tensors if d.check == "refit"}  # noqa: E731
    assert refit(c1)["norm"] is TensorStatus.STALE
    assert refit(c2)["norm"] is TensorStatus.STALE  # equal to p1/warm_A, the state p2 started from
    assert {d.tensor for d in c1.tensors if d.check == "round_trip" and d.status is not TensorStatus.OK} == {"norm"}


def test_noisy_handles_cannot_stand_in_for_the_control():
    # The reload rebuilt the target module's opaque kernel handle (new pointer), but the
    # scaled weight itself never reached the kernel: that is not a detection.
    handle = "model.layers.0.self_attn.qkv_proj.cpu_linear<closure>.handler.handler_tensor"
    probe = "model.layers.0.self_attn.qkv_proj.<kernel-output>"
    base = obs("warm_B", {handle: "ptr1", probe: "k"})
    control = obs("warm_B_control", {handle: "ptr2", probe: "k"})
    name = "model.layers.0.self_attn.q_proj.weight"
    fooled = compare_control(name, control, base, 1e-4)
    assert fooled.detected  # without the noise floor, the handle looks like a detection
    honest = compare_control(name, control, base, 1e-4, noisy=frozenset({handle}))
    assert not honest.detected and honest.changed == ()


def test_a_path_that_restarts_the_engine_compares_values_not_addresses():
    from harness.judge.diff import compare_path
    from tests.records import EXPECTED, A, B, arm, obs, subject, tensor

    moved = [tensor(n, d, address=2000) for n, d in B.items()]
    ref, noise = arm("reference", "reference", obs("cold_B", B)), arm("noise", "noise", obs("cold_B", B))
    subj = subject(warm_b=moved, warm_b_again=moved, warm_a=[tensor(n, d, address=3000) for n, d in A.items()])
    same = compare_path("p", subj, ref, noise, "q_proj.weight", 1e-4, EXPECTED)
    restarted = compare_path("p", subj, ref, noise, "q_proj.weight", 1e-4, EXPECTED, same_engine=False)
    assert {d.status.value for d in same.tensors if d.check == "refit"} == {"REBOUND"}
    assert {d.status.value for d in restarted.tensors if d.check != "noise"} == {"OK"}
    assert any("new engine at every refit" in n for n in restarted.notes)

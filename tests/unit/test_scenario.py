import pytest

from harness.judge.diff import TensorStatus, compare_control, compare_tensors
from harness.judge.evaluation import Evaluation
from harness.judge.verdict import Verdict, VerdictStatus
from harness.report.matrix import matrix_summary
from harness.spec.run import PerturbSpec
from harness.spec.scenario import ModelRef, ScenarioSpec, expand
from tests.records import obs, tensor

MATRIX = ScenarioSpec(
    name="m",
    description="",
    models=(ModelRef("tiny", builder="tiny-qwen3"), ModelRef("big", path="/m")),
    paths=("reload_weights", "transfer_gloo"),
    modes=("eager", "compiled"),
    tp_sizes=(1, 2),
)


def test_expand_makes_one_run_per_model_mode_tp_sharing_paths():
    groups = expand(MATRIX)
    assert [g.id for g in groups] == [
        "tiny-eager-tp1",
        "tiny-eager-tp2",
        "tiny-compiled-tp1",
        "tiny-compiled-tp2",
        "big-eager-tp1",
        "big-eager-tp2",
        "big-compiled-tp1",
        "big-compiled-tp2",
    ]
    g = groups[3]
    assert g.spec.paths == ("reload_weights", "transfer_gloo")
    assert (g.spec.engine.mode, g.spec.engine.tensor_parallel_size) == ("compiled", 2)
    assert g.cell_ids() == ("reload_weights[tiny-compiled-tp2]", "transfer_gloo[tiny-compiled-tp2]")


def test_only_and_skip_filter_cells_by_glob():
    only = expand(MATRIX, only=("reload_weights[*-eager-*",))
    assert [c for g in only for c in g.cell_ids()] == [
        "reload_weights[tiny-eager-tp1]",
        "reload_weights[tiny-eager-tp2]",
        "reload_weights[big-eager-tp1]",
        "reload_weights[big-eager-tp2]",
    ]
    skipped = expand(MATRIX, skip=("*[big-*", "transfer_gloo[*"))
    assert {c for g in skipped for c in g.cell_ids()} == {
        f"reload_weights[tiny-{m}-tp{t}]" for m in ("eager", "compiled") for t in (1, 2)
    }
    assert expand(MATRIX, only=("nothing*",)) == ()


def test_several_perturbations_get_their_own_ids():
    s = ScenarioSpec(
        name="p",
        description="",
        models=(ModelRef("t", path="/t"),),
        paths=("reload_weights",),
        perturbations=(PerturbSpec(seed=1), PerturbSpec(seed=2)),
    )
    assert [g.id for g in expand(s)] == ["t-eager-tp1-p1", "t-eager-tp1-p2"]


def _evaluation(*verdicts: Verdict) -> Evaluation:
    return Evaluation(record=None, arms=(), comparisons=(), verdicts=verdicts)


def test_matrix_exit_code_is_the_worst_cell():
    groups = expand(MATRIX, only=("*[tiny-eager-tp1]",))
    ok = _evaluation(
        Verdict("reload_weights", VerdictStatus.PASS, ()), Verdict("transfer_gloo", VerdictStatus.SKIPPED, ("x",))
    )
    bad = _evaluation(Verdict("reload_weights", VerdictStatus.FAIL, ("stale",)))
    dead = _evaluation(Verdict("reload_weights", VerdictStatus.ERROR, ("engine died",)))
    assert matrix_summary("m", [(groups[0], ok)])["exit_code"] == 0
    assert matrix_summary("m", [(groups[0], ok), (groups[0], bad)])["exit_code"] == 1
    assert matrix_summary("m", [(groups[0], bad), (groups[0], dead)])["exit_code"] == 2
    assert matrix_summary("m", [(groups[0], ok)])["cells"]["transfer_gloo[tiny-eager-tp1]"]["verdict"] == "SKIPPED"


def test_xfail_keeps_the_run_green_and_xpass_fails_it():
    known = _evaluation(
        Verdict("reload_weights", VerdictStatus.PASS, ()), Verdict("k", VerdictStatus.XFAIL, ("known",))
    )
    gone = _evaluation(Verdict("k", VerdictStatus.XPASS, ("did not reproduce",)))
    assert (known.exit_code, gone.exit_code) == (0, 1)


def test_per_rank_observations_localize_a_bug_to_one_rank():
    # TP=2: a replicated norm reloaded with the wrong rank's slice on rank 1 only (vLLM #48025).
    names = ("model.norm.weight", "model.layers.0.self_attn.qkv_proj.<kernel-output>")

    def tp2(label, prefix, changed=None):
        digests = {(r, n): f"{prefix}{r}{i}" for r in (0, 1) for i, n in enumerate(names)} | (changed or {})
        return obs(label, [tensor(n, d, rank=r) for (r, n), d in digests.items()], world_size=2)

    cold_a, cold_b = tp2("cold_A", "a"), tp2("cold_B", "b")
    warm = tp2("warm_B", "b", {(1, "model.norm.weight"): "a10"})
    diffs = {d.tensor: d.status for d in compare_tensors("refit", warm, cold_b, witness=cold_a)}
    assert diffs["rank1:model.norm.weight"] is TensorStatus.STALE
    assert {n for n, s in diffs.items() if s is not TensorStatus.OK} == {"rank1:model.norm.weight"}
    control = tp2("warm_B_control", "b", {(0, "model.layers.0.self_attn.qkv_proj.<kernel-output>"): "scaled"})
    outcome = compare_control("model.layers.0.self_attn.q_proj.weight", control, cold_b, 1e-4)
    assert outcome.localized == ("rank0:model.layers.0.self_attn.qkv_proj.<kernel-output>",)
    # One rank alone: the same names, unprefixed (what a TP=1 report shows).
    single = obs("warm_B", {"model.norm.weight": "x"})
    assert [d.tensor for d in compare_tensors("refit", single, single)] == ["model.norm.weight"]


def test_model_is_a_directory_or_a_hub_id_fetched_through_huggingface_hub(tmp_path, monkeypatch):
    from harness.checkpoints.source import resolve_model
    from harness.errors import CheckpointError

    assert resolve_model(str(tmp_path)) == tmp_path  # a directory: no hub involved
    with pytest.raises(CheckpointError, match="checkpoint directory not found"):
        resolve_model("./relative/missing")  # path-like: never a hub id
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # no network here either way; fail fast and say why
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(
        CheckpointError, match="'refit-harness-test/absent' is not a directory, and fetching it as a hub id failed"
    ):
        resolve_model("refit-harness-test/absent")


def test_cpu_thread_binding_for_tp_and_concurrency(monkeypatch):
    from harness.orchestrate import fanout

    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    monkeypatch.setattr(fanout, "cuda_available", lambda: False)
    monkeypatch.setattr(fanout.os, "cpu_count", lambda: 2)
    assert fanout.cpu_thread_env(1, 2) == {"VLLM_CPU_OMP_THREADS_BIND": "0|1"}
    assert fanout.cpu_thread_env(2, 1) == {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1"}
    assert fanout.cpu_thread_env(1, 1) == {}
    monkeypatch.setattr(fanout.os, "cpu_count", lambda: 8)
    assert fanout.cpu_thread_env(1, 2) == {"VLLM_CPU_OMP_THREADS_BIND": "0-3|4-7"}
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0")  # the user's own choice wins
    assert fanout.cpu_thread_env(2, 2) == {}


def test_throughput_probe_steps_come_after_cold_b_and_after_the_first_refit_to_b():
    from harness.plan import Observe, PathNeeds, Probe, make_plan
    from harness.records import ObservationLabel, ProbeLabel
    from harness.spec.checkpoint_set import CheckpointSet
    from harness.spec.requirements import EngineRequirements
    from harness.spec.run import RunSpec, ThroughputSpec

    cs = CheckpointSet(a="/a", b="/b", b_control="/c", control_tensor="t")
    needs = {p: PathNeeds(EngineRequirements(), ("B", "B", "B_control", "A")) for p in ("x", "y")}
    plain = make_plan(RunSpec(model="/a", paths=("x", "y")), cs, needs, {})
    assert not any(isinstance(s, Probe) for a in plain.arms for s in a.steps)
    plan = make_plan(RunSpec(model="/a", paths=("x", "y"), throughput=ThroughputSpec()), cs, needs, {})
    ref, noise, subject = plan.arms
    cold_b, warm_b = ObservationLabel("cold_B"), ObservationLabel("warm_B", "x")
    assert ref.steps[-1] == Probe(ProbeLabel("throughput", cold_b)) and noise.steps == ref.steps
    assert str(ref.steps[-1].label) == "cold_B/throughput"
    at = subject.steps.index(Probe(ProbeLabel("throughput", warm_b)))
    assert subject.steps[at - 1] == Observe(warm_b) and str(subject.steps[at].label) == "x/throughput"
    assert sum(isinstance(s, Probe) for s in subject.steps) == 1


def test_a_path_that_may_raise_runs_after_every_other_segment_and_twin_of_its_engine():
    from harness.paths import PATHS
    from harness.plan import PathNeeds, Refit, make_plan
    from harness.spec.checkpoint_set import CheckpointSet
    from harness.spec.requirements import EngineRequirements
    from harness.spec.run import RunSpec

    assert PathNeeds.of(PATHS.get("reload_kernel_format")).runs_last  # its save raises on fp8 and MLA
    assert not PathNeeds.of(PATHS.get("reload_weights")).runs_last
    cs = CheckpointSet(a="/a", b="/b", b_control="/c", control_tensor="t")
    needs = {p: PathNeeds(EngineRequirements(), ("B", "A"), runs_last=p == "k") for p in ("x", "k", "y")}
    (subject,) = (
        a
        for a in make_plan(RunSpec(model="/a", paths=("x", "k", "y"), sabotage=True), cs, needs, {}).arms
        if a.role == "subject"
    )
    assert subject.paths == ("x", "y", "k")
    order = [s.owner for s in subject.steps if isinstance(s, Refit)]
    segments = list(dict.fromkeys(order))
    assert segments == ["x", "y", "x~sabotage", "y~sabotage", "k", "k~sabotage"], segments

    # The judge reads the same order from the plan: a raise in k's segment leaves every twin
    # before it judged (the fp8 families' twins were "not run" while the judge assumed twins last).
    from dataclasses import replace

    from harness.judge.evaluate import charged_to_segment, segment_order
    from tests.records import arm

    assert segment_order(subject) == tuple(segments)
    failed = replace(arm("s", "subject", paths=subject.paths, error="RuntimeError: view size"), failed_path="k")
    assert charged_to_segment(failed, "y~sabotage", segment_order(subject)).status == "ok"
    assert "failed in segment k" in (charged_to_segment(failed, "k", segment_order(subject)).error or "")
    assert "not run" in (charged_to_segment(failed, "k~sabotage", segment_order(subject)).error or "")

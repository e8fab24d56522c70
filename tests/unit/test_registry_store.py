import json
import sys

import pytest

from harness import store
from harness.errors import UnknownName
from harness.plan import ArmPlan, Observe, PathNeeds, Refit, make_plan
from harness.records import ArmResult, ObservationLabel
from harness.registry import Registry
from harness.spec.checkpoint_set import CheckpointSet
from harness.spec.requirements import EngineRequirements
from harness.spec.run import RunSpec
from tests.records import output, subject

NEEDS = PathNeeds(EngineRequirements(), ("B", "B", "B_control", "A"))


def test_registry_is_lazy_strict_and_lists_names():
    reg: Registry = Registry("widget")
    reg.register("json", "json:dumps")
    reg.register("nowhere", "harness_no_such_module:thing")
    assert reg.get("json") is json.dumps
    with pytest.raises(ValueError, match="already registered"):
        reg.register("json", "json:loads")
    with pytest.raises(UnknownName, match=r"unknown widget 'nope'. Available: \['json', 'nowhere'\]"):
        reg.get("nope")
    assert "harness_no_such_module" not in sys.modules  # never imported until looked up
    with pytest.raises(ValueError, match="module:attribute"):
        reg.register("bad", "json.dumps")


def test_arm_result_round_trips_through_disk(tmp_path):
    result = subject(outputs_b=[output(0, (1, 2), float("nan"))])
    path = store.dump(result, tmp_path / "r.json", "arm_result")
    back = store.load(ArmResult, path, "arm_result")
    assert back.observations[1].tensors == result.observations[1].tensors
    assert back.observation(ObservationLabel("warm_B", "p")).outputs[0].token_ids == (1, 2)
    lp = back.observation(ObservationLabel("warm_B", "p")).outputs[0].logprobs[0][0][1]
    assert lp != lp  # NaN survives the round trip
    assert json.loads(path.read_text())["schema_version"] == store.SCHEMA_VERSION


def test_plan_round_trips_and_newer_schema_is_refused(tmp_path):
    cs = CheckpointSet(a="/a", b="/b", b_control="/c", control_tensor="x.weight")
    plan = make_plan(RunSpec(model="/a"), cs, {"reload_weights": NEEDS}, {})
    arm = plan.arms[-1]
    back = store.load(ArmPlan, store.dump(arm, tmp_path / "p.json", "arm_plan"), "arm_plan")
    assert back == arm
    payload = json.loads((tmp_path / "p.json").read_text())
    payload["schema_version"] = store.SCHEMA_VERSION + 1
    (tmp_path / "p.json").write_text(json.dumps(payload))
    with pytest.raises(store.SchemaError, match="not readable by this harness"):
        store.load(ArmPlan, tmp_path / "p.json", "arm_plan")
    with pytest.raises(store.SchemaError, match="expected a 'arm_result' record"):
        store.dump(arm, tmp_path / "q.json", "arm_plan")
        store.load(ArmResult, tmp_path / "q.json", "arm_result")


def test_plan_shares_engines_between_paths_with_equal_requirements():
    cs = CheckpointSet(a="/a", b="/b", b_control="/c", control_tensor="x.weight")
    dummy = PathNeeds(EngineRequirements(load_format="dummy"), ("B", "B_control"), ("B",))
    needs = {"p1": NEEDS, "p2": NEEDS, "d": dummy, "gpu_only": NEEDS}
    plan = make_plan(RunSpec(model="/a", paths=("p1", "d", "p2", "gpu_only")), cs, needs, {"gpu_only": "needs CUDA"})
    assert [a.name for a in plan.arms] == ["reference", "noise", "subject-p1+p2", "subject-d"]
    assert [a.start for a in plan.arms] == ["B", "B", "A", "A"]
    assert plan.skipped[0].path == "gpu_only" and "CUDA" in plan.skipped[0].reason
    labels = [str(s.label) for s in plan.arms[2].steps if isinstance(s, Observe)]
    assert labels == ["cold_A"] + [
        f"{p}/{x}" for p in ("p1", "p2") for x in ("warm_B", "warm_B_again", "warm_B_control", "warm_A")
    ]
    assert [s.label for s in plan.arms[2].steps if isinstance(s, Observe)][1] == ObservationLabel("warm_B", "p1")
    assert [str(s.label) for s in plan.arms[3].steps if isinstance(s, Observe)] == [
        "cold_dummy",
        "d/warm_B",
        "d/warm_B_control",
    ]
    assert plan.subject_of("p2").name == "subject-p1+p2" and plan.subject_of("gpu_only") is None
    assert make_plan(RunSpec(model="/a", paths=("gpu_only",)), cs, needs, {"gpu_only": "x"}).arms == ()


def test_sabotaged_twins_run_after_every_real_segment_with_only_their_first_refit_sabotaged():
    cs = CheckpointSet(a="/a", b="/b", b_control="/c", control_tensor="x.weight")
    dummy = PathNeeds(EngineRequirements(load_format="dummy"), ("B", "B_control"), ("B",))
    needs = {"p1": NEEDS, "p2": NEEDS, "d": dummy}
    plan = make_plan(RunSpec(model="/a", paths=("p1", "p2", "d"), sabotage=True), cs, needs, {})
    shared = plan.arms[2].steps
    labels = [str(s.label) for s in shared if isinstance(s, Observe)]
    real = ["cold_A"] + [
        f"{p}/{x}" for p in ("p1", "p2") for x in ("warm_B", "warm_B_again", "warm_B_control", "warm_A")
    ]
    # The last twin ends the arm: no segment follows that needs the engine back at A.
    assert labels == real + ["p1~sabotage/warm_B", "p1~sabotage/warm_A", "p2~sabotage/warm_B"]
    refits = [(s.path, s.target, s.sabotaged) for s in shared if isinstance(s, Refit)][-3:]
    assert refits == [("p1", "B", True), ("p1", "A", False), ("p2", "B", True)]
    assert not any(
        isinstance(s, Refit) and s.sabotaged for s in shared[: 2 * len(real) - 1]
    )  # the cold observe has no refit
    assert [str(s.label) for s in plan.arms[3].steps if isinstance(s, Observe)] == [
        "cold_dummy",
        "d/warm_B",
        "d/warm_B_control",
        "d~sabotage/warm_B",
    ]
    # A failure in a twin's later, real refit is the twin's: every refit of its segment says so.
    owners = [(s.path, s.target, s.owner) for s in shared if isinstance(s, Refit)][-3:]
    assert owners == [("p1", "B", "p1~sabotage"), ("p1", "A", "p1~sabotage"), ("p2", "B", "p2~sabotage")]
    assert {s.owner for s in shared[: 2 * len(real) - 1] if isinstance(s, Refit)} == {"p1", "p2"}
    without = make_plan(RunSpec(model="/a", paths=("p1",)), cs, needs, {})
    assert not any(isinstance(s, Observe) and s.label.path.endswith("~sabotage") for s in without.arms[2].steps[1:])


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.update(observations="abc"), r"observations: Input should be a valid tuple"),
        (lambda d: d.update(surprise=1), r"surprise: Unexpected keyword argument"),
        (lambda d: d["observations"][0].update(label=["not", "a", "label"]), r"observations\.0\.label"),
        (lambda d: d.pop("arm"), r"arm: Field required"),
    ],
)
def test_a_record_of_the_wrong_structure_is_a_schema_error_naming_the_field(tmp_path, change, message):
    """Validated on load: nothing dropped, nothing half-built (the old reader kept "abc" as a
    tuple of letters and dropped unknown fields)."""
    path = store.dump(subject(), tmp_path / "r.json", "arm_result")
    payload = json.loads(path.read_text())
    change(payload["data"])
    path.write_text(json.dumps(payload))
    with pytest.raises(store.SchemaError, match="wrong structure") as caught:
        store.load(ArmResult, path, "arm_result")
    assert caught.match(message)


def test_an_older_record_is_migrated_one_version_at_a_time(tmp_path, monkeypatch):
    """A next version (pretend) renamed ArmResult's ``arm`` from ``arm_name``: a record
    written with the old name is upgraded by the registered migration, then validated."""
    now = store.SCHEMA_VERSION
    result = subject()
    path = store.dump(result, tmp_path / "r.json", "arm_result")
    old = json.loads(path.read_text())
    old["data"]["arm_name"] = old["data"].pop("arm")
    path.write_text(json.dumps(old))

    monkeypatch.setattr(store, "SCHEMA_VERSION", now + 1)
    with pytest.raises(store.SchemaError, match=f"no migration from version {now}"):
        store.load(ArmResult, path, "arm_result")

    def rename(payload: dict) -> dict:
        data = dict(payload["data"])
        data["arm"] = data.pop("arm_name")
        return {**payload, "schema_version": now + 1, "data": data}

    monkeypatch.setitem(store.MIGRATIONS, now, rename)
    assert store.load(ArmResult, path, "arm_result") == result
    with pytest.raises(ValueError, match="already registered"):
        store.migration(now)(rename)


def _old_label(label: dict) -> str:
    """A label as versions 1 and 2 wrote it: ``<path>/<stage>``, ``<point>/<probe>``."""
    if "probe" in label:
        after = label["after"]
        return f"{after['path'] or after['stage']}/{label['probe']}"
    return f"{label['path']}/{label['stage']}" if label["path"] else label["stage"]


def _old_step(step: dict) -> dict:
    """A step as versions 1 and 2 wrote it: an action and an argument that is a label or a checkpoint key."""
    if "target" in step:
        return {"action": "refit", "argument": step["target"], "path": step["path"], "sabotaged": step["sabotaged"]}
    if "probe" in step["label"]:
        action = "measure" if step["label"]["probe"] == "throughput" else "accuracy"
        return {"action": action, "argument": _old_label(step["label"]), "path": None, "sabotaged": False}
    return {"action": "observe", "argument": _old_label(step["label"]), "path": None, "sabotaged": False}


def _as_version(path, version: int):
    """Rewrite a record file as an older harness wrote it: string labels and steps (versions 1 and 2),
    and multi-rank names prefixed ``rank<N>:``, with no ``rank`` field (version 1)."""
    payload = json.loads(path.read_text())
    payload["schema_version"] = version
    data = payload["data"]
    for plan in (
        [data] if payload["kind"] == "arm_plan" else data["plan"]["arms"] if payload["kind"] == "run_record" else []
    ):
        plan["steps"] = [_old_step(s) for s in plan["steps"]]
    for field in ("observations", "measurements", "completions") if payload["kind"] == "arm_result" else ():
        for r in data[field]:
            r["label"] = _old_label(r["label"])
    for o in data.get("observations", ()) if version == 1 else ():
        for field in ("tensors", "consumed", "unobserved"):
            for r in o[field]:
                rank = r.pop("rank")
                if o["model"]["world_size"] > 1 and rank is not None:
                    r["name"] = f"rank{rank}:{r['name']}"
    path.write_text(json.dumps(payload))


def test_a_version_1_record_with_rank_prefixed_names_loads_with_rank_fields(tmp_path):
    """Version 1 wrote a TP=2 observation's ranks as ``rank<N>:`` name prefixes; version 2 has
    a ``rank`` field. A version-1 arm on disk (a run to resume, a cached reference) still loads,
    and compares exactly as a version-2 record of the same observation."""
    import dataclasses

    from harness.judge.diff import compare_tensors
    from harness.records import ConsumedTensor, UnobservedRecord
    from tests.records import obs, tensor

    consumed = ConsumedTensor(
        name="model.norm.weight",
        op_index=3,
        op="aten.mul.Tensor",
        arg=1,
        module="model.norm",
        dtype="float32",
        shape=(4,),
        address=7,
        digest="d",
        rank=1,
    )
    unobserved = (
        UnobservedRecord("x.<kernel-output>", "kernel", "why", rank=0),
        UnobservedRecord("<kernel-input>", "forward", "arm-level"),
    )
    tp2 = dataclasses.replace(
        obs("cold_B", [tensor("model.norm.weight", f"d{r}", rank=r) for r in (0, 1)], world_size=2),
        consumed=(consumed,),
        unobserved=unobserved,
    )
    tp1 = obs("cold_A", {"rank9:odd.name": "z"})  # one rank: a name that looks prefixed is left alone
    result = dataclasses.replace(subject(), observations=(tp1, tp2))
    path = store.dump(result, tmp_path / "r.json", "arm_result")
    _as_version(path, 1)
    assert json.loads(path.read_text())["data"]["observations"][1]["tensors"][1]["name"] == "rank1:model.norm.weight"

    back = store.load(ArmResult, path, "arm_result")
    assert back.observations[1].tensors == tp2.tensors
    assert back.observations[1].consumed == (consumed,)
    assert back.observations[1].unobserved == unobserved
    assert back.observations[0].tensors[0].name == "rank9:odd.name" and back.observations[0].tensors[0].rank == 0
    assert [d.tensor for d in compare_tensors("noise", back.observations[1], tp2)] == [
        "rank0:model.norm.weight",
        "rank1:model.norm.weight",
    ]


def test_version_2_plans_and_results_with_string_labels_and_steps_load_typed(tmp_path):
    """Versions 1 and 2 wrote labels as ``<path>/<stage>`` strings and steps as an action plus an
    argument (a label or a checkpoint key); the migration to version 3 gives back exactly what
    this planner makes, probes included, and an arm's labels as typed values."""
    import dataclasses

    from harness.judge.evaluation import RunRecord
    from harness.records import Completions, Measurement
    from harness.spec.run import AccuracySpec, ThroughputSpec
    from tests.records import probe

    cs = CheckpointSet(a="/a", b="/b", b_control="/c", control_tensor="x.weight", b_damaged="/d")
    dummy = PathNeeds(EngineRequirements(load_format="dummy"), ("B", "B_control"), ("B",))
    spec = RunSpec(
        model="/a",
        paths=("p1", "d"),
        sabotage=True,
        throughput=ThroughputSpec(),
        accuracy=AccuracySpec(file="f", prompts=("q",), answers=("a",)),
    )
    plan = make_plan(spec, cs, {"p1": NEEDS, "d": dummy}, {})
    assert {type(s).__name__ for a in plan.arms for s in a.steps} == {"Observe", "Refit", "Probe"}
    for arm in plan.arms:
        path = store.dump(arm, tmp_path / f"{arm.name}.json", "arm_plan")
        _as_version(path, 2)
        assert json.loads(path.read_text())["data"]["steps"][0]["action"] in ("observe", "accuracy")
        assert store.load(ArmPlan, path, "arm_plan") == arm
    record = RunRecord(spec=spec, checkpoints=cs, plan=plan, git_sha="x", started="now")
    path = store.dump(record, tmp_path / "run.json", "run_record")
    _as_version(path, 2)
    assert store.load(RunRecord, path, "run_record") == record

    result = dataclasses.replace(
        subject(),
        measurements=(
            Measurement(probe("throughput", "cold_B"), 8, 32, (1.0,)),
            Measurement(probe("throughput", "p"), 8, 32, (1.0,)),
        ),
        completions=(Completions(probe("accuracy", "cold_B_damaged"), "t", ("x",)),),
    )
    path = store.dump(result, tmp_path / "r.json", "arm_result")
    _as_version(path, 2)
    old = json.loads(path.read_text())["data"]
    assert [o["label"] for o in old["observations"]][:2] == ["cold_A", "p/warm_B"]
    assert [m["label"] for m in old["measurements"]] == ["cold_B/throughput", "p/throughput"]
    back = store.load(ArmResult, path, "arm_result")
    assert back == result
    assert back.observation(ObservationLabel("warm_B", "p")) is back.observations[1]

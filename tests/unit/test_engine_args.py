"""Engine arguments as an axis (``--engine-arg``, ``--engine-config``, a scenario's engine
configurations): parsed, checked against the build's own ``EngineArgs`` before any engine
starts, applied to every arm and to ``vllm serve``, recorded and shown. Engine-free: the one
vLLM these tests touch is asked for its field list in a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import pytest

from harness import store
from harness.arm.engines import data_parallel_rank_header, engine_args, serve_flags
from harness.builds.engine_fields import engine_fields
from harness.cli import build_parser
from harness.cli.run import with_run_flags
from harness.errors import BuildError, UsageError
from harness.plan import PathNeeds, make_plan
from harness.spec.build import BuildSpec
from harness.spec.checkpoint_set import CheckpointSet
from harness.spec.engine_config import (
    EngineConfig,
    EngineFields,
    check_engine_args,
    decode,
    encode,
    from_command_line,
    parse_engine_arg,
    shown,
)
from harness.spec.requirements import EngineRequirements
from harness.spec.run import EngineSpec, RunSpec
from harness.spec.scenario import ModelRef, ScenarioSpec, expand
from tests.helpers import cli

FIELDS = EngineFields(
    vllm="0.0-test",
    names=("kv_cache_dtype", "max_num_seqs", "hf_overrides", "enable_prefix_caching", "attention_backend", "dtype"),
    choices=(("kv_cache_dtype", ("auto", "fp8", "fp8_e5m2")), ("attention_backend", ("CPU_ATTN", "HPC_ATTN"))),
    server_only=("port", "api_key"),
    kinds=(
        ("max_num_seqs", ("int", "null")),
        ("hf_overrides", ("map",)),
        ("enable_prefix_caching", ("bool", "null")),
        ("kv_cache_dtype", ("str",)),
    ),
)


def check(*flags: str, fields: EngineFields = FIELDS) -> None:
    check_engine_args(from_command_line(None, flags), fields)


# --- parsing -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("kv_cache_dtype=fp8", ("kv_cache_dtype", "fp8")),
        ("max_num_seqs=4", ("max_num_seqs", 4)),
        ("enable_prefix_caching=false", ("enable_prefix_caching", False)),
        ('hf_overrides={"rope_theta": 1e6}', ("hf_overrides", {"rope_theta": 1e6})),
        ("kv-cache-dtype=fp8", ("kv_cache_dtype", "fp8")),  # dashes, as vllm serve takes them
        ("quantization=", ("quantization", "")),
        ("served_model_name=a=b", ("served_model_name", "a=b")),  # only the first '=' splits
    ],
)
def test_a_value_is_json_else_a_string(text, expected):
    assert parse_engine_arg(text) == expected


@pytest.mark.parametrize("text", ["kv_cache_dtype", "=fp8", ""])
def test_an_argument_without_key_and_value_is_refused(text):
    with pytest.raises(UsageError, match="--engine-arg expects KEY=VALUE"):
        parse_engine_arg(text)


def test_a_config_file_takes_vllm_serve_keys_and_the_flags_win(tmp_path):
    config = tmp_path / "engine.yaml"
    config.write_text("kv-cache-dtype: fp8_e5m2\nmax_num_seqs: 4\ncompilation-config:\n  mode: 0\n")
    args = from_command_line(str(config), ["kv_cache_dtype=fp8"])
    assert decode(args) == {"kv_cache_dtype": "fp8", "max_num_seqs": 4, "compilation_config": {"mode": 0}}
    assert [k for k, _ in args] == sorted(k for k, _ in args)  # one canonical order: the key of references


@pytest.mark.parametrize(
    "name, text, message",
    [
        ("engine.json", "{}", "must be a .yaml or .yml file"),
        ("engine.yaml", "- a\n- b\n", "must map keys to values, got a list"),
        ("engine.yaml", "a: [\n", "not valid YAML"),
        ("engine.yaml", "when: 2024-01-01\n", "is not a JSON value"),
    ],
)
def test_a_bad_config_file_is_one_usage_error(tmp_path, name, text, message):
    (tmp_path / name).write_text(text)
    with pytest.raises(UsageError, match=message):
        from_command_line(str(tmp_path / name), [])


def test_a_missing_config_file_is_named():
    with pytest.raises(UsageError, match="--engine-config /no/such.yaml: cannot read it"):
        from_command_line("/no/such.yaml", [])


# --- checking against the build's EngineArgs --------------------------------------------------


def test_known_fields_with_fitting_values_pass():
    check("kv_cache_dtype=fp8", "max_num_seqs=4", "enable_prefix_caching=true", 'hf_overrides={"a": 1}')
    check("attention_backend=HPC_ATTN", "max_num_seqs=null")


def test_an_unknown_key_names_the_closest_fields():
    with pytest.raises(UsageError) as err:
        check("kv_cache_dtyp=fp8")
    assert str(err.value) == (
        "engine argument kv_cache_dtyp: not an EngineArgs field of vLLM 0.0-test; closest: kv_cache_dtype"
    )
    with pytest.raises(UsageError, match="no field has a similar name"):
        check("zzzz=1")


@pytest.mark.parametrize(
    "key, flag",
    [
        ("model", "--model"),
        ("dtype", "--dtype"),
        ("tensor_parallel_size", "--tp"),
        ("enforce_eager", "--mode"),
        ("load_format", "--paths"),
        ("seed", "--seed sets B's perturbation"),
    ],
)
def test_a_key_the_harness_owns_names_the_harness_flag(key, flag):
    with pytest.raises(UsageError, match="the harness sets it in every arm; use ") as err:
        check(f"{key}=1")
    assert flag in str(err.value)


def test_a_server_option_is_not_an_engine_argument():
    with pytest.raises(UsageError, match="port: a vllm serve server option"):
        check("port=8000")


@pytest.mark.parametrize(
    "flag, message",
    [
        ("kv_cache_dtype=fp9", "kv_cache_dtype=fp9: vLLM 0.0-test takes one of auto, fp8, fp8_e5m2"),
        ("attention_backend=HPC", "takes one of CPU_ATTN, HPC_ATTN"),
        ("max_num_seqs=4.5", "max_num_seqs: vLLM 0.0-test takes an integer or null here, not a number 4.5"),
        ("hf_overrides={bad", 'hf_overrides: vLLM 0.0-test takes a map here, not a string "{bad"'),
        ("enable_prefix_caching=yes", "takes a boolean or null here"),
    ],
)
def test_a_value_vllm_would_refuse_is_refused_here(flag, message):
    with pytest.raises(UsageError) as err:
        check(flag)
    assert message in str(err.value)


def test_an_int_fits_a_float_field():
    check(
        "gpu_memory_utilization=1",
        fields=replace(FIELDS, names=("gpu_memory_utilization",), kinds=(("gpu_memory_utilization", ("float",)),)),
    )


def test_the_installed_vllm_is_asked_once_and_then_read_from_the_cache(tmp_path, monkeypatch):
    """The real build: this interpreter's vLLM, asked in a subprocess (about 10 s), then cached."""
    fields = engine_fields(None, cache=tmp_path)
    assert {"kv_cache_dtype", "attention_backend", "quantization", "hf_overrides"} <= set(fields.names)
    assert "HPC_ATTN" in dict(fields.choices)["attention_backend"]
    assert "fp8" in dict(fields.choices)["kv_cache_dtype"]
    assert "port" in fields.server_only and dict(fields.kinds)["max_num_seqs"] == ("int", "null")
    asked = []
    import harness.builds.engine_fields as module

    real = module._ask
    monkeypatch.setattr(module, "_ask", lambda *a, **k: asked.append(a[2]) or real(*a, **k))
    assert engine_fields(None, cache=tmp_path) == fields
    assert asked == ["REFIT_HARNESS_IDENTITY"], "the field list must come from the cache"


def test_a_build_without_vllm_is_a_build_error_in_one_line(tmp_path):
    base = getattr(sys, "_base_executable", None) or "/usr/bin/python3"
    probe = subprocess.run([base, "-c", "import vllm"], capture_output=True)
    if probe.returncode == 0:
        pytest.skip(f"{base} has vLLM installed")
    with pytest.raises(BuildError, match="build bare: no vLLM with engine/arg_utils.py under"):
        engine_fields(BuildSpec("bare", base), cache=tmp_path)


def test_the_cli_refuses_a_bad_key_before_any_engine_starts(tmp_path):
    from harness.checkpoints.tiny import tiny_qwen3

    out = tmp_path / "out"
    proc = cli("run", "--model", str(tiny_qwen3()), "--out", str(out), "--engine-arg", "kv_cache_dtyp=fp8", timeout=300)
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("refit-harness: error:")]
    assert proc.returncode == 2 and len(errors) == 1, proc.stderr
    assert "kv_cache_dtyp: not an EngineArgs field of vLLM" in errors[0] and "closest: kv_cache_dtype" in errors[0]
    assert not (out / "arms").exists(), "no arm may start on a bad engine argument"


# --- every arm, and vllm serve ----------------------------------------------------------------

CS = CheckpointSet(a="/a", b="/b", b_control="/c", control_tensor="norm")
NEEDS = {
    "reload_weights": PathNeeds(EngineRequirements(), ("B", "B", "B_control", "A")),
    "dummy_start": PathNeeds(EngineRequirements(load_format="dummy"), ("B", "B", "B_control", "A")),
    "prefix_cache": PathNeeds(EngineRequirements(enable_prefix_caching=True), ("B", "B", "B_control", "A")),
}


def plan_with(*flags: str, paths=("reload_weights", "dummy_start", "prefix_cache")):
    engine = EngineSpec(engine_args=from_command_line(None, flags))
    return make_plan(RunSpec(model="/a", paths=paths, engine=engine), CS, NEEDS, {})


def test_engine_arguments_reach_every_arm_and_override_the_harness_defaults():
    plan = plan_with("kv_cache_dtype=fp8", "max_num_seqs=4", 'hf_overrides={"rope_theta": 1000000.0}')
    # prefix_cache's subject batches otherwise than the plain reference: it has a cold B of its shapes.
    assert {a.role for a in plan.arms} == {"reference", "noise", "shape_reference", "subject"}
    for arm in plan.arms:
        args = engine_args(arm)
        assert args["kv_cache_dtype"] == "fp8" and args["max_num_seqs"] == 4, arm.name
        assert args["hf_overrides"] == {"rope_theta": 1e6}
        assert args["worker_extension_cls"] and args["skip_tokenizer_init"] is True


def test_a_paths_own_needs_win_over_engine_arguments():
    plan = plan_with("enable_prefix_caching=false")
    by_path = {a.paths[0]: engine_args(a) for a in plan.arms if a.role == "subject"}
    assert by_path["prefix_cache"]["enable_prefix_caching"] is True  # the path exists for it
    assert by_path["reload_weights"]["enable_prefix_caching"] is False
    assert by_path["dummy_start"]["load_format"] == "dummy"


def test_a_memory_fraction_replaces_the_harness_kv_cache_bytes():
    (arm,) = [a for a in plan_with("gpu_memory_utilization=0.5").arms if a.role == "reference"]
    assert "kv_cache_memory_bytes" not in engine_args(arm) and engine_args(arm)["gpu_memory_utilization"] == 0.5
    (default,) = [a for a in plan_with().arms if a.role == "reference"]
    assert engine_args(default)["kv_cache_memory_bytes"] == EngineSpec.kv_cache_memory_bytes


def test_vllm_serve_gets_them_as_its_own_flags():
    flags = serve_flags(
        {
            "kv_cache_dtype": "fp8",
            "enable_prefix_caching": False,
            "enforce_eager": True,
            "max_num_seqs": 4,
            "hf_overrides": {"rope_theta": 1e6},
            "lora_target_modules": ["q_proj", "v_proj"],
            "quantization": None,
        }
    )
    assert flags == [
        "--kv-cache-dtype",
        "fp8",
        "--no-enable-prefix-caching",
        "--enforce-eager",
        "--max-num-seqs",
        "4",
        "--hf-overrides",
        '{"rope_theta": 1000000.0}',
        "--lora-target-modules",
        "q_proj",
        "v_proj",
    ]


def test_they_are_recorded_and_read_back(tmp_path):
    spec = RunSpec(
        model="/a", engine=EngineSpec(engine_args=encode({"kv_cache_dtype": "fp8", "hf_overrides": {"x": 1}}))
    )
    store.dump(spec, tmp_path / "spec.json", "run_spec")
    assert store.load(RunSpec, tmp_path / "spec.json", "run_spec") == spec
    assert json.loads((tmp_path / "spec.json").read_text())["data"]["engine"]["engine_args"] == [
        ["hf_overrides", '{"x": 1}'],
        ["kv_cache_dtype", '"fp8"'],
    ]
    assert shown(spec.engine.engine_args) == 'hf_overrides={"x": 1} kv_cache_dtype=fp8'
    assert EngineSpec().setting("max_model_len") == 512
    assert EngineSpec(engine_args=encode({"max_model_len": 1024})).setting("max_model_len") == 1024


def test_a_record_from_before_engine_arguments_still_loads(tmp_path):
    data = store.to_jsonable(RunSpec(model="/a"))
    del data["engine"]["engine_args"]
    (tmp_path / "old.json").write_text(json.dumps({"schema_version": store.SCHEMA_VERSION, "kind": "k", "data": data}))
    assert store.load(RunSpec, tmp_path / "old.json", "k").engine.engine_args == ()


# --- scenarios: configurations as cells, and -s honours the flags -----------------------------

KV = EngineConfig("fp8kv", encode({"kv_cache_dtype": "fp8"}))
SCENARIO = ScenarioSpec(
    name="s",
    description="",
    models=(ModelRef("m", path="/m"), ModelRef("n", path="/n")),
    paths=("reload_weights",),
    engine_configs=(EngineConfig(), KV, EngineConfig("eager-prefix", encode({"enable_prefix_caching": True}), ("n",))),
)


def test_engine_configurations_are_cell_groups_of_their_own():
    groups = {g.id: g.spec.engine.vllm_kwargs() for g in expand(SCENARIO)}
    assert groups == {
        "m-eager-tp1": {},
        "m-fp8kv-eager-tp1": {"kv_cache_dtype": "fp8"},
        "n-eager-tp1": {},
        "n-fp8kv-eager-tp1": {"kv_cache_dtype": "fp8"},
        "n-eager-prefix-eager-tp1": {"enable_prefix_caching": True},  # only the model it names
    }
    assert [g.id for g in expand(SCENARIO, only=("reload_weights[*fp8kv*",))] == [
        "m-fp8kv-eager-tp1",
        "n-fp8kv-eager-tp1",
    ]


def test_configuration_labels_are_unique():
    with pytest.raises(UsageError, match="labels must be unique"):
        expand(replace(SCENARIO, engine_configs=(KV, KV)))


def test_run_s_adds_the_command_line_engine_arguments_to_every_configuration():
    args = build_parser().parse_args(
        ["run", "-s", "s", "--engine-arg", "max_num_seqs=4", "--engine-arg", "kv_cache_dtype=fp8_e5m2"]
    )
    got = {g.id: g.spec.engine.vllm_kwargs() for g in expand(with_run_flags(SCENARIO, args))}
    assert all(v["max_num_seqs"] == 4 and v["kv_cache_dtype"] == "fp8_e5m2" for v in got.values()), got
    assert got["n-eager-prefix-eager-tp1"]["enable_prefix_caching"] is True  # the configuration's own stay
    plain = build_parser().parse_args(["run", "-s", "s"])
    assert with_run_flags(SCENARIO, plain) == SCENARIO


def test_run_s_checks_every_configuration_before_the_first_engine(tmp_path, monkeypatch):
    import scenarios

    bad = replace(
        SCENARIO,
        name="bad-config",
        engine_configs=(EngineConfig(), EngineConfig("typo", encode({"kv_cache_dtyp": "fp8"}))),
    )
    monkeypatch.setattr(scenarios.SCENARIOS, "get", lambda name: lambda: bad)
    started = []
    import harness.orchestrate.matrix as matrix

    monkeypatch.setattr(matrix, "run_group", lambda *a, **k: started.append(a) or (_ for _ in ()).throw(AssertionError))
    from harness.cli.run import run_scenario

    args = build_parser().parse_args(["run", "-s", "bad-config", "--out", str(tmp_path / "o")])
    with pytest.raises(UsageError, match="kv_cache_dtyp: not an EngineArgs field"):
        run_scenario(args, None, ())
    assert not started


def test_data_parallel_requests_are_pinned_round_robin_so_every_rank_is_observed():
    """Unpinned, vLLM's DP balancer may send every one-at-a-time request to rank 0, and a rank
    left at A would never be observed (the twin of ``http_dp_reload`` would pass)."""
    assert [data_parallel_rank_header(i, 2) for i in range(4)] == [
        {"X-data-parallel-rank": str(r)} for r in (0, 1, 0, 1)
    ]
    assert data_parallel_rank_header(3, 1) == {}  # no data parallelism: no header vLLM would refuse

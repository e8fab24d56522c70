"""``run -s`` honours every run flag (applied to all the scenario's cells) or refuses it."""

from __future__ import annotations

import pytest

from harness.cli import build_parser
from harness.cli.run import with_run_flags
from harness.errors import UsageError
from harness.spec.run import PerturbSpec
from harness.spec.scenario import ModelRef, ScenarioSpec, expand
from tests.helpers import cli

SCENARIO = ScenarioSpec(
    name="s",
    description="",
    models=(ModelRef("m", path="/m"),),
    paths=("reload_weights", "transfer_gloo", "discard_reload"),
)
TWO_MODELS = ScenarioSpec(
    name="two", description="", models=(ModelRef("a", path="/a"), ModelRef("b", path="/b")), paths=("reload_weights",)
)


def specs(*flags: str, scenario: ScenarioSpec = SCENARIO):
    args = build_parser().parse_args(["run", "-s", scenario.name, *flags])
    return [g.spec for g in expand(with_run_flags(scenario, args))]


def test_no_flag_leaves_the_scenario_as_it_is():
    (spec,) = specs()
    assert spec.paths == SCENARIO.paths and spec.engine.mode == "eager" and spec.sabotage
    assert spec.perturb == PerturbSpec() and spec.arm_timeout_s == SCENARIO.arm_timeout_s


def test_paths_narrows_the_scenario_and_keeps_its_order():
    (spec,) = specs("--paths", "discard_reload,reload_weights")
    assert spec.paths == ("reload_weights", "discard_reload")
    assert specs("--paths", "all")[0].paths == SCENARIO.paths


def test_a_path_the_scenario_does_not_run_is_refused_by_name():
    with pytest.raises(UsageError, match="--paths compiled: not a path of scenario 's'"):
        specs("--paths", "compiled")


@pytest.mark.parametrize(
    "flags, check",
    [
        (("--mode", "compiled"), lambda s: s.engine.mode == "compiled"),
        (("--dtype", "bfloat16"), lambda s: s.engine.dtype == "bfloat16"),
        (("--tp", "2"), lambda s: s.engine.tensor_parallel_size == 2),
        (("--seed", "7"), lambda s: s.perturb.seed == 7),
        (("--rebound", "fail"), lambda s: s.judge.rebound == "fail"),
        (("--arm-timeout", "33"), lambda s: s.arm_timeout_s == 33.0),
        (("--target", "/b"), lambda s: s.target == "/b"),
        (("--control-tensor", "x.weight"), lambda s: s.control.tensor == "x.weight"),
        (("--engine-core-process",), lambda s: s.engine.engine_core_process),
        (("--digest", "blake3"), lambda s: s.digest == "blake3"),
        (("--lora", "/la"), lambda s: s.lora == "/la"),
        (("--lora-target", "/lb"), lambda s: s.lora_target == "/lb"),
    ],
)
def test_each_run_flag_reaches_every_cell(flags, check):
    got = specs(*flags)
    assert got and all(check(s) for s in got), got
    assert not all(check(s) for s in specs()), "the flag's effect must not be the scenario's default"


def test_sabotage_is_turned_on_where_a_scenario_has_it_off():
    from dataclasses import replace

    off = replace(SCENARIO, sabotage=False)
    assert not specs(scenario=off)[0].sabotage and specs("--sabotage", scenario=off)[0].sabotage


@pytest.mark.parametrize("flag", ["--target", "--control-tensor", "--lora", "--lora-target"])
def test_a_per_model_flag_is_refused_for_a_scenario_of_several_models(flag):
    with pytest.raises(UsageError, match=f"{flag}: scenario 'two' has 2 models"):
        specs(flag, "x", scenario=TWO_MODELS)


def test_only_without_a_scenario_is_refused_in_one_line(tmp_path):
    proc = cli("run", "--only", "x*", "--model", str(tmp_path), "--out", str(tmp_path / "o"), timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "refit-harness: error: --only and --skip select cells of a scenario: give -s SCENARIO"
    ]


def test_list_counts_the_cells_the_report_shows_one_per_trainer_step():
    from harness.cli.listing import verdict_cells
    from scenarios import SCENARIOS

    group = expand(SCENARIOS.get("default")())[0]  # the layerwise group, which has the trainer paths
    cells = verdict_cells(group)
    steps = group.spec.trainer.steps
    assert len(cells) == len(group.spec.paths) + 2 * (steps - 1)  # trainer_steps and trainer_steps_gloo
    assert f"trainer_steps@T{steps}[{group.id}]" in cells and f"trainer_steps[{group.id}]" not in cells


def test_list_of_one_scenario_prints_the_names_only_selects():
    proc = cli("list", "-s", "smoke", timeout=120)
    assert proc.returncode == 0, proc.stderr
    cells = proc.stdout.split()
    assert cells == ["reload_weights[tiny-qwen3-eager-tp1]", "transfer_gloo[tiny-qwen3-eager-tp1]"]
    proc = cli("list", "-s", "no-such", timeout=120)
    assert proc.returncode == 2 and "Available:" in proc.stderr and "smoke" in proc.stderr

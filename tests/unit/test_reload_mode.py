"""vLLM's reload mode (``VLLM_RELOAD_MODE``, 0.34+) as a run axis: recorded, keyed, applied to
every vLLM process of an arm, a scope of known issues, and declined by a vLLM without it."""

from __future__ import annotations

import pytest

from harness.cli import build_parser
from harness.cli.run import with_run_flags
from harness.errors import UsageError
from harness.spec.engine_config import RELOAD_MODE_ENV
from harness.spec.known_issues import KnownIssue, Subject
from harness.spec.run import EngineSpec
from harness.spec.scenario import expand
from scenarios.default import DIRECT_PATHS, default


def test_only_a_non_default_mode_reaches_vllms_environment():
    assert EngineSpec().reload_env() == {}
    assert EngineSpec(reload_mode="direct").reload_env() == {RELOAD_MODE_ENV: "direct"}


def test_the_default_scenario_runs_the_reload_paths_again_in_direct_mode():
    groups = {g.id: g for g in expand(default())}
    direct = groups["tiny-qwen3-direct-eager-tp1"]
    assert direct.spec.paths == DIRECT_PATHS and direct.spec.engine.reload_mode == "direct"
    assert direct.spec.sabotage  # each direct cell has its twin
    assert groups["tiny-qwen3-eager-tp1"].spec.engine.reload_mode == "layerwise"


def _args(*flags):
    return build_parser().parse_args(["run", "-s", "default", *flags])


def test_reload_mode_flag_keeps_the_scenarios_configurations_of_that_mode():
    kept = with_run_flags(default(), _args("--reload-mode", "direct"))
    assert [c.reload_mode for c in kept.engine_configs] == ["direct"]
    assert {g.spec.engine.reload_mode for g in expand(kept)} == {"direct"}


def test_a_mode_the_scenario_lacks_is_a_usage_error():
    from dataclasses import replace

    layerwise_only = replace(default(), engine_configs=default().engine_configs[:1])
    with pytest.raises(UsageError, match="has only layerwise"):
        with_run_flags(layerwise_only, _args("--reload-mode", "direct"))


def test_an_unknown_mode_is_refused_by_the_parser():
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["run", "--reload-mode", "eager"])
    assert exc.value.code == 2


def test_a_known_issue_can_be_scoped_to_a_reload_mode():
    issue = KnownIssue(device="cpu", reason="r", vllm=(">=0.34",), reload_modes=("direct",))
    assert issue.applies("reload_weights", Subject("cpu", "0.34.0", None, reload_mode="direct"))
    assert not issue.applies("reload_weights", Subject("cpu", "0.34.0", None, reload_mode="layerwise"))
    assert not issue.applies("reload_weights", Subject("cpu", "0.34.0", None))  # the default mode is layerwise

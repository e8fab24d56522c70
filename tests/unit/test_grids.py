"""Grids for the docs come from records, and say where they came from."""

from __future__ import annotations

import json

import pytest

from harness.errors import UsageError
from harness.report.grids import scenario_grid


def test_a_grid_is_made_from_the_scenario_records_with_its_provenance(tmp_path):
    grid = {
        "llama-eager-tp1-bf16": {"reload_weights": "PASS", "prefix_cache": "XFAIL"},
        "mamba2-eager-tp1-bf16": {"reload_weights": "FAIL"},
    }
    (tmp_path / "summary.json").write_text(json.dumps({"scenario": "zoo", "grid": grid}))
    (tmp_path / "llama-eager-tp1-bf16").mkdir()
    env = {"vllm": "0.32.0", "cpu_capabilities": "avx512_bf16 amx_bf16", "git_sha": "abc1234", "started": "T"}
    (tmp_path / "llama-eager-tp1-bf16" / "summary.json").write_text(json.dumps({"environment": env}))
    text = scenario_grid(tmp_path)
    assert "Scenario `zoo`: 2 groups × 2 paths" in text
    assert "vllm `0.32.0`" in text and "cpu_capabilities `avx512_bf16 amx_bf16`" in text and "`abc1234`" in text
    assert "| mamba2\\-eager\\-tp1\\-bf16 | ❌ FAIL | — |" in text or "| mamba2-eager-tp1-bf16 | ❌ FAIL | — |" in text
    assert "Totals: ❌ FAIL 1, ✅ PASS 1, 🔕 XFAIL 1" in text


def test_a_directory_that_is_not_a_scenario_run_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="no summary.json"):
        scenario_grid(tmp_path)
    (tmp_path / "summary.json").write_text(json.dumps({"paths": {}}))
    with pytest.raises(UsageError, match="has no grid"):
        scenario_grid(tmp_path)

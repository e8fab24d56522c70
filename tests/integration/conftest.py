"""Runs shared by several integration modules (each made once per session by run_oracle)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def fixed_twin_runs(run_oracle):
    """The cold-start-copy fixture (STALE fp32 norm copies) and its fixed twin, with exactly the
    names and arguments test_oracle_reload uses, so the session runs each once."""
    from tests.integration.test_oracle_reload import WEIGHT_CHANGING, model

    base = run_oracle("stale", "--model", model("StaleQKNormQwen3ForCausalLM"), "--paths",
                      ",".join(WEIGHT_CHANGING + ("reload_kernel_format",)))
    arch = "InPlaceQKNormQwen3ForCausalLM"
    pr = run_oracle(arch, "--model", model(arch), "--rebound", "fail",
                    "--control-tensor", "model.layers.0.self_attn.q_proj.weight")
    return base, pr

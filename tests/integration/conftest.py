"""``run_oracle``, the session's real CLI runs by name, runs shared by several integration
modules (each made once per session by run_oracle), and the zygote pool every run of a pytest
process forks its arms from."""

from __future__ import annotations

import pytest

from harness.orchestrate.forking import zygote_pool
from tests.helpers import OracleRun, run_cli


@pytest.fixture(scope="session", autouse=True)
def shared_zygotes():
    """One zygote pool per pytest process: the suite's CLI runs (about 50) fork their arms from
    warm zygotes instead of each preloading two (14.5 s of a core each on the AVX2 EPYC)."""
    with zygote_pool() as pool:
        yield pool


@pytest.fixture(scope="session")
def run_oracle(tmp_path_factory: pytest.TempPathFactory):
    """``run_oracle(name, *cli_args)``: run ``refit-harness run`` for real, once per name. Two
    tests sharing a name must ask for the same run: which one comes first would otherwise
    decide what the other one checks."""
    cache: dict[str, tuple[tuple, OracleRun]] = {}

    def _run(name: str, *args: str, extra_env: dict[str, str] | None = None) -> OracleRun:
        asked = (args, tuple(sorted((extra_env or {}).items())))
        if name not in cache:
            cache[name] = asked, run_cli(["run", *args], tmp_path_factory.mktemp(name), extra_env)
        if cache[name][0] != asked:
            raise ValueError(f"run_oracle({name!r}) asked for {asked} after {cache[name][0]}")
        return cache[name][1]

    return _run


@pytest.fixture(scope="session")
def fixed_twin_runs(run_oracle):
    """The cold-start-copy fixture (STALE fp32 norm copies) and its fixed twin, with exactly the
    names and arguments test_oracle_reload uses, so the session runs each once."""
    from tests.integration.test_oracle_reload import WEIGHT_CHANGING, model

    base = run_oracle(
        "stale",
        "--model",
        model("StaleQKNormQwen3ForCausalLM"),
        "--paths",
        ",".join(WEIGHT_CHANGING + ("reload_kernel_format",)),
    )
    arch = "InPlaceQKNormQwen3ForCausalLM"
    pr = run_oracle(
        arch, "--model", model(arch), "--rebound", "fail", "--control-tensor", "model.layers.0.self_attn.q_proj.weight"
    )
    return base, pr

"""fp8 KV cache with checkpoint KV scales on real engines: the numbers vLLM's attention reads
(``_k_scale_float``, ``_v_scale_float``) are in the census and judged like tensors.

- The planted fixture (``StaleKVScaleFloatQwen3ForCausalLM``) keeps the floats of its cold start
  after a reload while every scale tensor is refreshed: it must FAIL, naming the floats STALE.
- Its fixed twin is the zoo family ``qwen3-fp8kv`` itself (vLLM takes the floats again on every
  load): PASS, with the floats judged OK, not UNJUDGEABLE (B moves every scale).

Both run ``reload_weights`` only, with ``--engine-arg kv_cache_dtype=fp8``: three engines each.
vLLM's CPU attention runs an fp8 KV cache only with AVX-512 or AMX; elsewhere (an AVX2 CPU, or
``REFIT_HARNESS_CPU_ISA=avx2``) both are SKIPPED in vLLM's words.
"""

from __future__ import annotations

import pytest

from harness.cpu_isa import host_capabilities, override_from_env

pytestmark = [pytest.mark.cpu]

FLOATS = ("_k_scale_float", "_v_scale_float")
# ``_get_attn_isa`` in vLLM's cpu_attn.py raises without either (measured on 0.32)
FP8_KV_RUNS = bool({"avx512_f", "amx_tile"} & set(host_capabilities(override_from_env()).flags))


def _model(family: str) -> str:
    from harness.checkpoints.zoo import tiny_model

    return str(tiny_model(family))


@pytest.fixture(scope="module")
def stale(run_oracle):
    return run_oracle(
        "kv-stale-float", "--model", _model("qwen3-fp8kv-stale-float"), "--engine-arg", "kv_cache_dtype=fp8"
    )


@pytest.fixture(scope="module")
def fixed(run_oracle):
    return run_oracle("kv-fp8-family", "--model", _model("qwen3-fp8kv"), "--engine-arg", "kv_cache_dtype=fp8")


def _refit_numbers(run):
    tensors = run.csv("tensors.csv")
    rows = tensors[(tensors["check"] == "refit") & (tensors["path"] == "reload_weights")]
    return rows[rows["tensor"].str.endswith(FLOATS)]


def refused_here(run) -> bool:
    """Whether this CPU cannot run an fp8 KV cache; if so, the run must say so in vLLM's words."""
    if FP8_KV_RUNS:
        return False
    path = run.summary["paths"]["reload_weights"]
    assert run.exit_code == 0 and path["verdict"] == "SKIPPED", (path, run.output[-3000:])
    assert any("FP8 KV cache on CPU requires x86 with AVX-512 or AMX" in r for r in path["reasons"]), path
    return True


def test_the_stale_float_fixture_fails_naming_the_floats(stale):
    if refused_here(stale):
        return
    path = stale.summary["paths"]["reload_weights"]
    assert stale.exit_code == 1 and path["verdict"] == "FAIL", (path, stale.output[-3000:])
    numbers = _refit_numbers(stale)
    assert len(numbers) == 4 and set(numbers["status"]) == {"STALE"}, numbers.to_string()
    assert set(numbers["kind"]) == {"number"}
    assert path["first_divergent_tensor"].split(" ")[0].endswith(FLOATS), path
    # The tensors the floats came from were refreshed: only the numbers show the bug.
    tensors = stale.csv("tensors.csv")
    scales = tensors[
        (tensors["check"] == "refit")
        & (tensors["path"] == "reload_weights")
        & tensors["tensor"].str.endswith(("._k_scale", "._v_scale"))
    ]
    assert len(scales) and set(scales["status"]) == {"OK"}, scales.to_string()


def test_its_fixed_twin_passes_with_the_floats_judged(fixed):
    if refused_here(fixed):
        return
    path = fixed.summary["paths"]["reload_weights"]
    assert fixed.exit_code == 0 and path["verdict"] == "PASS", (path, fixed.output[-3000:])
    numbers = _refit_numbers(fixed)
    assert len(numbers) == 4 and set(numbers["status"]) == {"OK"}, numbers.to_string()
    assert fixed.summary["environment"]["engine_args"] == {"kv_cache_dtype": "fp8"}
    from harness.report.markdown import md_text  # the PR comment escapes markdown (its underscores)

    assert md_text("engine arguments: kv_cache_dtype=fp8") in (fixed.out / "summary.md").read_text()

"""The refit calls RL frameworks make (issue 21), on a real CPU engine: an adapter reloaded in
place (lora_inplace) and the raw model.load_weights of colocated trainers (raw_load_weights)."""

from __future__ import annotations

import pytest

from harness.checkpoints.tiny import tiny_qwen3

pytestmark = [pytest.mark.cpu]


@pytest.fixture(scope="module")
def lora(run_oracle):
    """Stock tiny Qwen3 in bf16, prefix caching off (the run's default), the harness's own adapter."""
    return run_oracle(
        "lora", "--model", str(tiny_qwen3()), "--dtype", "bfloat16", "--paths", "lora_inplace", "--sabotage"
    )


@pytest.fixture(scope="module")
def plain_raw(run_oracle):
    """The raw load_weights where the CPU lets it run: linear and lm_head weights kept in Parameters."""
    model = str(tiny_qwen3(architecture="PlainGemmQwen3ForCausalLM"))
    return run_oracle("plain_raw", "--model", model, "--dtype", "bfloat16", "--paths", "raw_load_weights", "--sabotage")


def test_lora_inplace_passes_with_its_control_seen_in_the_lora_buffers(lora):
    assert lora.exit_code == 0, lora.output
    p = lora.summary["paths"]["lora_inplace"]
    assert p["verdict"] == "PASS", p["reasons"]
    control = p["positive_control"]
    assert control["detected"] and control["tokens_moved"], control
    assert control["localized_to"], control
    assert all(".lora_a_stacked" in n or ".lora_b_stacked" in n for n in control["localized_to"]), control
    arms = {a["arm"]: a["status"] for a in lora.summary["arms"]}
    assert arms == {"reference-lora-adapter": "ok", "noise-lora-adapter": "ok", "subject-lora_inplace": "ok"}, arms
    refit = lora.csv("tensors.csv")
    refit = refit[(refit["check"] == "refit") & (refit["path"] == "lora_inplace")]
    # The adapted layers' buffers (the embedding's and lm_head's, which the adapter does not target,
    # stay zero in A and B: UNJUDGEABLE).
    stacked = refit[refit["tensor"].str.contains(r"_proj\.lora_[ab]_stacked")]
    assert len(stacked) == 28 and set(stacked["status"]) == {"OK"}, stacked
    # The base weights are the same before and after an adapter refit: never OK, at most UNJUDGEABLE.
    assert set(refit["status"]) <= {"OK", "UNJUDGEABLE", "NOISY", "REBOUND"}, set(refit["status"])


def test_lora_inplace_catches_the_request_without_load_inplace(lora):
    so = lora.summary["paths"]["lora_inplace"]["sabotage"]
    assert so["twin_verdict"] == "FAIL" and so["caught"], so
    twin = lora.csv("tensors.csv")
    twin = twin[(twin["check"] == "refit") & (twin["path"] == "lora_inplace~sabotage")]
    assert set(twin[twin["tensor"].str.contains(r"_proj\.lora_[ab]_stacked")]["status"]) == {"STALE"}, twin


def test_raw_load_weights_runs_where_the_cpu_keeps_weights_in_parameters(plain_raw):
    assert plain_raw.exit_code == 0, plain_raw.output
    p = plain_raw.summary["paths"]["raw_load_weights"]
    assert p["verdict"] == "PASS", p["reasons"]
    assert p["positive_control"]["detected"]
    so = p["sabotage"]
    assert so["twin_verdict"] == "FAIL" and so["caught"], so

"""Derived state that vLLM 0.34's rerun of every module's post-load hook cannot reach, on a real
engine: a float32 copy made on the first forward (no hook at all). It must FAIL on every vLLM,
named STALE, and reproduce through its ``repro.py``; its fixed twin must PASS, earned. The other
fixtures of the class (``scenarios/reload_lifecycle.py``) run as a scenario on each build."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.integration.test_oracle_reload import model

pytestmark = [pytest.mark.cpu]


@pytest.fixture(scope="module")
def lazy(run_oracle):
    return run_oracle(
        "lazy-copy", "--model", model("LazyCopyQwen3ForCausalLM"), "--paths", "reload_weights", "--sabotage"
    )


def test_a_copy_made_on_the_first_forward_is_named_stale(lazy):
    assert lazy.exit_code == 1, lazy.output
    p = lazy.summary["paths"]["reload_weights"]
    assert p["verdict"] == "FAIL", p["reasons"]
    # Observed at the same point of the engine's life on both sides (after a forward), the
    # warm engine's copy equals cold A's: STALE, not EXTRA or CORRUPT.
    assert "self_attn.q_norm" in p["first_divergent_kernel_input"]
    assert "weight_lazy (STALE)" in p["first_divergent_kernel_input"]
    assert p["first_divergent_tensor"] == "model.layers.0.self_attn.q_norm.weight_lazy (STALE, refit)"
    assert p["sabotage"]["caught"], p["sabotage"]


def test_its_repro_follows_the_arms_sequence_and_reproduces(lazy):
    """The repro generates on A before it refits, as the arm does; refitting before any forward
    would make the copy from B and say 'not reproduced'."""
    script = lazy.out / "repro.py"
    text = script.read_text()
    assert text.index("greedy(llm)  # on A first") < text.index('collective_rpc("reload_weights"')
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "prompt(s) differ" in proc.stdout


def test_the_fixed_twin_passes_earned(run_oracle):
    run = run_oracle(
        "lazy-refresh", "--model", model("LazyRefreshQwen3ForCausalLM"), "--paths", "reload_weights", "--sabotage"
    )
    assert run.exit_code == 0, run.output
    p = run.summary["paths"]["reload_weights"]
    assert p["verdict"] == "PASS", p["reasons"]
    assert p["sabotage"]["caught"], p["sabotage"]

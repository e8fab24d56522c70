"""The oracle on a real vLLM engine (CPU build): stock Qwen3, a planted stale-copy bug,
its fixed twin, and a bug model the harness has never seen."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness import checkpoints

pytestmark = [pytest.mark.cpu]
REPO = Path(__file__).resolve().parents[2]


def model(architecture: str | None = None) -> str:
    return str(checkpoints.tiny_qwen3(architecture=architecture))


def stale_rows(run, tensor_suffix: str):
    t = run.csv("tensors.csv")
    return t[(t["path"] == "reload_weights") & (t["check"] == "refit") & (t["status"] == "STALE")
             & t["tensor"].str.endswith(tensor_suffix)]


def test_stock_qwen3_passes_with_control_detected(run_oracle):
    run = run_oracle("stock", "--model", model(), "--paths", "reload_weights")
    assert run.exit_code == 0, run.output
    p = run.summary["paths"]["reload_weights"]
    assert p["verdict"] == "PASS", p["reasons"]
    assert p["positive_control"]["detected"] and p["positive_control"]["tokens_moved"]
    assert "model.layers.0.self_attn.qkv_proj.<kernel-output>" in p["positive_control"]["localized_to"]
    t = run.csv("tensors.csv")
    assert set(t[t["check"] == "refit"]["status"]) <= {"OK", "REBOUND"}
    tokens = run.csv("tokens.csv")
    assert tokens[tokens["check"] == "refit"]["first_divergence"].isna().all()
    for name in ("index.html", "summary.md", "summary.json"):
        assert (run.out / name).stat().st_size > 0


def test_cold_start_copy_is_stale_and_fails(run_oracle):
    run = run_oracle("stale", "--model", model("StaleQKNormQwen3ForCausalLM"))
    assert run.exit_code == 1, run.output
    p = run.summary["paths"]["reload_weights"]
    assert p["verdict"] == "FAIL"
    assert p["first_divergent_tensor"].startswith("model.layers.0.self_attn.q_norm.weight_fp32 (STALE")
    assert len(stale_rows(run, "norm.weight_fp32")) == 4  # q and k norm copies of both layers
    assert p["positive_control"]["detected"]
    tokens = run.csv("tokens.csv")
    assert tokens[tokens["check"] == "refit"]["first_divergence"].notna().any()


def test_fixed_twin_passes(run_oracle):
    run = run_oracle("fixed", "--model", model("FixedQKNormQwen3ForCausalLM"))
    assert run.exit_code == 0, run.output
    assert run.summary["paths"]["reload_weights"]["verdict"] == "PASS"


def test_unseen_model_with_hidden_copy_fails(run_oracle):
    env = {"REFIT_HARNESS_MODELS": "HiddenFinalNormCopyQwen3=tests.integration.unseen_models:HiddenFinalNormCopyQwen3",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    run = run_oracle("unseen", "--model", model("HiddenFinalNormCopyQwen3"), extra_env=env)
    assert run.exit_code == 1, run.output
    assert len(stale_rows(run, "model.norm._frozen[0]")) == 1
    assert run.summary["paths"]["reload_weights"]["verdict"] == "FAIL"


def test_report_rerenders_from_disk_alone(run_oracle, tmp_path):
    import shutil
    import subprocess
    import sys

    run = run_oracle("stale", "--model", model("StaleQKNormQwen3ForCausalLM"))
    copy = tmp_path / "copy"
    shutil.copytree(run.out, copy)
    for f in ("index.html", "summary.json", "tensors.csv"):
        (copy / f).unlink()
    # No vLLM in this process: report rendering must not import it.
    code = ("import sys, builtins; real = builtins.__import__\n"
            "def guard(name, *a, **k):\n"
            "    if name == 'vllm' or name.startswith('vllm.'): raise ImportError('vllm imported during report')\n"
            "    return real(name, *a, **k)\n"
            "builtins.__import__ = guard\n"
            "from harness.cli import main; sys.exit(main(['report', sys.argv[1]]))")
    proc = subprocess.run([sys.executable, "-c", code, str(copy)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert (copy / "summary.json").read_text() == (run.out / "summary.json").read_text()

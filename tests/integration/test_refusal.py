"""A model vLLM's backend will not run here is SKIPPED with vLLM's own reason; an error
worded the same way but raised by code that is not vLLM's stays an ERROR.

Measured on vLLM 0.32 CPU: a Qwen3 with head_dim 16 fails its cold start with
"RuntimeError: Unsupported CPU attention configuration: head_dim=16 ...".
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from harness.checkpoints.tiny import TINY_QWEN3, tiny_qwen3
from tests.helpers import cli

pytestmark = [pytest.mark.cpu]


def _head_dim_16(dest: Path) -> Path:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(**{**TINY_QWEN3, "head_dim": 16, "num_attention_heads": 8, "num_key_value_heads": 4})
    Qwen3ForCausalLM(config).eval().save_pretrained(str(dest), safe_serialization=True)
    return dest


def _run(model: Path | str, out: Path, env: dict | None = None) -> tuple[subprocess.CompletedProcess, dict]:
    proc = cli("run", "--model", str(model), "--out", str(out), "--paths", "reload_weights", env=env, timeout=900)
    return proc, json.loads((out / "summary.json").read_text())["paths"]["reload_weights"]


def test_an_engine_vllm_refuses_is_skipped_with_its_reason(tmp_path):
    proc, path = _run(_head_dim_16(tmp_path / "hd16"), tmp_path / "out")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert path["verdict"] == "SKIPPED", path
    reason = path["reasons"][0]
    assert reason.startswith(
        "vLLM cannot start this engine here: RuntimeError: Unsupported CPU attention configuration: head_dim=16"
    ), reason


def test_a_refusal_raised_outside_vllm_stays_an_error(tmp_path):
    import os

    env = dict(os.environ, REFIT_HARNESS_PLANTED_FAULT="unsupported:1")  # the cold start's own load
    model = tiny_qwen3(architecture="FaultyReloadQwen3ForCausalLM")
    proc, path = _run(model, tmp_path / "out", env)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert path["verdict"] == "ERROR", path
    assert any("planted fault: this configuration is not supported" in r for r in path["reasons"]), path

"""The HTML report as a person sees it: rendered by real headless Chromium."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

import pytest

from harness import checkpoints

CHROMIUM = shutil.which("chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def need_chromium() -> None:
    """Skip where there is no browser, except under CI, where a report never rendered must fail the run."""
    if CHROMIUM is not None:
        return
    if os.environ.get("CI"):
        pytest.fail("Debian chromium is not installed, and CI must render the report (make browser)")
    pytest.skip("Debian chromium is not installed (make browser)")


def chromium(*args: str) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args],
                              capture_output=True, text=True, timeout=120)


@pytest.mark.cpu
def test_failing_report_renders_its_verdict_and_first_divergent_kernel_input(run_oracle, tmp_path):
    need_chromium()
    run = run_oracle("registry", "--model", str(checkpoints.tiny_qwen3(architecture="RegistryQKNormQwen3ForCausalLM")))
    page = (run.out / "index.html").resolve().as_uri()
    dom = chromium("--dump-dom", page).stdout
    verdicts = dom[dom.index("id=\"verdicts\""):dom.index("id=\"first-divergence\"")]
    assert "reload_weights" in verdicts and "FAIL" in verdicts
    first = dom[dom.index("id=\"first-divergence\""):dom.index("id=\"positive-control\"")]
    assert "unregistered@model.layers.0.self_attn.q_norm" in first and "STALE" in first
    for section in ("positive-control", "noise-floor", "tensors", "consumed", "hooks", "tokens", "arms", "environment"):
        assert f'id="{section}"' in dom
    shot = tmp_path / "report.png"
    chromium("--window-size=1280,1600", f"--screenshot={shot}", page)
    assert shot.stat().st_size > 20_000  # a rendered page, not a blank one

"""The HTML report as a person sees it: rendered by real headless Chromium."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from harness.checkpoints.tiny import tiny_qwen3

CHROMIUM = shutil.which("chromium")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def need_chromium() -> None:
    """Skip where there is no browser, except under CI, where a report never rendered must fail the run."""
    if CHROMIUM is not None:
        return
    if os.environ.get("CI"):
        pytest.fail("Debian chromium is not installed, and CI must render the report (make browser)")
    pytest.skip("Debian chromium is not installed (make browser)")


def chromium(*args: str) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run(
            [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args], capture_output=True, text=True, timeout=120
        )


@pytest.mark.cpu
def test_failing_report_renders_its_verdict_and_first_divergent_kernel_input(run_oracle, tmp_path):
    need_chromium()
    run = run_oracle("registry", "--model", str(tiny_qwen3(architecture="RegistryQKNormQwen3ForCausalLM")))
    page = (run.out / "index.html").resolve().as_uri()
    dom = chromium("--dump-dom", page).stdout
    verdicts = dom[dom.index('id="verdicts"') : dom.index('id="first-divergence"')]
    assert "reload_weights" in verdicts and "FAIL" in verdicts
    first = dom[dom.index('id="first-divergence"') : dom.index('id="positive-control"')]
    assert "unregistered@model.layers.0.self_attn.q_norm" in first and "STALE" in first
    for section in ("positive-control", "noise-floor", "tensors", "consumed", "hooks", "tokens", "arms", "environment"):
        assert f'id="{section}"' in dom
    shot = tmp_path / "report.png"
    chromium("--window-size=1280,1600", f"--screenshot={shot}", page)
    assert shot.stat().st_size > 20_000  # a rendered page, not a blank one


@pytest.mark.cpu
@pytest.mark.skipif(CHROMIUM is None, reason="Debian chromium is not installed (make browser)")
def test_comparison_page_renders_its_grid_and_plots(fixed_twin_runs, tmp_path):
    import json
    import sys

    base, pr = fixed_twin_runs
    out = tmp_path / "compare"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness.cli",
            "compare",
            str(base.out),
            str(pr.out),
            "--expect",
            "base=FAIL",
            "--expect",
            "pr=PASS",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    page = (out / "index.html").resolve().as_uri()
    dom = chromium("--dump-dom", page).stdout
    grid = dom[dom.index('id="grid"') : dom.index('id="deciding"')]
    row = grid[grid.index('data-cell="reload_weights"') :]
    row = row[: row.index("</tr>")]
    assert row.index(">FAIL<") < row.index(">PASS<")  # base column, then pr
    deciding = dom[dom.index('id="deciding"') : dom.index('id="tokens"')]
    assert "q_norm.weight_fp32" in deciding and "STALE" in deciding
    for plot in ("plot-layers", "plot-divergence", "plot-timings"):
        svg = dom[dom.index(f'id="{plot}"') :]
        svg = svg[: svg.index("</svg>")]
        assert "<rect" in svg or "<circle" in svg or "<text" in svg, plot
    timings = dom[dom.index('id="plot-timings"') :]
    rows = json.loads((out / "comparison.json").read_text())["timings"]
    marks = sum(r[k] is not None for r in rows for k in ("base_seconds", "pr_seconds", "base2_seconds"))
    assert timings[: timings.index("</svg>")].count("<circle") == marks > len(rows)  # one mark per build and arm
    shot = tmp_path / "comparison.png"
    chromium("--window-size=1280,2000", f"--screenshot={shot}", page)
    assert shot.stat().st_size > 20_000
    keep = os.environ.get("REFIT_HARNESS_SCREENSHOTS")
    if keep:  # CI keeps the picture beside its other artifacts
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(keep) / "comparison.png")

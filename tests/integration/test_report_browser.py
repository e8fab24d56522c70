"""The HTML reports as a person sees them: rendered by real headless Chromium at 1280 px.

A copy of each page gets a small script that measures it in the browser (the pages
themselves carry no scripts) and writes the measurements into its title, which
``--dump-dom`` returns. Screenshots go to ``$REFIT_HARNESS_SCREENSHOTS`` (CI artifacts)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from harness.checkpoints.tiny import tiny_qwen3
from harness.settings import SCREENSHOTS_ENV
from tests.helpers import cli

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
WIDTH = 1280
# In the browser: does the page fit the window? How many lines does each verdict row's
# deciding text take? Is each FAIL's first divergence visible without expanding anything?
MEASURE = """<script>
window.addEventListener('load', function () {
  function lines(cell) {
    var node = Array.from(cell.childNodes).find(function (n) { return n.nodeType === 3 && n.textContent.trim(); });
    if (!node) return 0;
    var r = document.createRange(); r.selectNodeContents(node);
    var tops = new Set(Array.from(r.getClientRects()).map(function (x) { return Math.round(x.top); }));
    return tops.size;
  }
  function visible(el) {
    for (var p = el; p; p = p.parentElement) { if (p.tagName === 'DETAILS' && !p.open && p !== el) return false; }
    var b = el.getBoundingClientRect(); return b.width > 0 && b.height > 0;
  }
  var rows = Array.from(document.querySelectorAll('table.verdicts tbody tr')).map(function (tr) {
    var first = tr.querySelector('.first-divergence');
    return {id: tr.id, verdict: tr.className, lines: lines(tr.querySelector('td.headline')),
            first: first ? first.textContent : null, first_visible: first ? visible(first) : null};
  });
  document.title = JSON.stringify({scroll_width: document.documentElement.scrollWidth,
                                   window_width: window.innerWidth, rows: rows});
});
</script></body>"""


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


def measure(page: Path) -> dict:
    """Measurements of ``page`` at 1280 px, taken in Chromium (see ``MEASURE``)."""
    probe = page.with_name(page.stem + ".measure.html")
    probe.write_text(page.read_text().replace("</body>", MEASURE, 1))
    try:
        dom = chromium(f"--window-size={WIDTH},1000", "--virtual-time-budget=2000", "--dump-dom", probe.as_uri()).stdout
    finally:
        probe.unlink()
    title = re.search(r"<title>(.*?)</title>", dom, re.S)
    assert title, dom[:500]
    import html

    return json.loads(html.unescape(title.group(1)))


def screenshot(page: Path, name: str, tmp_path: Path) -> Path:
    shot = tmp_path / f"{name}.png"
    chromium(f"--window-size={WIDTH},1600", f"--screenshot={shot}", page.as_uri())
    assert shot.stat().st_size > 20_000  # a rendered page, not a blank one
    keep = os.environ.get(SCREENSHOTS_ENV)
    if keep:  # CI keeps the picture beside its other artifacts
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(keep) / shot.name)
    return shot


@pytest.mark.cpu
def test_a_fail_shows_its_first_divergence_on_top_without_expanding_anything(run_oracle, tmp_path):
    need_chromium()
    run = run_oracle("registry", "--model", str(tiny_qwen3(architecture="RegistryQKNormQwen3ForCausalLM")))
    page = (run.out / "index.html").resolve()
    seen = measure(page)
    assert seen["scroll_width"] <= seen["window_width"] == WIDTH, seen  # no horizontal scrolling
    (row,) = [r for r in seen["rows"] if r["id"] == "verdict-reload_weights"]
    assert row["verdict"] == "FAIL" and row["first_visible"], row
    assert "unregistered@model.layers.0.self_attn.q_norm" in row["first"] and "STALE" in row["first"], row
    dom = chromium("--dump-dom", page.as_uri()).stdout
    for section in ("positive-control", "noise-floor", "tensors", "consumed", "hooks", "tokens", "arms", "environment"):
        assert f'id="{section}"' in dom
    screenshot(page, "run-fail", tmp_path)


@pytest.mark.cpu
def test_a_pass_row_is_one_line_and_the_reported_facts_are_folded(fixed_twin_runs, tmp_path):
    need_chromium()
    _, fixed = fixed_twin_runs
    page = (fixed.out / "index.html").resolve()
    seen = measure(page)
    assert seen["scroll_width"] <= WIDTH, seen
    passing = [r for r in seen["rows"] if r["verdict"] == "PASS"]
    assert passing and all(r["lines"] == 1 for r in passing), seen["rows"]
    summary = json.loads((fixed.out / "summary.json").read_text())["paths"]
    assert any(p["notes"] for p in summary.values())  # there were facts to fold away
    html_text = page.read_text()
    for p in summary.values():
        for note in p["notes"]:
            assert html_text.index(note.split(" (first")[0][:40].replace("'", "&#39;")) > html_text.index("<details")
    screenshot(page, "run-pass", tmp_path)


def test_the_scenario_grid_fits_a_1280_pixel_window(tmp_path):
    """Eleven families x the ten CPU paths, with the zoo's longest group ids: no horizontal
    scrolling. Built from a synthetic summary: the layout, not a run, is under test."""
    need_chromium()
    from harness.report.matrix import write_matrix
    from scenarios.default import CPU_PATHS

    groups = [
        f"{f}-eager-tp1-bf16"
        for f in (
            "granitemoe-hybrid",
            "deepseek-v2",
            "nemotron-h",
            "qwen3-moe",
            "mixtral",
            "mamba2",
            "gemma3",
            "phi3",
            "qwen2",
            "qwen3",
            "llama",
        )
    ]
    verdicts = ("PASS", "XFAIL", "SKIPPED", "FAIL", "INCONCLUSIVE")
    grid = {g: {p: verdicts[(i + j) % 5] for j, p in enumerate(CPU_PATHS)} for i, g in enumerate(groups)}
    cells = {
        f"{p}[{g}]": {
            "group": g,
            "path": p,
            "builds": {"": v},
            "links": {"": f"{g}/index.html"},
            "verdict": v,
            "reasons": [],
            "headline": f"{v}: first divergent tensor: model.layers.0.mlp.experts.w13_weight",
        }
        for g, row in grid.items()
        for p, v in row.items()
    }
    summary = {
        "scenario": "zoo",
        "exit_code": 1,
        "builds": [],
        "cells": cells,
        "grid": grid,
        "groups": {g: f"{g}/index.html" for g in groups},
        "control_tensors": {},
        "comparisons": {},
    }
    page = write_matrix(tmp_path, summary).resolve()
    seen = measure(page)
    assert seen["scroll_width"] <= WIDTH, seen
    screenshot(page, "scenario-grid", tmp_path)


@pytest.mark.cpu
@pytest.mark.skipif(CHROMIUM is None, reason="Debian chromium is not installed (make browser)")
def test_comparison_page_renders_its_grid_and_plots(fixed_twin_runs, tmp_path):
    base, pr = fixed_twin_runs
    out = tmp_path / "compare"
    proc = cli(
        "compare",
        str(base.out),
        str(pr.out),
        "--allow-model-mismatch",
        "--expect",
        "base=FAIL",
        "--expect",
        "pr=PASS",
        "--out",
        str(out),
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    page = (out / "index.html").resolve()
    dom = chromium("--dump-dom", page.as_uri()).stdout
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
    screenshot(page, "comparison", tmp_path)

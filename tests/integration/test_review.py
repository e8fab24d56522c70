"""``refit-harness review`` on real engines: a PR-shaped diff that re-injects a known vLLM bug
(the regressions corpus's prefix-cache reset, vLLM #12284) beside tests, docs, C++ and files this
release lacks. The review tests the part that applies, lists the rest with reasons, and its
verdicts are earned: base PASS (twin caught), pr FAIL, base2 as the floor."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import cli

pytestmark = [pytest.mark.cpu]
DIFF = Path(__file__).resolve().parents[1] / "data" / "review" / "pr-shaped.diff"


def test_a_review_of_a_diff_reinjecting_a_known_bug_tells_base_from_pr(tmp_path):
    out = tmp_path / "review"
    proc = cli(
        "review",
        str(DIFF),
        "--paths",
        "prefix_cache",
        "--expect",
        "base=PASS",
        "--expect",
        "pr=FAIL",
        "--out",
        str(out),
        timeout=3000,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    review = json.loads((out / "review.json").read_text())
    assert [p["path"] for p in review["parts"] if p["applied"]] == ["vllm/v1/core/block_pool.py"]
    assert len([p for p in review["parts"] if not p["applied"]]) == 5
    verdicts = {
        build: json.loads((out / build / "summary.json").read_text())["paths"]["prefix_cache"]
        for build in ("base", "base2", "pr")
    }
    assert verdicts["base"]["verdict"] == "PASS" and verdicts["base"]["earned"], verdicts["base"]
    assert verdicts["base2"]["verdict"] == "PASS" and verdicts["base2"]["earned"]
    assert verdicts["pr"]["verdict"] == "FAIL", verdicts["pr"]
    assert verdicts["pr"]["sabotage"] is not None  # the twin ran on pr too
    comparison = json.loads((out / "comparison.json").read_text())
    assert all(e["met"] for e in comparison["expectations"])
    summary = (out / "summary.md").read_text()
    assert summary.splitlines()[2].startswith("- vLLM: ") and "left out: `csrc/cache_kernels.cu`" in summary

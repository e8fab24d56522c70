"""Two runs started together on one empty cache (issue 24's Done-when), on real engines.

Both make B and B' at the same moment and both need the same cold-B reference: before issue
24 the first died on the shared ``<dest>.tmp`` (FileNotFoundError) and the second started its
engines on a B that was not there. Now one writes each cache entry and the other waits for
it, then reuses it; with reference reuse on (as in every test), the second run also waits
for the first's reference and runs only its subject: four engines in all, not six.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from harness.cache import STAGING
from harness.checkpoints.tiny import tiny_qwen3
from harness.settings import CACHE_ENV, REUSE_ENV
from tests.helpers import CLI

pytestmark = [pytest.mark.cpu, pytest.mark.slow]


def test_two_runs_started_together_on_one_empty_cache_both_pass(tmp_path):
    model = str(tiny_qwen3())  # from the session's cache: the runs' own cache starts empty
    cache = tmp_path / "cache"
    env = dict(os.environ, **{CACHE_ENV: str(cache), REUSE_ENV: "1"})
    runs = [
        subprocess.Popen(
            [
                *CLI,
                "run",
                "--model",
                model,
                "--paths",
                "reload_weights",
                "--executor",
                "local",
                "--out",
                str(tmp_path / f"run{i}"),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in (1, 2)
    ]
    outputs = [r.communicate(timeout=1800)[0] for r in runs]
    for r, output in zip(runs, outputs):
        assert r.returncode == 0, output[-4000:]
    summaries = [json.loads((tmp_path / f"run{i}" / "summary.json").read_text()) for i in (1, 2)]
    for s in summaries:
        assert s["paths"]["reload_weights"]["verdict"] == "PASS", s["paths"]
        assert s["paths"]["reload_weights"]["positive_control"]["detected"]
    # One reference for both: computed by one run, reused by the other, which waited for it.
    assert sorted(s["reference"]["reused"] for s in summaries) == [False, True]
    assert len({s["reference"]["key"] for s in summaries}) == 1
    assert sorted(s["cold_starts"] for s in summaries) == [1, 3]
    # Every cache entry whole and made once: nothing staged left, no second copy.
    for directory in (cache / "derived", cache / "references"):
        names = [p.name for p in directory.iterdir() if not p.name.endswith(".lock")]
        assert names and not any(STAGING in n or n.endswith(".tmp") for n in names), names
    assert len([p for p in (cache / "references").iterdir() if not p.name.startswith(".")]) == 1

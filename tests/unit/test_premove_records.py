"""Records written before the layout move (issue 22) re-judge identically with today's code.

``tests/data/premove-run.tar.xz`` is a real run directory (records schema 3, report schema 3)
written at commit 104939a, before the ``layout-moved`` tag: embedded Qwen3, float32,
``reload_weights`` and ``transfer_gloo`` with sabotaged twins. Only its records and the report
files that run wrote are kept (no logs, no HTML). ``refit-harness report`` re-judges it from the
records alone; every verdict, every CSV row and every reported fact must come out as it did then.
"""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pandas as pd
import pytest

from tests.helpers import cli

ARCHIVE = Path(__file__).parents[1] / "data" / "premove-run.tar.xz"
CSVS = ("tensors.csv", "tokens.csv", "consumed.csv", "hooks.csv")


@pytest.fixture(scope="module")
def rejudged(tmp_path_factory) -> tuple[Path, Path]:
    then = tmp_path_factory.mktemp("then")
    with tarfile.open(ARCHIVE) as tar:
        tar.extractall(then, filter="data")
    now = tmp_path_factory.mktemp("now")
    with tarfile.open(ARCHIVE) as tar:
        tar.extractall(now, filter="data", members=[m for m in tar.getmembers() if not m.name.endswith(".csv")])
    (now / "summary.json").unlink()
    proc = cli("report", str(now), timeout=300)
    assert proc.returncode == 0, proc.stderr
    return then, now


def test_the_premove_run_is_a_real_schema_3_record(rejudged):
    then, _ = rejudged
    assert json.loads((then / "run.json").read_text())["schema_version"] == 3
    assert {p: v["verdict"] for p, v in json.loads((then / "summary.json").read_text())["paths"].items()} == {
        "reload_weights": "PASS",
        "transfer_gloo": "PASS",
    }


def test_every_verdict_and_reported_fact_is_what_the_premove_code_said(rejudged):
    then, now = rejudged
    old = json.loads((then / "summary.json").read_text())["paths"]
    new = json.loads((now / "summary.json").read_text())["paths"]
    assert new.keys() == old.keys()
    for path, was in old.items():
        assert new[path]["verdict"] == was["verdict"], path
        # Report schema 4 split the reported-only facts (notes) from the deciding reasons.
        assert new[path]["reasons"] + new[path]["notes"] == was["reasons"], path
        assert new[path]["sabotage"]["caught"] == was["sabotage"]["caught"], path
        assert new[path]["positive_control"]["detected"] == was["positive_control"]["detected"], path


@pytest.mark.parametrize("name", CSVS)
def test_every_csv_row_is_what_the_premove_code_wrote(rejudged, name):
    then, now = rejudged
    old, new = pd.read_csv(then / name), pd.read_csv(now / name)
    assert len(new) == len(old) > 0
    same = [c for c in old.columns if c != "schema_version"]
    assert set(same) <= set(new.columns), set(same) - set(new.columns)
    pd.testing.assert_frame_equal(new[same].reset_index(drop=True), old[same].reset_index(drop=True))

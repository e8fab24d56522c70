"""Reference reuse on real engines: a second run on the same B takes the cold-B reference
and noise from the content-addressed cache instead of cold-starting them again."""

from __future__ import annotations

import pytest

from harness.checkpoints.tiny import tiny_qwen3
from harness.orchestrate.reference import reuse_by_default

pytestmark = [pytest.mark.cpu]


def test_a_second_run_on_the_same_b_reuses_the_reference_and_still_judges(run_oracle):
    if not reuse_by_default():
        pytest.skip("reference reuse is off (--refit-fresh-reference)")
    model = str(tiny_qwen3())
    from tests.integration.test_oracle_reload import stock_args

    first = run_oracle("stock", *stock_args())  # the same run as test_oracle_reload's
    key = first.summary["reference"]["key"]
    assert key, first.output
    second = run_oracle("reuse-reload_weights", "--model", model, "--paths", "reload_weights")
    assert second.exit_code == 0, second.output
    assert second.summary["reference"] == {"key": key, "reused": True}
    assert f"reference: reused reference {key}" in second.output
    assert not (second.out / "arms" / "reference.log").exists() and not (second.out / "arms" / "noise.log").exists()
    assert (second.out / "arms" / "reference.result.json").is_file()  # the report directory stays self-contained
    assert second.summary["cold_starts"] == 1  # only the subject
    assert [a["reused"] for a in second.summary["arms"] if a["role"] != "subject"] == [True, True]
    p = second.summary["paths"]["reload_weights"]
    assert p["verdict"] == "PASS" and p["positive_control"]["detected"], p
    assert f"reused reference <code>{key}</code>" in (second.out / "index.html").read_text()

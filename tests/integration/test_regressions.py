"""Two regression-corpus entries end to end, on real engines: each patched build (an overlay of this
venv's vLLM with the entry's patch) runs its model and path beside stock vLLM, and the harness
must catch the re-injected bug on the evidence the entry names while stock passes. A patch that
stops applying, or a detector that stops catching, fails here; the whole corpus runs in the
scenario (``refit-harness run -s regressions``).

- 44814 (Mamba2, reload_weights): a census tensor, ``mixer.dt_bias`` CORRUPT, and tokens;
- 12284 (tiny Qwen3, prefix_cache): greedy tokens only (stale KV is not a tensor).
"""

from __future__ import annotations

import json

import pytest

from tests.helpers import run_cli

pytestmark = [pytest.mark.cpu, pytest.mark.slow]
ENTRIES = ("44814-composed-loader-double-count", "12284-prefix-cache-not-reset")


@pytest.fixture(scope="module")
def corpus_run(tmp_path_factory):
    args = ["run", "-s", "regressions", "--executor", "local"]
    for e in ENTRIES:
        args += ["--only", e]
    return run_cli(args, tmp_path_factory.mktemp("regressions"), timeout=1800)


def test_two_entries_are_caught_as_expected_and_recall_is_kept(corpus_run):
    assert corpus_run.exit_code == 0, corpus_run.output[-3000:]
    summary = json.loads((corpus_run.out / "summary.json").read_text())
    both = {"caught": 2, "total": 2, "value": 1.0}
    assert summary["recall"] == {**both, "executable": both, "skipped": 0, "masked": 0}
    record = json.loads((corpus_run.out / "regressions.json").read_text())
    by_id = {e["id"]: e for e in record["entries"]}
    mamba = by_id[ENTRIES[0]]
    assert mamba["caught"] and "tensor" in mamba["evidence"] and "mixer.dt_bias" in mamba["detail"]
    assert mamba["patched"] == [["reload_weights", "FAIL"]] and mamba["stock"] == [["reload_weights", "PASS"]]
    prefix = by_id[ENTRIES[1]]
    assert prefix["caught"] and "tokens" in prefix["evidence"] and "tensor" not in prefix["evidence"]
    assert prefix["patched"] == [["prefix_cache", "FAIL"]] and prefix["stock"] == [["prefix_cache", "PASS"]]
    assert "recall: 2/2" in corpus_run.output


def test_the_patched_runs_record_their_patches_and_stock_records_none(corpus_run):
    record = json.loads((corpus_run.out / "regressions.json").read_text())
    for e in record["entries"]:
        for arm in (corpus_run.out / e["patched_run"] / "arms").glob("*.result.json"):
            env = dict(json.loads(arm.read_text())["data"]["environment"])
            assert e["patches"][0][1] in env.get("vllm_patches", ""), (e["id"], arm.name, env)
            assert "/builds/patched-" in env["vllm_path"], env["vllm_path"]
        for arm in (corpus_run.out / e["stock_run"] / "arms").glob("*.result.json"):
            assert "vllm_patches" not in dict(json.loads(arm.read_text())["data"]["environment"]), (e["id"], arm.name)

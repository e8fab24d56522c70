"""``refit-harness review``: a PR's diff split into what the installed vLLM can test and what
it cannot, each left-out file with its reason; fuzz only when asked, and said."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from harness.builds.patches import PatchError, apply_patches, read_patch
from harness.builds.review import split_diff
from tests.helpers import cli

DATA = Path(__file__).resolve().parents[1] / "data" / "review"
INSTALLED = Path(importlib.util.find_spec("vllm").origin).parent


def test_a_real_shaped_pr_keeps_what_applies_and_says_why_it_left_out_the_rest():
    split = split_diff(read_patch(DATA / "pr-shaped.diff"), INSTALLED, vllm_version="0.32.0")
    reasons = {p.path: (p.applied, p.reason) for p in split.parts}
    assert reasons["vllm/v1/core/block_pool.py"][0]
    assert reasons["csrc/cache_kernels.cu"] == (False, reasons["csrc/cache_kernels.cu"][1])
    assert "C++/CUDA source" in reasons["csrc/cache_kernels.cu"][1]
    assert "a test" in reasons["tests/v1/core/test_prefix_caching.py"][1]
    assert "documentation" in reasons["docs/design/prefix_caching.md"][1]
    assert "a new file" in reasons["vllm/v1/core/block_hash_index.py"][1]
    assert "does not apply to the installed vLLM 0.32.0" in reasons["vllm/v1/engine/llm_engine.py"][1]
    assert [p.path for p in split.left_out] == [p for p, (ok, _) in reasons.items() if not ok]
    # The testable part is exact against the installed file: a patched build applies it as it is.
    assert split.testable is not None and "block_pool.py" in split.testable.text and "csrc" not in split.testable.text
    [written] = apply_patches(_copy_of(INSTALLED / "v1/core/block_pool.py"), (split.testable,))
    assert written == "vllm/v1/core/block_pool.py"


def _copy_of(installed: Path) -> Path:
    import shutil
    import tempfile

    root = Path(tempfile.mkdtemp())
    target = root / "vllm" / installed.relative_to(INSTALLED)
    target.parent.mkdir(parents=True)
    shutil.copy(installed, target)
    return root


def test_a_tests_and_docs_only_diff_has_nothing_testable():
    split = split_diff(read_patch(DATA / "tests-docs-only.diff"), INSTALLED)
    assert split.testable is None and len(split.left_out) == 2


def test_the_cli_says_nothing_testable_changed_and_starts_no_engine(tmp_path):
    proc = cli("review", str(DATA / "tests-docs-only.diff"), "--out", str(tmp_path), timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "nothing testable changed" in proc.stderr and "left out: tests/model_executor/test_reload.py" in proc.stderr
    assert "Nothing testable changed" in (tmp_path / "summary.md").read_text()
    assert [p["applied"] for p in json.loads((tmp_path / "review.json").read_text())["parts"]] == [False, False]
    assert not (tmp_path / "base").exists()


FILE = "".join(f"line {i}\n" for i in range(1, 21))
# Written against a file whose line 4 is "line four": exact application fails here.
MAIN_DIFF = """--- a/vllm/x.py
+++ b/vllm/x.py
@@ -4,7 +4,7 @@
 line four
 line 5
 line 6
-line 7
+line seven
 line 8
 line 9
 line 10
"""


def test_fuzz_is_used_only_when_asked_and_the_report_says_so(tmp_path):
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "x.py").write_text(FILE)
    diff = tmp_path / "main.diff"
    diff.write_text(MAIN_DIFF)
    exact = split_diff(read_patch(diff), tmp_path / "vllm")
    assert exact.testable is None and "--fuzz N" in exact.parts[0].reason
    fuzzed = split_diff(read_patch(diff), tmp_path / "vllm", fuzz=1)
    assert fuzzed.parts[0].applied and fuzzed.parts[0].reason == "applies with fuzz (hunk(s) 1)"
    assert fuzzed.testable is not None and "+line seven" in fuzzed.testable.text
    root = tmp_path / "site"
    (root / "vllm").mkdir(parents=True)
    (root / "vllm" / "x.py").write_text(FILE)
    apply_patches(root, (fuzzed.testable,))  # exact now: no fuzz in the patched build
    assert (root / "vllm" / "x.py").read_text() == FILE.replace("line 7\n", "line seven\n")
    with pytest.raises(PatchError, match="hunk #1"):
        apply_patches(root, (read_patch(diff),))  # the strict applier stays strict

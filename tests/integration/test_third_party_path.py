"""An out-of-tree reload path, installed as a package: the example bucketed sync
(``examples/bucketed_sync``) registered through the ``refit_harness.paths`` entry-point group,
listed by ``refit-harness paths`` and run like a built-in path on the embedded model."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import run_cli

pytestmark = [pytest.mark.cpu]
EXAMPLE = Path(__file__).parents[2] / "examples" / "bucketed_sync"
DIST = "refit-bucketed-sync"


def _pip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def installed():
    """The example installed into this venv (as a user would: pip, no editable link), and removed
    afterwards, so that no other test's ``--paths all`` picks it up."""
    proc = _pip("install", "-q", "--no-deps", "--no-build-isolation", "--no-index", str(EXAMPLE))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    yield
    _pip("uninstall", "-y", "-q", DIST)


def test_the_installed_package_path_is_listed_as_third_party(installed):
    listing = subprocess.run(
        [sys.executable, "-m", "harness.cli", "paths"], capture_output=True, text=True, timeout=120
    )
    assert listing.returncode == 0, listing.stderr
    lines = listing.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("bucketed_sync "))
    assert "available" in lines[at] and "refused" not in lines[at]
    block = "\n".join(lines[at : at + 5])
    assert "fixed 64 KiB uint8 buckets" in block and f"from the installed package {DIST}" in block


def test_the_bucketed_sync_passes_on_the_embedded_model_and_its_twin_is_caught(installed, tmp_path):
    # float32, the embedded model's own dtype: in bf16 on an AMX CPU this refit (like every in-place
    # load of float32 values) meets vLLM's AMX linear-bias finding (docs/findings/amx-linear-bias.md).
    run = run_cli(["run", "--paths", "bucketed_sync", "--sabotage"], tmp_path / "out")
    assert run.exit_code == 0, run.output
    p = run.summary["paths"]["bucketed_sync"]
    assert p["verdict"] == "PASS", p["reasons"]
    assert p["positive_control"]["detected"]
    so = p["sabotage"]
    assert so["twin_verdict"] == "FAIL" and so["caught"], so
    control = "model.layers.0.post_attention_layernorm.weight"
    assert so["detail"].startswith(f"caught: {control} "), so

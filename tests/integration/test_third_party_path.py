"""An out-of-tree reload path, installed as a package: the example bucketed sync
(``examples/bucketed_sync``) registered through the ``refit_harness.paths`` entry-point group,
listed by ``refit-harness paths`` and run like a built-in path on the embedded model."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import cli, run_cli

pytestmark = [pytest.mark.cpu]
EXAMPLE = Path(__file__).parents[2] / "examples" / "bucketed_sync"
DIST = "refit-bucketed-sync"


def _pip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict[str, str]:
    """The example installed by pip (no editable link) into a directory of its own, and the
    environment that puts it on the path. Not into this venv: tests running beside these would
    see it (another test's ``--paths all``, the overlay key made from the venv's contents)."""
    site = tmp_path_factory.mktemp("third-party-site")
    proc = _pip("install", "-q", "--no-deps", "--no-build-isolation", "--no-index", "--target", str(site), str(EXAMPLE))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {"PYTHONPATH": os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)}


def test_the_installed_package_path_is_listed_as_third_party(installed):
    listing = cli("paths", extra_env=installed, timeout=120)
    assert listing.returncode == 0, listing.stderr
    lines = listing.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("bucketed_sync "))
    assert "available" in lines[at] and "refused" not in lines[at]
    block = "\n".join(lines[at : at + 5])
    assert "fixed 64 KiB uint8 buckets" in block and f"from the installed package {DIST}" in block


def test_the_bucketed_sync_passes_on_the_embedded_model_and_its_twin_is_caught(installed, tmp_path):
    # float32, the embedded model's own dtype: in bf16 on an AMX CPU this refit (like every in-place
    # load of float32 values) meets vLLM's AMX linear-bias finding (docs/findings/amx-linear-bias.md).
    run = run_cli(["run", "--paths", "bucketed_sync", "--sabotage"], tmp_path / "out", extra_env=installed)
    assert run.exit_code == 0, run.output
    p = run.summary["paths"]["bucketed_sync"]
    assert p["verdict"] == "PASS", p["reasons"]
    assert p["positive_control"]["detected"]
    so = p["sabotage"]
    assert so["twin_verdict"] == "FAIL" and so["caught"], so
    control = "model.layers.0.post_attention_layernorm.weight"
    assert so["detail"].startswith(f"caught: {control} "), so

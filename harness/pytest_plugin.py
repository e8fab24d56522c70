"""pytest plugin (loaded by the root conftest.py).

Registers the ``cpu``/``gpu`` markers, skips ``gpu`` items with a reason where there is
no GPU, and offers ``run_oracle``: the real CLI run as a subprocess, returning its exit
code, summary and tables.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.paths.base import cuda_available


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "cpu: runs a real vLLM engine on the CPU")
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU; skipped with a reason elsewhere")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none here; set HARNESS_DEVICE=gpu on a GPU host)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@dataclass(frozen=True)
class OracleRun:
    """What a CLI run left behind."""

    exit_code: int
    """Process exit code."""
    out: Path
    """Report directory."""
    output: str
    """Combined stdout/stderr."""

    @property
    def summary(self) -> dict:
        return json.loads((self.out / "summary.json").read_text())

    def csv(self, name: str):
        import pandas as pd

        return pd.read_csv(self.out / name)


def run_cli(args: list[str], out: Path, extra_env: dict[str, str] | None = None, timeout: float = 1200) -> OracleRun:
    env = dict(os.environ, **(extra_env or {}))
    proc = subprocess.run([sys.executable, "-m", "harness.cli", *args, "--out", str(out)], capture_output=True,
                          text=True, env=env, timeout=timeout)
    return OracleRun(exit_code=proc.returncode, out=out, output=proc.stdout + proc.stderr)


@pytest.fixture(scope="session")
def run_oracle(tmp_path_factory: pytest.TempPathFactory):
    """``run_oracle(name, *cli_args)``: run ``refit-harness run`` for real, once per name."""
    cache: dict[str, OracleRun] = {}

    def _run(name: str, *args: str, extra_env: dict[str, str] | None = None) -> OracleRun:
        if name not in cache:
            cache[name] = run_cli(["run", *args], tmp_path_factory.mktemp(name), extra_env)
        return cache[name]

    return _run

"""Helpers for the harness's own tests: the real CLI run as a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path


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
    proc = subprocess.run(
        [sys.executable, "-m", "harness.cli", *args, "--out", str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )
    return OracleRun(exit_code=proc.returncode, out=out, output=proc.stdout + proc.stderr)

"""Helpers for the harness's own tests: the real CLI run as a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from harness.run_dir import RunDir
from harness.spec.known_issues import MOE_KERNEL

CLI = (sys.executable, "-m", "harness.cli")
"""``refit-harness``, as this interpreter starts it."""

FUSED_EXPERTS = (f"{MOE_KERNEL}CPUUnquantizedExperts isa=vec",)
"""``Subject.kernels`` of a zoo MoE subject on the CPU: the fused-MoE kernel its arm recorded
(what the CPU fused-MoE reload issue is scoped by)."""


def cli(
    *args: str | Path,
    env: Mapping[str, str] | None = None,
    extra_env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    timeout: float = 300,
) -> subprocess.CompletedProcess[str]:
    """``refit-harness ARGS`` run to its end in a subprocess of this interpreter: its exit code,
    stdout and stderr (text). ``env``: its whole environment (None: this process's);
    ``extra_env``: set on top of that; ``timeout``: seconds before it is killed
    (``subprocess.TimeoutExpired``)."""
    base = os.environ if env is None else env
    return subprocess.run(
        [*CLI, *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=timeout,
        env=None if env is None and not extra_env else {**base, **(extra_env or {})},
    )


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
        return json.loads(RunDir(self.out).summary_json.read_text())

    def csv(self, name: str):
        import pandas as pd

        return pd.read_csv(self.out / name)


def run_cli(args: list[str], out: Path, extra_env: dict[str, str] | None = None, timeout: float = 1200) -> OracleRun:
    """``refit-harness ARGS --out OUT`` (``cli``), and what it left in ``out``."""
    proc = cli(*args, "--out", out, extra_env=extra_env, timeout=timeout)
    return OracleRun(exit_code=proc.returncode, out=out, output=proc.stdout + proc.stderr)

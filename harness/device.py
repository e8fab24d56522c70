"""Which device this machine offers, decided without importing torch or vLLM (the planner,
the CLI and the pytest plugin ask before any engine exists)."""

from __future__ import annotations

import os
import shutil
from typing import Literal

Device = Literal["cpu", "cuda"]
"""The one device vocabulary: where an arm ran, a known issue applies, a scenario is meant to run."""
RunsOn = Literal["any", "cuda"]
"""Where a reload path can run: on any device, or only with CUDA."""


def cuda_available() -> bool:
    """Planner-side test for CUDA, without importing torch or vLLM."""
    return os.environ.get("HARNESS_DEVICE") == "gpu" or shutil.which("nvidia-smi") is not None


def device_tags() -> frozenset[str]:
    """What this machine offers, as ``cpu``, or ``cuda`` and each GPU's ``smXY`` (``sm90`` for
    Hopper), read from ``nvidia-smi`` without importing torch."""
    if not cuda_available():
        return frozenset({"cpu"})
    import subprocess

    tags = {"cuda"}
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    tags |= {"sm" + line.strip().replace(".", "") for line in out.splitlines() if line.strip()}
    return frozenset(tags)


def unmet(required: tuple[str, ...]) -> str | None:
    """The first of ``required`` (any of which will do) this machine does not offer, as a
    sentence; None when one is offered or nothing is required."""
    if not required:
        return None
    offered = device_tags()
    if offered & set(required):
        return None
    return f"needs {' or '.join(required)}; this machine offers {', '.join(sorted(offered))}"

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

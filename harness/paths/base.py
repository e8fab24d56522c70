"""What a reload path is: how it configures the engine and how it refits it.

Classes here are imported by the planner (for availability and descriptions) and by
the arm process (to refit). vLLM is imported only inside methods that run in arms.
"""

from __future__ import annotations

import os
import shutil
from typing import Any, ClassVar, Literal


def cuda_available() -> bool:
    """Planner-side test for CUDA, without importing torch or vLLM."""
    return os.environ.get("HARNESS_DEVICE") == "gpu" or shutil.which("nvidia-smi") is not None


class ReloadPath:
    """Base class: subclasses set the class attributes and implement ``refit``."""

    name: ClassVar[str]
    """Registry name."""
    exercises: ClassVar[str]
    """One line: which vLLM code path a refit through this path runs."""
    device: ClassVar[Literal["any", "cuda"]] = "any"
    """Where it can run."""

    @classmethod
    def unavailable_reason(cls) -> str | None:
        if cls.device == "cuda" and not cuda_available():
            return f"{cls.name} needs CUDA; no GPU on this machine (set HARNESS_DEVICE=gpu on a GPU host)"
        return None

    def engine_kwargs(self) -> dict[str, Any]:
        """Extra ``LLM(...)`` arguments this path needs."""
        return {}

    def attach(self, llm: Any) -> None:
        """Called once after the engine starts, before any step."""

    def refit(self, llm: Any, checkpoint_dir: str) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Release whatever ``attach`` set up; called even when a step failed."""

"""A build: a named Python environment with its own vLLM, as an axis of a run."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BuildSpec:
    """A named Python environment that arms can run under."""

    name: str
    """Short label used in arm names, reports and expectations, e.g. ``base`` or ``pr``."""
    python: str
    """Absolute path of the interpreter; empty for the harness's own interpreter."""

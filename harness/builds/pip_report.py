"""What pip's ``install --dry-run --report`` says it would install, as the packages an overlay
pins (an overlay build's vLLM, the engine-deps overlay's extras). Stdlib only."""

from __future__ import annotations

import re

from harness.errors import BuildError

# PyPI's torchvision/torchaudio/torchcodec break imports beside the CPU torch (as in a full build).
LEFT_OUT = ("torchvision", "torchaudio", "torchcodec")


def planned_packages(report: dict) -> list[dict]:
    """What pip's ``--report`` would install into the base, less ``LEFT_OUT``: name, version,
    whether it is the requested vLLM, and where pip found it."""
    out = []
    for item in report.get("install", ()):
        meta = item.get("metadata", {})
        name = meta.get("name", "")
        if _normal(name) in LEFT_OUT:
            continue
        out.append(
            {
                "name": name,
                "version": meta.get("version", ""),
                "requested": bool(item.get("requested")),
                "url": (item.get("download_info") or {}).get("url", ""),
            }
        )
    if not any(p["requested"] for p in out):
        raise BuildError("pip's resolution installs no requested package: is the requirement already in the base?")
    return out


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()

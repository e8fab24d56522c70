"""The throughput probe, judged from records: medians, spreads, and the two flags.

- Inside a run: the subject after its refit is *slower* when its median is below every
  cold-B sample (reference and noise engines together are the floor).
- Across builds: pr's median is a difference only outside the range of base's and base2's
  samples; inside it, "no measurable difference".
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from harness.records import ArmResult


@dataclass(frozen=True)
class ThroughputPoint:
    """Tokens/s at one point of a run (``cold_B`` or a path after its refit)."""

    point: str
    """``cold_B`` or the reload path whose refit the subject had just done."""
    samples: tuple[float, ...]
    """Every timed run's tokens/s (cold B: both cold engines)."""
    median: float
    """Median of the samples."""
    spread: float
    """max - min of the samples."""
    slower_than_cold: bool
    """Only for a path: its median is below every cold-B sample."""


def points(arms: tuple[ArmResult, ...] | list[ArmResult]) -> tuple[ThroughputPoint, ...]:
    by_point: dict[str, list[float]] = {}
    for a in arms:
        for m in a.measurements:
            by_point.setdefault(m.label.point, []).extend(m.tokens_per_s)
    cold = by_point.get("cold_B", [])
    out = []
    for point, samples in by_point.items():
        med = statistics.median(samples)
        slower = point != "cold_B" and bool(cold) and med < min(cold)
        out.append(
            ThroughputPoint(
                point=point,
                samples=tuple(samples),
                median=med,
                spread=max(samples) - min(samples),
                slower_than_cold=slower,
            )
        )
    return tuple(sorted(out, key=lambda p: p.point != "cold_B"))

"""Perturbations that turn checkpoint A into checkpoint B.

The oracle needs A and B to differ in *every* tensor (weights, norms, biases):
a derived value left stale by a refit is invisible when the old and new values
coincide. Each perturbation is a pure function of (name, tensor, generator).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from harness.registry import Registry

Perturbation = Callable[[str, torch.Tensor, torch.Generator, float], torch.Tensor]

PERTURBATIONS: Registry[Perturbation] = Registry("perturbation")
PERTURBATIONS.register("gaussian", "harness.perturb:gaussian")
PERTURBATIONS.register("scale", "harness.perturb:scale")


def gaussian(name: str, t: torch.Tensor, gen: torch.Generator, strength: float) -> torch.Tensor:
    """Add seeded noise of ``strength`` times the tensor's spread (at least ``strength``),
    so tensors of every magnitude, constant ones included, move."""
    if not t.is_floating_point():
        return t.clone()
    base = t.float()
    spread = float(base.std()) if base.numel() > 1 else 0.0
    sigma = strength * max(spread, float(base.abs().mean()), 1.0e-2)
    noise = torch.randn(base.shape, generator=gen, dtype=torch.float32) * sigma
    out = (base + noise).to(t.dtype)
    return _ensure_changed(t, out)


def scale(name: str, t: torch.Tensor, gen: torch.Generator, strength: float) -> torch.Tensor:
    """Multiply by ``1 + strength``: the positive-control perturbation."""
    if not t.is_floating_point():
        return t.clone()
    out = (t.float() * (1.0 + strength)).to(t.dtype)
    return _ensure_changed(t, out)


def _ensure_changed(before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
    # Zeros scaled stay zeros, and low precision can round noise away; nudge the
    # elements that did not move so the tensor's digest is guaranteed to change.
    same = after == before
    if bool(same.any()):
        bump = torch.full_like(after, 1.0e-2 if after.dtype == torch.float32 else 2.0e-2)
        after = torch.where(same, before + bump, after)
    return after

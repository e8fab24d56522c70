"""Perturbations that turn checkpoint A into checkpoint B.

The oracle needs A and B to differ in *every* tensor (weights, norms, biases):
a derived value left stale by a refit is invisible when the old and new values
coincide. Each perturbation is a function of (name, tensor, generator, strength) that
keeps dtype and shape; integer and bool tensors are returned untouched.

They work over the flattened tensor one chunk of ``CHUNK_ELEMENTS`` at a time and write
into one output tensor of the source's dtype (``out``, which may be the input itself), so
the memory they need beyond their input and output is a few chunks, whatever the tensor's
size: a 1 GB embedding is never held again in float32, nor as noise, sum or mask.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from harness.registry import Registry

if TYPE_CHECKING:
    import torch
# torch is imported inside the functions: checkpoints.py reads RECIPE to find a cached B,
# and importing torch is most of a cached prepare's time.

Perturbation = Callable[..., "torch.Tensor"]
"""``fn(name, t, gen, strength, out=None) -> tensor``: ``out`` (default: a new tensor) is
written and returned; it may be ``t`` itself, which is then perturbed in place."""

PERTURBATIONS: Registry[Perturbation] = Registry("perturbation")
PERTURBATIONS.register("gaussian", "harness.checkpoints.perturb:gaussian")
PERTURBATIONS.register("scale", "harness.checkpoints.perturb:scale")

CHUNK_ELEMENTS = 1 << 22
"""Elements per chunk: 16 MiB per float32 temporary. The noise is drawn chunk by chunk, so
the bytes of B depend on it: it is part of ``RECIPE``."""

RECIPE = f"chunked-v2:{CHUNK_ELEMENTS}"
"""Version of the perturbations' output bytes for a given spec and seed. Derived checkpoints
are cached under a key that includes it (``checkpoints.perturbed``, ``with_control``,
``damaged``), so a B made by an older recipe (whole-tensor noise, before ``chunked-v2``) is
never reused as this one's. Change it whenever the bytes a perturbation writes change."""


def gaussian(
    name: str, t: torch.Tensor, gen: torch.Generator, strength: float, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Add seeded noise of ``strength`` times the tensor's spread (at least ``strength``),
    so tensors of every magnitude, constant ones included, move."""
    import torch

    if not t.is_floating_point():
        return t
    sigma = strength * max(spread(t), 1.0e-2)

    def noisy(x: torch.Tensor, buf: torch.Tensor) -> torch.Tensor:
        return torch.randn(x.shape, generator=gen, dtype=buf.dtype, out=buf).mul_(sigma).add_(x)

    return _map_chunks(t, out, noisy)


def scale(
    name: str, t: torch.Tensor, gen: torch.Generator | None, strength: float, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Multiply by ``1 + strength``: the positive-control perturbation."""
    import torch

    if not t.is_floating_point():
        return t
    return _map_chunks(t, out, lambda x, buf: torch.mul(x, 1.0 + strength, out=buf))


def spread(t: torch.Tensor) -> float:
    """max(standard deviation (n - 1), mean absolute value) of a floating tensor, chunk by
    chunk: each chunk's mean and variance in its working dtype (Welford, in torch), combined
    across chunks in float64 (Chan's pairwise update), never a float copy of the whole."""
    import torch

    count, mean, m2, abs_sum = 0, 0.0, 0.0, 0.0
    work = _work_dtype(t.dtype)
    for chunk in _chunks(t.reshape(-1)):
        x = chunk.to(work)  # a view for float32 and float64; one chunk's copy otherwise
        n = x.numel()
        chunk_var, chunk_mean = (float(v) for v in torch.var_mean(x, correction=0))
        abs_sum += float(torch.linalg.vector_norm(x, ord=1))
        delta, total = chunk_mean - mean, count + n
        mean += delta * n / total
        m2 += chunk_var * n + delta * delta * count * n / total
        count = total
    if count == 0:
        return 0.0
    std = (m2 / (count - 1)) ** 0.5 if count > 1 else 0.0
    return max(std, abs_sum / count)


def _work_dtype(dtype: torch.dtype) -> torch.dtype:
    import torch

    # float64 keeps its precision; everything narrower (fp8 included, which torch will not
    # promote implicitly) is computed in float32 and rounded back once.
    return torch.float64 if dtype == torch.float64 else torch.float32


def _chunks(flat: torch.Tensor) -> Iterator[torch.Tensor]:
    for start in range(0, flat.numel(), CHUNK_ELEMENTS):
        yield flat[start : start + CHUNK_ELEMENTS]


def _map_chunks(
    t: torch.Tensor, out: torch.Tensor | None, fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
) -> torch.Tensor:
    """``out`` = ``fn(x, buf)`` chunk by chunk over ``t``: ``x`` is the chunk in the working
    dtype, ``buf`` a work buffer of its size that ``fn`` fills and returns (reused across
    chunks: a fresh allocation per chunk costs more page faults than the arithmetic). The
    result is rounded to ``t``'s dtype, and every element that did not move is nudged."""
    import torch

    out = torch.empty_like(t, memory_format=torch.contiguous_format) if out is None else out
    if out.dtype != t.dtype or out.shape != t.shape or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous {t.dtype} tensor of shape {list(t.shape)}")
    src, dst = t.reshape(-1), out.view(-1)  # both views unless t is strided (then src is a copy)
    work = _work_dtype(t.dtype)
    buf = torch.empty(min(src.numel(), CHUNK_ELEMENTS), dtype=work)
    for before, target in zip(_chunks(src), _chunks(dst)):
        after = fn(before.to(work), buf[: before.numel()]).to(t.dtype)  # never aliases out: safe in place
        target.copy_(_ensure_changed(before, after))
    return out


def _ensure_changed(before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
    """``after`` (a chunk of its own) with every element equal to ``before`` moved, in place.

    Zeros scaled stay zeros, and low precision can round noise away: those elements get a
    small bump; where even that rounds away (large values in bf16 or fp8), the next
    representable value away from zero, so the tensor's digest is guaranteed to change."""
    import torch

    same = after == before
    if not bool(same.any()):
        return after
    work = _work_dtype(before.dtype)
    bump = 1.0e-2 if before.dtype == torch.float32 else 2.0e-2
    nudged = (before[same].to(work) + bump).to(before.dtype)
    stuck = nudged == before[same]
    if bool(stuck.any()):
        ints = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[before.element_size()]
        bits = before[same][stuck].view(ints)
        nudged[stuck] = (bits + 1).view(before.dtype)  # sign-magnitude: one ulp away from zero
    after[same] = nudged
    return after


# ---- quantization-aware perturbation -------------------------------------------------------
# A quantized checkpoint's codes are integers (or fp8 codes) and its scales tiny positive
# floats: the gaussian above leaves the first alone (so they were UNJUDGEABLE and no path could
# earn a PASS) and would push the second through zero. B instead moves every code one step on
# its own grid and multiplies every scale by a positive factor, so B is still a valid checkpoint
# of the same format (codes in range, scales positive) that differs from A in every quantized
# weight, scale and zero point. Which tensor is what comes from its format
# (``harness.checkpoints.quantize.role_of``).

QUANT_RECIPE = "quant-v1"
"""Version of the quantization-aware perturbation's bytes: part of the cache key of every B,
B' and damaged B made from a quantized checkpoint."""


def perturb_role(role, t: torch.Tensor, gen: torch.Generator, strength: float) -> torch.Tensor:
    """``t`` perturbed as its ``TensorRole`` says (in place where it can), chunk by chunk."""
    if role.role in ("int-codes", "int-zero-point"):
        lo, hi = -(1 << (role.bits - 1)), (1 << (role.bits - 1)) - 1
        return _map_int(t, lambda x: _step(x, gen, lo, hi))
    if role.role in ("int4-packed", "int4-zero-points"):
        return _map_int(t, lambda x: _step_nibbles(x, gen))
    if role.role == "fp8-codes":
        return move_fp8_codes(t, gen)
    if role.role == "scale":
        return move_scale(t, gen, strength)
    return t  # layout: fixed by the format


def _map_int(t: torch.Tensor, fn: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    flat = t.reshape(-1)
    for chunk in _chunks(flat):
        chunk.copy_(fn(chunk))
    return t if flat.data_ptr() == t.data_ptr() else flat.reshape(t.shape)


def _step(x: torch.Tensor, gen: torch.Generator, lo: int, hi: int) -> torch.Tensor:
    """Every code one step up or down (a seeded coin), reflected at the ends of [lo, hi]."""
    import torch

    up = torch.randint(0, 2, x.shape, generator=gen, dtype=torch.int64).to(torch.bool)
    y = x.to(torch.int32) + torch.where(up, 1, -1).to(torch.int32)
    y = torch.where(y > hi, y - 2, torch.where(y < lo, y + 2, y))
    return y.to(x.dtype)


def _step_nibbles(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Every 4-bit code of int32 words one step within [0, 15]."""
    import torch

    out = torch.zeros_like(x)
    for i in range(8):
        nibble = (x >> (4 * i)) & 0xF
        out |= (_step(nibble, gen, 0, 15) & 0xF) << (4 * i)
    return out


def move_fp8_codes(t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Every e4m3fn code to a neighbouring finite code: the magnitude's bit pattern one step up
    or down (0x7F is NaN in e4m3fn, so magnitudes stay in [0, 0x7E]); the sign is kept. A value
    on the grid stays on the grid, so the checkpoint stays what a quantizer could have written."""
    import torch

    if t.dtype != torch.float8_e4m3fn:
        raise ValueError(f"fp8 codes must be float8_e4m3fn, got {t.dtype}")
    bits = t.view(torch.uint8)
    for chunk in _chunks(bits.reshape(-1)):
        b = chunk.to(torch.int32)
        magnitude = _step(b & 0x7F, gen, 0, 0x7E)
        chunk.copy_(((b & 0x80) | magnitude).to(torch.uint8))
    return t


def move_scale(t: torch.Tensor, gen: torch.Generator, strength: float) -> torch.Tensor:
    """A positive scale times ``exp(strength * n)``, ``n`` drawn from N(0, 1) clipped to
    [-3, 3] with ``|n| >= 0.1``: every scale moves by at least ``strength / 10`` relative and
    stays positive. An element rounding back to its old value moves one ulp."""
    import torch

    if not t.is_floating_point():
        raise ValueError(f"a scale must be floating point, got {t.dtype}")
    flat = t.reshape(-1)
    for chunk in _chunks(flat):
        n = torch.randn(chunk.shape, generator=gen).clamp_(-3.0, 3.0)
        n = torch.where(n.abs() < 0.1, torch.where(n < 0, -0.1, 0.1), n)
        after = (chunk.to(torch.float32) * torch.exp(strength * n)).to(t.dtype)
        same = after == chunk
        if bool(same.any()):
            ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
            after[same] = (chunk[same].view(ints) + 1).view(t.dtype)
        chunk.copy_(after)
    return t if flat.data_ptr() == t.data_ptr() else flat.reshape(t.shape)

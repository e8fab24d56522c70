"""The CPU as vLLM sees it, the override that lowers it, and the kernels each layer got.

Runs in the arm and in every vLLM process (through the harness's vLLM plugin), so the
override of ``REFIT_HARNESS_CPU_ISA`` holds wherever vLLM decides a kernel: in the front end
(``CpuPlatform.check_and_update_config`` sets the SSM cache dtype and conv-state layout from
``avx512_bf16``), when it imports its kernel library (``_C``, ``_C_AVX512`` or ``_C_AVX2``,
chosen by ``CpuPlatform.import_kernels``) and at load (``dispatch_cpu_unquantized_gemm``: the
conv1d prepack, SGL/AMX GEMMs, oneDNN; the MoE experts and the attention ISA).

vLLM reads every capability through ``torch.cpu.get_capabilities()`` (the ``_is_avx512_*`` and
``_is_amx_*`` helpers call it), so masking that one function masks them all. oneDNN and ATen
detect the CPU themselves: the arm caps them with ``ONEDNN_MAX_CPU_ISA`` and
``ATEN_CPU_CAPABILITY`` before they start (``harness.cpu_isa.override_env``).
"""

from __future__ import annotations

import os
import platform
import types
from pathlib import Path

from harness.cpu_isa import FLAGS, NATIVE, hidden, level_of, override_env, override_from_env
from harness.records import CpuCapabilities, KernelPath

_REAL = "_refit_harness_real_get_capabilities"


def apply_override(override: str) -> None:
    """Make torch (and so vLLM) in this process see the CPU lowered to ``override``; with
    ``native``, undo an earlier override. Idempotent: the plugin runs once per process, the
    arm calls it before the plugin does."""
    import torch

    real = getattr(torch.cpu, _REAL, None) or torch.cpu.get_capabilities
    setattr(torch.cpu, _REAL, real)
    if override == NATIVE:
        torch.cpu.get_capabilities = real
        return
    caps = dict(real())
    view = types.MappingProxyType({k: (False if v is True and hidden(k, override) else v) for k, v in caps.items()})
    torch.cpu.get_capabilities = lambda: view


def apply_from_env() -> None:
    """The override this process inherited (``REFIT_HARNESS_CPU_ISA``), if any."""
    apply_override(override_from_env())


def prepare_arm(override: str) -> None:
    """In the arm, before torch or vLLM start: the environment every process it starts
    inherits (the override's name for the plugin, the oneDNN and ATen caps), then the mask."""
    os.environ.update(override_env(override))
    apply_override(override)


def capabilities(source: str) -> CpuCapabilities:
    """What this process's torch reports (after any override), and vLLM's Zen test."""
    import torch

    real = getattr(torch.cpu, _REAL, torch.cpu.get_capabilities)
    seen = dict(torch.cpu.get_capabilities())
    host = dict(real())
    arch = platform.machine()
    flags = tuple(sorted(f for f in FLAGS if seen.get(f) is True))
    try:
        from vllm.platforms import current_platform

        zen = bool(current_platform.is_zen_cpu())
    except Exception:
        zen = False
    return CpuCapabilities(
        arch=arch,
        vendor=_vendor(),
        flags=flags,
        level=level_of(flags, arch),
        host_flags=tuple(sorted(f for f in FLAGS if host.get(f) is True)),
        override=override_from_env(),
        is_zen_cpu=zen,
        kernel_library=kernel_library(),
        onednn_max_cpu_isa=os.environ.get("ONEDNN_MAX_CPU_ISA", ""),
        source=source,
    )


def _vendor() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("vendor_id"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def kernel_library() -> str:
    """Which of vLLM's CPU extensions this process loaded (``_C``, ``_C_AVX512``, ``_C_AVX2``)."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return ""
    names = {
        Path(line.split()[-1]).name.split(".", 1)[0]
        for line in maps.splitlines()
        if "/vllm/_C" in line and line.rstrip().endswith(".so")
    }
    return ",".join(sorted(names))


# ---- which kernel each layer got ------------------------------------------------------------


def kernel_paths(model) -> tuple[KernelPath, ...]:
    """The CPU kernel of every linear, causal-conv1d, MoE and attention layer of ``model``."""
    out = []
    for name, module in model.named_modules():
        linear = getattr(module, "cpu_linear", None)
        if linear is not None:
            out.append(KernelPath(name, "linear", _linear_path(linear)))
        weight = getattr(module, "weight", None)
        # A causal conv1d weight is [dim, 1, width]; once prepacked it has the packed kernel's
        # shape, and the unpacked copy beside it says so.
        prepacked = hasattr(module, "_cpu_unpacked_conv_weight")
        if prepacked or (getattr(weight, "ndim", 0) == 3 and weight.shape[1] == 1 and linear is None):
            out.append(KernelPath(name, "conv1d", "prepacked" if prepacked else "not prepacked"))
        method = getattr(module, "quant_method", None)
        experts = _experts(method) if method is not None and hasattr(module, "w13_weight") else None
        if experts is not None:
            out.append(KernelPath(name, "moe", experts))
        impl = getattr(module, "impl", None)
        if impl is not None and hasattr(module, "kv_cache"):
            isa = getattr(module, "isa", None) or getattr(impl, "isa", None)
            out.append(KernelPath(name, "attention", type(impl).__name__ + (f" isa={isa}" if isa else "")))
    return tuple(out)


def _linear_path(fn) -> str:
    """vLLM's ``dispatch_cpu_unquantized_gemm`` binds each branch as a lambda over its own
    free variables: the packed weight (SGL), the oneDNN handle, the zentorch weight."""
    import torch

    if fn is torch.nn.functional.linear:
        return "torch linear"
    free = set(getattr(getattr(fn, "__code__", None), "co_freevars", ()))
    if "packed_weight" in free:
        return "sgl weight_packed_linear"
    if "handler" in free:
        return "oneDNN onednn_mm"
    if "zen_weight" in free:
        return "zentorch"
    if not free and getattr(fn, "__name__", "") == "<lambda>":
        return "torch linear (fallback)"
    return getattr(fn, "__qualname__", type(fn).__name__)


def _experts(method, depth: int = 0) -> str | None:
    """The fused-experts implementation under a MoE layer's quant method, with its ``isa``."""
    seen: set[int] = set()

    def find(obj, depth: int):
        if obj is None or id(obj) in seen or depth > 3:
            return None
        seen.add(id(obj))
        isa = getattr(obj, "isa", None)
        if isinstance(isa, str):
            return f"{type(obj).__name__} isa={isa}"
        for attr in ("moe_kernel", "fused_experts", "experts", "impl", "moe_mk", "kernel"):
            found = find(getattr(obj, attr, None), depth + 1)
            if found:
                return found
        return None

    return find(method, depth) or type(method).__name__

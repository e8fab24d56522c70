"""The CPU capabilities vLLM's CPU backend dispatches on, and the override that hides some of them.

vLLM's CPU kernels, and so refit verdicts, depend on the instruction set (docs/isa.md): with
bf16 weights an AVX512-BF16 CPU prepacks causal-conv1d weights, an AMX CPU packs small GEMMs
into SGL kernels and runs AMX attention, MoE and MLA, and oneDNN takes bf16 GEMMs only on
AVX-512. Every capability here is named as ``torch.cpu.get_capabilities()`` names it, which
is what vLLM reads (``torch.cpu._is_avx512_bf16_supported()`` and the like).

The override (``--cpu-isa`` / ``REFIT_HARNESS_CPU_ISA``) makes an arm's engine take the branch
of a smaller CPU on this one: its capabilities are masked where vLLM reads them (in every vLLM
process, ``harness.worker.cpu_dispatch``), and oneDNN and ATen are capped with their own
variables. It can only take capabilities away.

Stdlib only: the parent reads the host from ``/proc/cpuinfo``; the arm and the workers read
torch's view (after the override) with the same vocabulary.
"""

from __future__ import annotations

import importlib.util
import os
import platform
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from harness.errors import UsageError
from harness.records import CpuCapabilities
from harness.settings import CPU_ISA_ENV

FLAGS = (
    "avx2",
    "avx512_f",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
    "amx_fp16",
    "bf16",
)
"""The capabilities vLLM 0.32's CPU dispatch reads (``bf16`` is aarch64's), as torch names them."""

# /proc/cpuinfo flag (x86 "flags", aarch64 "Features") -> the torch name above.
_CPUINFO = {
    "avx2": "avx2",
    "avx512f": "avx512_f",
    "avx512_vnni": "avx512_vnni",
    "avx512_bf16": "avx512_bf16",
    "avx512_fp16": "avx512_fp16",
    "amx_tile": "amx_tile",
    "amx_bf16": "amx_bf16",
    "amx_int8": "amx_int8",
    "amx_fp16": "amx_fp16",
    "bf16": "bf16",
}

NATIVE = "native"


@dataclass(frozen=True)
class IsaLevel:
    """An x86 capability level an engine can be made to see on a larger CPU."""

    name: str
    """``avx2``, ``avx512``, ``avx512_bf16`` (the ``--cpu-isa`` value)."""
    rank: int
    """Order of the levels: a CPU can be lowered to a level of smaller rank only."""
    hides: tuple[str, ...]
    """Capability-name prefixes the engine no longer sees at this level."""
    onednn_max_cpu_isa: str
    """``ONEDNN_MAX_CPU_ISA`` for the arm: oneDNN detects the CPU itself (it takes bf16 GEMMs on
    any AVX-512 CPU and refuses them on AVX2), so its own cap makes the same choice a real CPU
    of this level would."""
    aten_cpu_capability: str | None
    """``ATEN_CPU_CAPABILITY`` for the arm (torch's own kernels), None: left as the CPU's."""
    example: str
    """A real CPU of this level."""


LEVELS: dict[str, IsaLevel] = {
    level.name: level
    for level in (
        IsaLevel("avx2", 1, ("avx512", "amx"), "AVX2", "avx2", "AMD EPYC Zen 2/3, Intel Haswell to Comet Lake"),
        IsaLevel(
            "avx512",
            2,
            ("avx512_bf16", "avx512_fp16", "amx"),
            "AVX512_CORE_VNNI",
            None,
            "Intel Skylake-SP, Cascade Lake",
        ),
        IsaLevel("avx512_bf16", 3, ("amx",), "AVX512_CORE_BF16", None, "AMD EPYC Zen 4/5, Intel Cooper Lake"),
    )
}
LEVEL_CHOICES = (NATIVE, *LEVELS)
"""What ``--cpu-isa`` accepts."""
_AMX_RANK = 4  # a CPU with AMX (Sapphire Rapids and later): above every level an override can give


def level_of(flags: Iterable[str], arch: str) -> str:
    """One word for a set of capabilities: ``amx``, ``avx512_bf16``, ``avx512``, ``avx2`` (x86),
    ``arm_bf16`` or ``arm`` (aarch64), else the architecture."""
    have = set(flags)
    if arch in ("x86_64", "AMD64", "i686"):
        if {"amx_tile", "amx_bf16"} <= have:
            return "amx"
        if "avx512_bf16" in have:
            return "avx512_bf16"
        if "avx512_f" in have:
            return "avx512"
        return "avx2" if "avx2" in have else "x86"
    if arch in ("aarch64", "arm64"):
        return "arm_bf16" if "bf16" in have else "arm"
    return arch


def vllm_kernel_library(flags: Iterable[str], arch: str) -> str:
    """The CPU extension vLLM loads for these capabilities, as ``CpuPlatform.import_kernels``
    (0.32) chooses it on x86: ``_C`` with AVX512-BF16, ``_C_AVX512`` with AVX-512 alone, else
    ``_C_AVX2``; "" on other architectures. The extensions differ in their ops: ``_C_AVX2`` has no
    ``cpu_gemm_wna16`` (GPTQ/AWQ int4) and vLLM refuses an fp8 KV cache without AVX-512 or AMX, so
    verdicts on those engines follow this choice (docs/isa.md). The worker records the extension
    it actually loaded (``CpuCapabilities.kernel_library``)."""
    if arch not in ("x86_64", "AMD64", "i686"):
        return ""
    have = set(flags)
    if "avx512_f" not in have:
        return "_C_AVX2"
    return "_C" if "avx512_bf16" in have else "_C_AVX512"


def _rank(level: str) -> int:
    if level == "amx":
        return _AMX_RANK
    if level == "avx512":
        return 2
    return LEVELS[level].rank if level in LEVELS else 0


def hidden(name: str, override: str) -> bool:
    """Whether capability ``name`` is masked by ``override``."""
    level = LEVELS.get(override)
    return level is not None and name.startswith(level.hides)


def masked(flags: Iterable[str], override: str) -> tuple[str, ...]:
    """The capabilities an engine sees under ``override``, sorted."""
    return tuple(sorted(f for f in set(flags) if not hidden(f, override)))


def check_override(override: str, host: CpuCapabilities) -> None:
    """Refuse an override that is unknown, or that would add what the CPU lacks."""
    if override == NATIVE:
        return
    if override not in LEVELS:
        raise UsageError(f"--cpu-isa {override!r}: not a capability level; choose one of {', '.join(LEVEL_CHOICES)}")
    if host.level not in ("amx", *LEVELS) or _rank(host.level) < LEVELS[override].rank:
        raise UsageError(
            f"--cpu-isa {override}: this CPU is {host.level} ({' '.join(host.host_flags) or 'no dispatch flags'}); "
            "the override can only hide capabilities an x86 CPU has, never add them"
        )


def override_from_env() -> str:
    """The override this process was started with (``REFIT_HARNESS_CPU_ISA``; unset: native)."""
    return os.environ.get(CPU_ISA_ENV, "").strip() or NATIVE


def override_env(override: str) -> dict[str, str]:
    """Variables an arm runs with under ``override`` (inherited by every vLLM process it starts)."""
    level = LEVELS.get(override)
    env = {CPU_ISA_ENV: override}
    if level is not None:
        env["ONEDNN_MAX_CPU_ISA"] = level.onednn_max_cpu_isa
        if level.aten_cpu_capability:
            env["ATEN_CPU_CAPABILITY"] = level.aten_cpu_capability
    return env


# ---- the host, as the parent reads it (no torch) -------------------------------------------


def cpuinfo_flags(text: str) -> tuple[tuple[str, ...], str]:
    """(dispatch capabilities, vendor) from the text of ``/proc/cpuinfo``."""
    raw: set[str] = set()
    vendor = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key in ("flags", "Features") and not raw:
            raw = set(value.split())
        elif key == "vendor_id" and not vendor:
            vendor = value.strip()
        elif key == "CPU implementer" and not vendor:
            vendor = f"arm implementer {value.strip()}"
    return tuple(sorted(_CPUINFO[f] for f in raw if f in _CPUINFO)), vendor


def host_capabilities(override: str = NATIVE, cpuinfo: str | None = None, arch: str | None = None) -> CpuCapabilities:
    """This machine's capabilities as the parent reads them, and what an engine sees under
    ``override``. ``is_zen_cpu`` is vLLM's own test (an AMD CPU with AVX-512 and zentorch
    importable), made here from the same facts; the arm records vLLM's answer."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    arch = arch or platform.machine()
    flags, vendor = cpuinfo_flags(cpuinfo)
    seen = masked(flags, override)
    zen = "AuthenticAMD" in cpuinfo and "avx512" in cpuinfo and importlib.util.find_spec("zentorch") is not None
    return CpuCapabilities(
        arch=arch,
        vendor=vendor,
        flags=seen,
        level=level_of(seen, arch),
        host_flags=flags,
        override=override,
        is_zen_cpu=zen,
        source="/proc/cpuinfo",
    )


def describe_cpu(cpu: CpuCapabilities | None) -> str:
    """One line for reports: ``x86_64 amx (avx2 avx512_f ... amx_bf16)``, with the override."""
    if cpu is None:
        return "not recorded"
    text = f"{cpu.arch} {cpu.level} ({' '.join(cpu.flags) or 'no dispatch flags'})"
    if cpu.override != NATIVE:
        host = level_of(cpu.host_flags, cpu.arch)
        text += f", forced by --cpu-isa {cpu.override} (the CPU itself: {host})"
    if cpu.is_zen_cpu:
        text += ", Zen CPU path (zentorch)"
    if cpu.kernel_library:
        text += f", vLLM kernels {cpu.kernel_library}"
    return text


def same_dispatch(a: CpuCapabilities | None, b: CpuCapabilities | None) -> bool:
    """Whether two records would take the same vLLM CPU branches: the same architecture, the
    same capabilities as vLLM sees them, the same Zen path, and the same oneDNN and ATen caps
    (an override); unknown (None) on either side is not the same."""
    if a is None or b is None:
        return False
    return (a.arch, a.flags, a.is_zen_cpu, a.override) == (b.arch, b.flags, b.is_zen_cpu, b.override)

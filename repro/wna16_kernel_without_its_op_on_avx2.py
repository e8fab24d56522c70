"""vLLM 0.32 (CPU build), x86 without AVX-512: an int4 GPTQ/AWQ layer is given a kernel whose op
the loaded extension does not have.

Standalone (vLLM and torch only; no refit-harness). vLLM loads one of three CPU extensions by
the CPU's capabilities (``CpuPlatform.import_kernels``): ``_C`` (AVX512-BF16), ``_C_AVX512`` or
``_C_AVX2``. ``_C_AVX2`` is built without ``cpu_gemm_wna16``, yet ``choose_mp_linear_kernel``
still picks ``CPUWNA16LinearKernel`` (its ``can_implement`` checks shapes and types only), so the
engine starts and its first forward raises ``AttributeError: '_OpNamespace' '_C' object has no
attribute 'cpu_gemm_wna16'`` instead of a refusal at kernel selection.

Run: python repro/wna16_kernel_without_its_op_on_avx2.py [--as-avx2]
On an AVX2-only CPU it shows the bug as is. On a larger x86 CPU ``--as-avx2`` makes torch report
no AVX-512 and no AMX (what vLLM reads to choose its extension) before vLLM is imported. Prints
the extension loaded, the kernel chosen and whether its op exists; exit 1 while a kernel is
chosen whose op is missing, 0 otherwise.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

if "--as-avx2" in sys.argv[1:]:
    for check in ("_is_avx512_supported", "_is_avx512_bf16_supported", "_is_amx_tile_supported"):
        setattr(torch.cpu, check, lambda: False)


def loaded_extensions() -> list[str]:
    maps = Path("/proc/self/maps").read_text().splitlines()
    return sorted({Path(line.split()[-1]).name for line in maps if "/vllm/_C" in line and line.endswith(".so")})


def main() -> int:
    from vllm.model_executor.kernels.linear import choose_mp_linear_kernel
    from vllm.model_executor.kernels.linear.mixed_precision.MPLinearKernel import MPLinearLayerConfig
    from vllm.platforms import current_platform
    from vllm.scalar_type import scalar_types

    current_platform.import_kernels()
    config = MPLinearLayerConfig(  # a GPTQ int4 layer, 256 x 256, group size 128
        full_weight_shape=(256, 256),
        partition_weight_shape=(256, 256),
        weight_type=scalar_types.uint4b8,
        act_type=torch.bfloat16,
        group_size=128,
        zero_points=False,
    )
    kernel = choose_mp_linear_kernel(config)
    has_op = hasattr(torch.ops._C, "cpu_gemm_wna16")
    print(f"extension loaded: {', '.join(loaded_extensions()) or 'none'}")
    print(f"kernel chosen for a GPTQ int4 layer: {kernel.__name__}")
    print(f"torch.ops._C.cpu_gemm_wna16 exists: {has_op}")
    return 1 if kernel.__name__ == "CPUWNA16LinearKernel" and not has_op else 0


if __name__ == "__main__":
    sys.exit(main())

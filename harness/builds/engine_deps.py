"""What the harness's arms import that a build may lack, brought to it as an overlay.

A build is any environment with vLLM in it: a maintainer's base or PR venv holds vLLM and
what vLLM depends on, nothing more. The engine side of the harness also imports
``ENGINE_EXTRAS`` (xxhash for the default digest, at import time; Ray for the Ray-driven
paths), which vLLM does not bring. Before any engine starts, ``ensure_engine_deps`` asks the
build's own interpreter which of them it cannot import, and for those makes an *engine-deps
overlay*, the way ``harness.builds.overlay`` makes a vLLM one:

1. the build's pip resolves the missing requirements against the build as installed
   (``pip install --dry-run --report``, writing nothing there);
2. exactly what pip would add is installed with ``--no-deps --target site/`` under the cache,
   keyed by the interpreter, its installed distributions and the requirements;
3. every arm of that build gets ``site/`` on ``PYTHONPATH`` after the harness's shim
   (``harness.builds.venvs.build_env``), so the build's own packages still come first.

The build itself is never written. When the overlay cannot be made (no pip in the build, no
package index), the run is refused before any engine starts, in one line that names the
command that fixes it. Stdlib only, as the rest of ``harness.builds``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import subprocess
from pathlib import Path

from harness.builds.pip_report import planned_packages
from harness.cache import cached_variant, write_atomic
from harness.errors import BuildError
from harness.settings import DEFAULT_CACHE
from harness.spec.build import BuildSpec

STAMP = "engine-deps.json"
SITE = "site"

# Beside vLLM, what the engine side of the harness imports that vLLM does not bring: Ray (the
# Ray-driven transfer paths), xxhash (the default digest, harness.worker.digest; blake3 is a
# dependency of vLLM's own), requests-unixsocket2 (the HTTP weight transfer's client; measured:
# a 0.34 source build without it made that path ERROR) and packaging (the m2n NCCL version check;
# vLLM brings it only indirectly). An overlay build has them from the base.
ENGINE_EXTRAS = ("ray[default]>=2.40", "xxhash>=3.4", "requests-unixsocket2>=1.0", "packaging")

_PROBE = r"""
import importlib.util, json, sys
from importlib import metadata
mods = json.loads(sys.argv[1])
print("REFIT_HARNESS_DEPS " + json.dumps({
    "missing": [m for m in mods if importlib.util.find_spec(m) is None],
    "distributions": sorted({(d.metadata["Name"] or "").lower() + "==" + d.version for d in metadata.distributions()}),
}))
"""


IMPORTED_AS = {"requests_unixsocket2": "requests_unixsocket"}
"""Distributions of ``ENGINE_EXTRAS`` imported under another name."""


def requirement_module(requirement: str) -> str:
    """The module a requirement's distribution is imported as (``ray[default]>=2.40`` -> ``ray``)."""
    name = re.split(r"[\[<>=!~ ;]", requirement, maxsplit=1)[0].strip().replace("-", "_").lower()
    return IMPORTED_AS.get(name, name)


def engine_requirements() -> tuple[str, ...]:
    return ENGINE_EXTRAS


def _clean_env(extra_path: str = "") -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PYTHONNOUSERSITE"] = "1"
    if extra_path:
        env["PYTHONPATH"] = extra_path
    return env


def probe(python: str, modules: list[str], extra_path: str = "") -> dict:
    """Which of ``modules`` ``python`` cannot import, and its installed distributions."""
    try:
        proc = subprocess.run(
            [python, "-c", _PROBE, json.dumps(modules)],
            capture_output=True,
            text=True,
            timeout=120,
            env=_clean_env(extra_path),
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BuildError(f"cannot run {python}: {exc}") from exc
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("REFIT_HARNESS_DEPS ")), None)
    if proc.returncode != 0 or line is None:
        raise BuildError(f"{python} could not list its packages: {(proc.stderr or proc.stdout).strip()[-300:]}")
    return json.loads(line.split(" ", 1)[1])


def pointer(python: str, cache: Path = DEFAULT_CACHE) -> Path:
    """The file naming the engine-deps overlay of the build run by ``python`` (absent: none needed)."""
    return cache / "builds" / f"engine-deps-of-{hashlib.sha256(python.encode()).hexdigest()[:12]}"


def engine_deps_site(python: str, cache: Path = DEFAULT_CACHE) -> Path | None:
    """The ``site`` directory an arm of this build puts on ``PYTHONPATH``, or None."""
    try:
        root = cache / "builds" / pointer(python, cache).read_text().strip()
    except OSError:
        return None
    return root / SITE if (root / STAMP).is_file() else None


def ensure_engine_deps(build: BuildSpec, cache: Path = DEFAULT_CACHE, log=print) -> Path | None:
    """Make sure every arm of ``build`` can import the harness's engine side: returns the
    overlay's ``site`` (made once, cached), or None when the build has everything. Raises
    ``BuildError`` (exit 2, one line naming the fix) when it lacks something that cannot be added."""
    if not build.python:
        return None  # the harness's own interpreter: installed with everything
    requirements = engine_requirements()
    modules = [requirement_module(r) for r in requirements]
    facts = probe(build.python, modules)
    missing = [r for r in requirements if requirement_module(r) in facts["missing"]]
    mark = pointer(build.python, cache)
    if not missing:
        mark.unlink(missing_ok=True)
        return None
    ident = json.dumps([build.python, facts["distributions"], missing])
    root = cache / "builds" / f"engine-deps-{hashlib.sha256(ident.encode()).hexdigest()[:12]}"
    fix = f"{shlex.quote(build.python)} -m pip install " + " ".join(shlex.quote(r) for r in missing)
    names = ", ".join(requirement_module(r) for r in missing)

    def make(staging: Path) -> None:
        report_file = staging / "pip-report.json"
        _pip(build.python, ["install", "--dry-run", "-q", "--report", str(report_file), *missing])
        packages = planned_packages(json.loads(report_file.read_text()))
        pins = [f"{p['name']}=={p['version']}" for p in packages]
        _pip(build.python, ["install", "-q", "--no-deps", "--target", str(staging / SITE), *pins])
        still = probe(build.python, modules, str(staging / SITE))["missing"]
        if still:
            raise BuildError(f"the overlay still cannot import {', '.join(still)}")
        write_atomic(
            staging / STAMP,
            json.dumps({"python": build.python, "requirements": missing, "packages": packages}, indent=2),
        )

    if not (root / STAMP).is_file():
        log(f"build {build.name}: {build.python} lacks {names}, which the harness's arms import; adding an overlay")
    try:
        cached_variant(root, make, lambda d: (d / STAMP).is_file(), on_wait=log)
    except BuildError as exc:
        raise BuildError(
            f"build {build.name}: {build.python} lacks {names}, which the harness's arms import, and it could not "
            f"be added ({str(exc).splitlines()[0][:200]}); install it there: {fix}"
        ) from None
    write_atomic(mark, root.name)
    log(f"build {build.name}: {names} from the engine-deps overlay {root.name} (the build is untouched)")
    return root / SITE


def _pip(python: str, args: list[str]) -> None:
    try:
        proc = subprocess.run(
            [python, "-m", "pip", *args], capture_output=True, text=True, env=_clean_env(), timeout=1800
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BuildError(f"pip could not run: {exc}") from exc
    if proc.returncode != 0:
        lines = [ln for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip() and "WARNING" not in ln]
        raise BuildError(f"pip {args[0]} failed (exit {proc.returncode}): {(lines or ['no output'])[-1].strip()}")

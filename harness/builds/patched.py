"""Patched builds: an overlay of a build's vLLM with unified diffs applied.

A patched build installs nothing: ``site/vllm`` is a tree of symlinks to the base's vLLM files
in which only the patched files are real copies, and ``bin/python`` runs the base interpreter
with that site first. Stdlib only, as the rest of ``harness.builds``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import time
from pathlib import Path

from harness.builds.overlay import overlay_parts
from harness.builds.patches import apply_patches, patches_digest
from harness.builds.venvs import STAMP, build_facts, interpreter
from harness.cache import key_lock
from harness.errors import BuildError
from harness.settings import DEFAULT_CACHE, OVERLAY_ENV, PATCHES_ENV
from harness.spec.build import BuildSpec


def patched_key(base_python: Path, facts: dict[str, str], patches) -> str:
    """Directory name of a patched build: the base environment and the patches' digests, in order."""
    ident = f"{base_python}\n{facts.get('vllm')}\n{facts.get('vllm_git_sha', '')}\n{facts.get('vllm_path')}\n"
    return "patched-" + hashlib.sha256((ident + patches_digest(patches)).encode()).hexdigest()[:16]


def create_patched_build(
    base_python: str | Path,
    patches,
    cache: Path = DEFAULT_CACHE,
    log=print,
    base_spec: str = "",
    base_facts: dict[str, str] | None = None,
) -> Path:
    """A build whose vLLM is ``base_python``'s with ``patches`` applied; returns its ``bin/python``.

    Nothing is installed and the base is never written: the build is a directory holding
    ``site/vllm``, a tree of symlinks to the base's vLLM files in which only the patched files
    are real (patched) copies, and a ``bin/python`` launcher that puts ``site`` first on
    ``PYTHONPATH``, says which patches it carries (``REFIT_HARNESS_VLLM_PATCHES``, recorded by
    every arm) and runs the base interpreter. So a patched build costs a second, not an install,
    and the harness's own venv can be the base. Cached under ``builds/`` keyed by the base and the
    patches' digests; a patch that does not apply is ``PatchError`` (exit 2) naming the file and
    the hunk, and leaves nothing behind.
    """
    if not patches:
        raise BuildError("a patched build needs at least one --patch")
    base = interpreter(base_python)
    facts = base_facts or build_facts(BuildSpec("base", str(base)), cache)  # given: the caller described it
    if facts.get("vllm_patches"):
        raise BuildError(f"{base} is itself a patched build; patch its base instead, with every patch")
    source = Path(facts["vllm_path"])
    root = cache / "builds" / patched_key(base, facts, patches)
    python = root / "bin" / "python"
    root.parent.mkdir(parents=True, exist_ok=True)
    with key_lock(root, lambda message: log(f"build: {message}")):
        try:
            if json.loads((root / STAMP).read_text()).get("complete") and python.exists():
                return python
        except (OSError, ValueError):
            pass
        shutil.rmtree(root, ignore_errors=True)
        started = time.monotonic()
        site = root / "site" / "vllm"
        try:
            for directory, dirs, files in os.walk(source):
                dirs[:] = [d for d in dirs if d != "__pycache__"]
                here = site / Path(directory).relative_to(source)
                here.mkdir(parents=True, exist_ok=True)
                for f in files:
                    (here / f).symlink_to(Path(directory) / f)
            written = apply_patches(root / "site", tuple(patches), resolve=os.path.realpath)
        except BaseException:
            shutil.rmtree(root, ignore_errors=True)
            raise
        marker = shlex.quote(",".join(f"{'/'.join(Path(p.name).parts[-2:])}@{p.sha256}" for p in patches))
        runs, sites, overlay = base, str(root / "site"), ""
        if (parts := overlay_parts(base)) is not None:  # over an overlay build: its site after ours
            runs, overlay_site, overlay_marker = parts
            sites += f":{overlay_site}"
            overlay = f"{OVERLAY_ENV}={shlex.quote(overlay_marker)}; export {OVERLAY_ENV}\n"
        python.parent.mkdir(parents=True, exist_ok=True)
        python.write_text(
            "#!/bin/sh\n"
            f"# refit-harness patched build: the vLLM of {base} with {len(patches)} patch(es)\n"
            f"{PATCHES_ENV}={marker}; export {PATCHES_ENV}\n"
            f"{overlay}"
            f'PYTHONPATH="{sites}${{PYTHONPATH:+:$PYTHONPATH}}"; export PYTHONPATH\n'
            f'exec "{runs}" "$@"\n'
        )
        python.chmod(0o755)
        patched = build_facts(BuildSpec("patched", str(python)), cache)
        if Path(patched.get("vllm_path", "")) != site:
            shutil.rmtree(root, ignore_errors=True)
            raise BuildError(f"the patched build's python imports vLLM from {patched.get('vllm_path')}, not {site}")
        (root / STAMP).write_text(
            json.dumps(
                {
                    "spec": base_spec or f"overlay of {base}",
                    "base_python": str(base),
                    "base_facts": facts,
                    "python": str(python),
                    "facts": patched,
                    "patches": [{"name": p.name, "sha256": p.sha256} for p in patches],
                    "files": list(written),
                    "seconds": round(time.monotonic() - started, 1),
                    "complete": True,
                },
                indent=2,
            )
        )
        log(f"build: patched {', '.join(written)} ({len(patches)} patch(es)) over {base}")
        return python

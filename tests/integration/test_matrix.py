"""Issue 5 on real engines: a crashed engine leaves its cell ERROR while the run goes
on, --resume finishes only what is missing, and scenario cells run as pytest items."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.checkpoints.tiny import tiny_qwen3
from tests.helpers import CLI, cli

pytestmark = [pytest.mark.cpu]
REPO = Path(__file__).resolve().parents[2]


def _engine_core_of(arm_plan: Path):
    """The ``VLLM::EngineCore`` process under the arm running ``arm_plan``, once it exists (the
    arm is found by the pid file the runner writes beside its plan: a forked arm's command line
    is its zygote's)."""
    import psutil

    try:
        arm = psutil.Process(int(arm_plan.with_name(arm_plan.name.replace(".plan.json", ".pid")).read_text()))
        children = arm.children(recursive=True)
    except (OSError, ValueError, psutil.Error):
        return None
    for child in children:
        try:
            if "EngineCore" in " ".join(child.cmdline()):
                return child
        except psutil.Error:
            continue
    return None


def _processes_mentioning(text: str) -> list[str]:
    ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout.splitlines()
    return [line for line in ps if text in line and "pgrep" not in line and "ps -eo" not in line]


def test_killed_engine_is_an_error_cell_and_resume_finishes_only_it(tmp_path):
    out = tmp_path / "run"
    cmd = [
        *CLI,
        "run",
        "--model",
        str(tiny_qwen3()),
        "--paths",
        "reload_weights,dummy_start",
        "--out",
        str(out),
        "--no-reuse-reference",  # every arm measured here, so resume has all three to keep
        "--engine-core-process",
    ]  # a separate engine core to kill under a live arm
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    victim_log = out / "arms" / "subject-dummy_start.log"
    killed = engine = None
    deadline = time.monotonic() + 600
    # The arm's steps take a second or two once its engine is up: find the engine core
    # early, then crash it the moment the arm has observed its cold state.
    while time.monotonic() < deadline and proc.poll() is None and killed is None:
        engine = engine or _engine_core_of(out / "arms" / "subject-dummy_start.plan.json")
        if engine and victim_log.exists() and "observe cold_dummy" in victim_log.read_text(errors="replace"):
            os.kill(engine.pid, signal.SIGKILL)
            killed = engine.pid
        time.sleep(0.02)
    output = proc.communicate(timeout=900)[0]
    assert killed is not None, output
    assert proc.returncode == 2, output  # an infrastructure error, and the report is still written
    summary = json.loads((out / "summary.json").read_text())
    assert summary["paths"]["dummy_start"]["verdict"] == "ERROR"
    assert summary["paths"]["reload_weights"]["verdict"] == "PASS"
    assert (out / "index.html").exists() and (out / "tensors.csv").exists()
    assert not _processes_mentioning(str(out)), "an engine of the run outlived it"

    resumed = cli("run", "--resume", str(out), "--no-reuse-reference", timeout=900)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    for arm in ("reference", "noise", "subject-reload_weights"):
        assert f"{arm}: already finished, kept" in resumed.stderr
    assert "subject-dummy_start: cold start" in resumed.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["paths"]["dummy_start"]["verdict"] == "PASS"


def test_scenario_cells_are_pytest_items_with_readable_failures(tmp_path):
    # The model is one the harness was never written for: registered with vLLM only through
    # REFIT_HARNESS_MODELS, its final norm reads a copy hidden in a tuple attribute set with
    # object.__setattr__ at cold start.
    unseen = tiny_qwen3(architecture="HiddenFinalNormCopyQwen3")
    env = dict(
        os.environ,
        REFIT_HARNESS_MODELS="HiddenFinalNormCopyQwen3=tests.integration.unseen_models:HiddenFinalNormCopyQwen3",
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    )
    junit = tmp_path / "junit.xml"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "scenarios/",
            "-m",
            "cpu",
            "--refit-scenario",
            "smoke",
            "-k",
            "reload_weights",
            "--refit-model",
            str(unseen),
            f"--junitxml={junit}",
            "-p",
            "no:cacheprovider",
            "-q",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=900,
        env=env,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "1 failed, 1 deselected" in proc.stdout
    assert "reload_weights: FAIL" in proc.stdout and "first divergent kernel input:" in proc.stdout
    assert "Traceback" not in proc.stdout
    assert 'name="reload_weights[tiny-qwen3-eager-tp1]"' in junit.read_text()
    reports = list(tmp_path.glob("refit-smoke-*/summary.json"))
    assert len(reports) == 1  # the session's scenario report sits beside the JUnit XML
    cells = json.loads(reports[0].read_text())["cells"]
    assert cells == {"reload_weights[tiny-qwen3-eager-tp1]": cells["reload_weights[tiny-qwen3-eager-tp1]"]}
    assert cells["reload_weights[tiny-qwen3-eager-tp1]"]["verdict"] == "FAIL"
    import pandas as pd

    tensors = pd.read_csv(reports[0].parent / "tiny-qwen3-eager-tp1" / "tensors.csv")
    stale = tensors[
        (tensors["path"] == "reload_weights") & (tensors["check"] == "refit") & (tensors["status"] == "STALE")
    ]
    assert list(stale["tensor"]) == ["model.norm._frozen[0]"]


def test_tp2_observes_every_rank_and_localizes_the_stale_copy_on_each(run_oracle):
    run = run_oracle("stale-tp2", "--model", str(tiny_qwen3(architecture="StaleQKNormQwen3ForCausalLM")), "--tp", "2")
    assert run.exit_code == 1, run.output
    t = run.csv("tensors.csv")
    # The path's own refit (its sabotaged twin, path "reload_weights~sabotage", is stale by design).
    stale = set(t[(t["path"] == "reload_weights") & (t["check"] == "refit") & (t["status"] == "STALE")]["tensor"])
    assert stale == {
        f"rank{r}:model.layers.{i}.self_attn.{n}_norm.weight_fp32" for r in (0, 1) for i in (0, 1) for n in ("q", "k")
    }
    assert "rank0:" in run.summary["paths"]["reload_weights"]["first_divergent_kernel_input"]

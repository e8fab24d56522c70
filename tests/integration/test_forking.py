"""Arms forked from the run's warm interpreter (``harness.arm.zygote``) on real engines: the
reference and the subject fork, the noise floor forks from a zygote of its own, the verdict is earned, a forked
arm carries the run's marker where a cancelled run looks for it, and nothing outlives the run."""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from harness import store
from harness.checkpoints.tiny import tiny_qwen3
from harness.orchestrate.runner import run_processes
from harness.records import ArmResult
from harness.settings import RUN_MARKER
from tests.helpers import CLI

pytestmark = [pytest.mark.cpu]


def test_forked_arms_earn_the_same_pass_and_leave_nothing_running(tmp_path):
    marker, out = uuid.uuid4().hex, tmp_path / "run"
    cmd = [*CLI, "run", "--model", str(tiny_qwen3()), "--paths", "reload_weights"]
    proc = subprocess.Popen(
        [*cmd, "--no-reuse-reference", "--out", str(out)],
        env=dict(os.environ, **{RUN_MARKER: marker}),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    # While the arms run: each one the runner recorded carries the marker in /proc/PID/environ,
    # every time it is looked at.
    seen: dict[str, list[bool]] = {}
    while proc.poll() is None:
        for pid_file in (out / "arms").glob("*.pid"):
            try:
                environ = Path(f"/proc/{int(pid_file.read_text())}/environ").read_bytes()
            except (OSError, ValueError):
                continue
            if environ:  # empty once the process is exiting
                seen.setdefault(pid_file.stem, []).append(f"{RUN_MARKER}={marker}".encode() in environ.split(b"\0"))
        time.sleep(0.1)
    output = proc.communicate()[0]
    assert proc.returncode == 0, output
    assert seen.get("subject-reload_weights") and all(map(all, seen.values())), f"an arm without its marker: {seen}"
    summary = json.loads((out / "summary.json").read_text())
    verdict = summary["paths"]["reload_weights"]
    assert verdict["verdict"] == "PASS" and verdict["positive_control"]["detected"], verdict
    started = {}
    for role in ("reference", "noise", "subject-reload_weights"):
        result = store.load(ArmResult, out / "arms" / f"{role}.result.json", "arm_result")
        started[role] = dict(result.environment)["arm_process"]
    assert started == {
        "reference": "forked from zygote",
        "noise": "forked from floor-zygote",
        "subject-reload_weights": "forked from zygote",
    }
    assert "preloaded in" in (out / "arms" / "zygote.log").read_text()
    assert "preloaded in" in (out / "arms" / "floor-zygote.log").read_text()
    deadline = time.monotonic() + 10
    while run_processes(marker=marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not run_processes(marker=marker), "the zygote or an arm outlived the run"

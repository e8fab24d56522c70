"""Arms forked from the run's warm interpreter (``harness.arm.zygote``) on real engines: the
reference and the subject fork, the noise floor forks from a zygote of its own, the verdict is earned, a forked
arm carries the run's marker where a cancelled run looks for it, and nothing outlives the run.
In a zygote pool, a second run forks from the zygotes the first started, and they end with the
pool."""

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
from harness.orchestrate.forking import zygote_alive, zygote_pool
from harness.orchestrate.runner import run_processes
from harness.records import ArmResult
from harness.settings import ARMS_LANE, FLOOR_LANE, RUN_MARKER, ZYGOTE_POOL_ENV
from tests.helpers import CLI

pytestmark = [pytest.mark.cpu]


def forked_run(out: Path) -> None:
    """One run whose arms all fork, with a marker of its own: each arm carries it while it runs,
    the verdict is earned, and nothing with it outlives the run."""
    marker = uuid.uuid4().hex
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
    deadline = time.monotonic() + 10
    while run_processes(marker=marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not run_processes(marker=marker), "the zygote or an arm outlived the run"


def test_forked_arms_earn_the_same_pass_and_leave_nothing_running(tmp_path, monkeypatch):
    monkeypatch.delenv(ZYGOTE_POOL_ENV, raising=False)  # the run's own zygotes, ended with it
    forked_run(tmp_path / "run")
    for lane in (ARMS_LANE, FLOOR_LANE):
        assert "preloaded in" in (tmp_path / "run" / "arms" / f"{lane}.log").read_text()


def test_runs_in_a_pool_fork_from_its_zygotes_and_each_arm_carries_its_own_runs_marker(tmp_path):
    with zygote_pool() as pool:
        forked_run(tmp_path / "first")
        zygotes = {f.name: f.read_text() for f in pool.glob("*.pid")}
        assert sorted(name.rsplit("-", 1)[0] for name in zygotes) == [FLOOR_LANE, ARMS_LANE], zygotes
        forked_run(tmp_path / "second")
        # The second run preloaded nothing: the same two zygotes, each preloaded once.
        assert {f.name: f.read_text() for f in pool.glob("*.pid")} == zygotes
        for log in pool.glob("*.log"):
            assert log.read_text().count("preloaded in") == 1, log.read_text()
        assert not list((tmp_path / "second" / "arms").glob("*zygote.log"))
    deadline = time.monotonic() + 10
    while any(zygote_alive(int(pid)) for pid in zygotes.values()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(zygote_alive(int(pid)) for pid in zygotes.values()), "a pooled zygote outlived its pool"

"""Issue 12 on real engines, several faults in one run (engine starts are the cost):

1. While both subject engines run, every TCP socket any process of the run listens on is on
   loopback (Ray's servers, vLLM's engines), and the dev-mode ``vllm serve`` listens on a Unix
   socket in a 0700 directory, not on a port.
2. The HTTP arm's process dies (as when its watchdog calls ``os._exit``): its ``vllm serve`` and
   that server's engine core die with it. They used to live on in their own session.
3. The CLI gets SIGTERM (a cancelled CI job): exit 2 with one line, the report of what finished
   is written, and no process the run started is left: found by the marker every one of them
   inherits, not by argv.
"""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import stat
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from harness.checkpoints.prepare import prepare
from harness.checkpoints.tiny import tiny_qwen3
from harness.orchestrate.runner import ARM_MODULE, run_processes
from harness.settings import RUN_MARKER
from tests.helpers import CLI, cli

pytestmark = [pytest.mark.cpu]


def _wait(predicate, timeout: float, what: str, proc: subprocess.Popen | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(
                f"the run ended (code {proc.returncode}) while waiting for {what}: {proc.stderr.read()[-3000:]}"
            )
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _listening(pids: list[int]) -> set[tuple[str, str]]:
    import psutil

    found = set()
    for conn in psutil.net_connections(kind="inet"):
        if conn.status == psutil.CONN_LISTEN and conn.pid in pids:
            try:
                name = psutil.Process(conn.pid).name()
            except psutil.Error:
                name = "?"
            found.add((name, conn.laddr.ip))
    return found


def _children_named(pid: int, text: str) -> list[int]:
    import psutil

    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True) if text in " ".join(p.cmdline())]
    except psutil.Error:
        return []


def test_crash_and_sigterm_leave_no_process_and_nothing_listens_beyond_loopback(tmp_path):
    out, marker = tmp_path / "run", uuid.uuid4().hex
    env = dict(os.environ, **{RUN_MARKER: marker})
    proc = subprocess.Popen(
        [
            *CLI,
            "run",
            "--model",
            str(tiny_qwen3()),
            "--paths",
            "reload_weights,http_reload",
            "--out",
            str(out),
            "--executor",
            "ray",  # the arms as Ray actors: Ray's servers must listen on loopback only
            # Cold-B arms of its own, queued behind the subjects: a reference reused from the cache
            # (another module on the other worker stores it) left nothing running at the SIGTERM,
            # once a forked subject took 18 s.
            "--no-reuse-reference",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        http_log = out / "arms" / "subject-http_reload.log"
        other_log = out / "arms" / "subject-reload_weights.log"
        # Both subject engines are up once each arm has begun its first observation.
        _wait(
            lambda: all(
                f.exists() and "observe cold_A" in f.read_text(errors="replace") for f in (http_log, other_log)
            ),
            900,
            "both subject engines",
            proc,
        )

        # 1. Nothing of the run listens beyond loopback.
        pids = run_processes(marker=marker)
        listening = _listening(pids)
        assert listening, "Ray's own servers should be listening"
        wide = {(n, ip) for n, ip in listening if not ipaddress.ip_address(ip.removeprefix("::ffff:")).is_loopback}
        assert not wide, f"listening beyond loopback: {sorted(wide)}"
        arm_pid = int((out / "arms" / "subject-http_reload.pid").read_text())
        servers = _children_named(arm_pid, "api_server") or _children_named(arm_pid, " serve ")
        assert servers, "no vllm serve under the HTTP arm"
        server_tree = [servers[0], *_children_named(servers[0], "")]
        assert len(server_tree) >= 2, "the server's engine core should be running"
        server_cmd = " ".join(__import__("psutil").Process(servers[0]).cmdline())
        socket_path = server_cmd.split("--uds ", 1)[1].split()[0]
        assert "--port" not in server_cmd and stat.S_IMODE(os.stat(Path(socket_path).parent).st_mode) == 0o700

        # 2. The HTTP arm dies: its server and the server's engine core die with it.
        os.kill(arm_pid, signal.SIGKILL)
        _wait(
            lambda: (
                not [
                    p
                    for p in server_tree
                    if Path(f"/proc/{p}").exists() and "Z" not in Path(f"/proc/{p}/stat").read_text().split(")")[-1][:3]
                ]
            ),
            30,
            "the orphaned server to die",
        )

        # 3. SIGTERM while the other subject (and maybe a cold-B arm) still runs.
        assert proc.poll() is None, "the run ended before it could be cancelled"
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 2, stdout + stderr
    errors = [ln for ln in stderr.splitlines() if ln.startswith("refit-harness: error: ")]
    assert len(errors) == 1 and "interrupted (SIGTERM)" in errors[0], stderr
    assert "Traceback" not in stderr, stderr
    summary = json.loads((out / "summary.json").read_text())  # the report of what finished
    assert summary["exit_code"] == 2 and (out / "index.html").exists()
    assert summary["paths"]["http_reload"]["verdict"] == "ERROR"
    assert "exited with code -9" in " ".join(summary["paths"]["http_reload"]["reasons"])
    deadline = time.monotonic() + 20  # SIGKILLed groups are reaped within moments
    while run_processes(marker=marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = {
        pid: Path(f"/proc/{pid}/cmdline").read_bytes()[:120]
        for pid in run_processes(marker=marker)
        if Path(f"/proc/{pid}").exists()
    }
    assert not left, f"processes of the run outlived it: {left}"
    assert not list((out / "arms").glob("*.pid"))
    assert not (out / "scratch").exists() or not any((out / "scratch").iterdir())


def test_a_dead_ray_actor_is_that_arms_error_and_the_run_goes_on(tmp_path, monkeypatch):
    """The actor running an arm is killed (as by an OOM killer): that arm is ERROR, said so,
    and its record is on disk; no exception escapes the scheduler's ``run_queue``."""
    import dataclasses
    import threading

    import psutil

    from harness.judge.evaluate import evaluate
    from harness.orchestrate.fanout import FanoutSpec, RayExecutor
    from harness.orchestrate.schedule import run_queue
    from harness.paths import PATHS
    from harness.spec.run import ControlSpec, PerturbSpec
    from tests.unit.run_dirs import write_run

    record = write_run(tmp_path)
    (tmp_path / "arms" / "reference.result.json").unlink()
    real = prepare(str(tiny_qwen3()), None, PerturbSpec(), ControlSpec())
    arm = dataclasses.replace(next(a for a in record.plan.arms if a.name == "reference"), checkpoints=real)
    killed, marker = [], uuid.uuid4().hex
    # Inherited by this test's own Ray and its workers: no other run's actor is ever a candidate.
    monkeypatch.setenv(RUN_MARKER, marker)

    def kill_our_actor_once_it_runs_the_arm() -> None:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and not killed:
            for pid in run_processes(marker=marker):
                try:
                    p = psutil.Process(pid)
                    if "ray::ArmActor" in " ".join(p.cmdline()) and any(
                        ARM_MODULE in " ".join(c.cmdline()) for c in p.children()
                    ):
                        p.kill()
                        killed.append(pid)
                        return
                except psutil.Error:
                    continue
            time.sleep(0.1)

    def started(_arm) -> None:
        threading.Thread(target=kill_our_actor_once_it_runs_the_arm, daemon=True).start()

    results: list = []
    executor = RayExecutor(tmp_path, FanoutSpec(max_concurrent=1), env={}, keys={})
    run_queue([arm], executor, tmp_path, {}, started, lambda a, r: results.append((a, r)))
    assert killed, "the actor was never seen running the arm"
    [(_, result)] = results
    assert result.status == "error" and result.error.startswith("the Ray actor running this arm died"), result.error
    assert "the Ray actor running this arm died" in " ".join(
        next(v for v in evaluate(tmp_path, PATHS.get).verdicts if v.path == "reload_weights").reasons
    )

    def ours() -> dict[int, str]:
        """The marked processes that are not Ray's own: Ray's raylet, GCS, dashboard and idle
        workers also carry the marker and wind down on their own schedule (one outlived 20 s
        on a loaded 2-core CI machine); the arm, its engine and a zygote must not."""
        found = {}
        for pid in run_processes(marker=marker):
            try:
                cmd = " ".join(psutil.Process(pid).cmdline())
            except psutil.Error:
                continue
            if not cmd.startswith("ray::") and "/ray/" not in cmd:
                found[pid] = cmd
        return found

    deadline = time.monotonic() + 60
    while ours() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not ours(), f"the arm or its engine outlived the killed actor: {ours()}"


FAULTY = "FaultyReloadQwen3ForCausalLM"


def _faulty_run(out: Path, fault: str, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    """A run on the fixture whose ``load_weights`` fails as ``fault`` says (``raise:N``/``hang:N``,
    N counting the cold start as 1), with the run's own marker to find what it leaves behind."""
    marker = uuid.uuid4().hex
    env = dict(os.environ, REFIT_HARNESS_PLANTED_FAULT=fault, **{RUN_MARKER: marker})
    proc = cli("run", "--out", str(out), "--model", str(tiny_qwen3(architecture=FAULTY)), *args, env=env, timeout=900)
    assert not run_processes(marker=marker), "a process of the run outlived it"
    assert (out / "index.html").is_file() and (out / "summary.md").is_file(), proc.stderr[-3000:]
    return proc, json.loads((out / "summary.json").read_text())["paths"]


def test_a_refit_raising_halfway_charges_its_segment_and_the_earlier_one_is_judged(tmp_path):
    # Load calls: 1 cold start; 2-5 the reload_weights segment (B, B again, B', A); 6 the
    # iterator segment's first refit, which loads half of B and raises. Without the sabotaged
    # twins, whose segments would take calls of their own between the two.
    proc, paths = _faulty_run(
        tmp_path / "raise", "raise:6", "--paths", "reload_weights,reload_weights_iterator", "--no-sabotage"
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert paths["reload_weights"]["verdict"] == "PASS", paths["reload_weights"]["reasons"]
    failed = paths["reload_weights_iterator"]
    assert failed["verdict"] == "ERROR", failed
    error = " ".join(failed["reasons"])
    assert "failed in segment reload_weights_iterator, step refit B" in error, error
    assert "planted fault: load_weights call 6 failed after" in error, error
    assert "refit-harness: error: " in proc.stderr and "reload_weights_iterator" in proc.stderr.splitlines()[-1]


def test_a_hung_refit_is_ended_by_the_arm_timeout_and_charged_to_its_segment(tmp_path):
    # The first refit of the only segment never returns (load call 2); the reference arms do
    # not refit, so they finish (or are reused from the test above: same model, same B).
    started = time.monotonic()
    proc, paths = _faulty_run(tmp_path / "hang", "hang:2", "--paths", "reload_weights", "--arm-timeout", "90")
    assert proc.returncode == 2, proc.stderr[-3000:]
    hung = paths["reload_weights"]
    error = " ".join(hung["reasons"])
    assert hung["verdict"] == "ERROR" and "timed out after 90 s" in error, error
    assert "failed in segment reload_weights, step refit B" in error, error
    assert time.monotonic() - started < 90 + 240, "the hung arm was not ended near its timeout"

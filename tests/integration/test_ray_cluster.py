"""A real two-node Ray cluster on this machine: a head node that offers no CPU, and a worker
node with its own temp dir, its own stage directory and a custom resource. Arms are pinned
to the worker by that resource; checkpoints reach it through the object store and results
come back the same way, so nothing relies on the head's disk.

Both nodes are started with ``ray start --block`` in process groups of their own and
ended by killing exactly those groups (``ray stop`` would stop every Ray on the machine).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from harness.checkpoints.tiny import tiny_qwen3
from harness.loopback import free_ports
from tests.helpers import cli

pytestmark = [pytest.mark.cpu]
REPO = Path(__file__).resolve().parents[2]
RAY = str(Path(sys.executable).with_name("ray"))
TRIES = 5


def _node_ports() -> list[str]:
    manager, objects, agent_grpc, agent_http, runtime_env, metrics = free_ports(6)
    return [
        f"--node-manager-port={manager}",
        f"--object-manager-port={objects}",
        f"--dashboard-agent-grpc-port={agent_grpc}",
        f"--dashboard-agent-listen-port={agent_http}",
        f"--runtime-env-agent-port={runtime_env}",
        f"--metrics-export-port={metrics}",
    ]


def _our_processes(marker: str) -> list[int]:
    ps = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout.splitlines()
    return [int(line.split(None, 1)[0]) for line in ps if marker in line and "ps -eo" not in line]


@pytest.fixture
def two_node_cluster():
    # Short paths: Ray's Unix sockets live under the temp dir and must fit in 107 bytes.
    root = Path(tempfile.mkdtemp(prefix="rh-ray-", dir="/tmp"))
    head_tmp, worker_tmp, stage = root / "h", root / "w", root / "w-stage"
    port, client_port = free_ports(2)
    # Neither an address to join elsewhere nor a "clusters disabled" switch left by another test.
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")}
    # Ray 2.60's `ray start --head` turns token authentication on, but a joining node and
    # the driver do not pick the token up: a private cluster on loopback goes without.
    # Under load the dashboard agent can take longer than the raylet waits for it (15 s).
    env.update(
        RAY_USAGE_STATS_ENABLED="0",
        RAY_AUTH_MODE="disabled",
        RAY_agent_register_timeout_ms="120000",
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    )
    nodes = []

    def start(args: list[str], log: Path, extra_env: dict[str, str]) -> None:
        # `ray start` gives its raylet a fixed 30 s to register (node.py), and the raylet first
        # waits for the node's dashboard agent, a Python process that can take longer than that
        # to start on a loaded machine; the node then exits. So: a few tries, each in a process
        # group of its own.
        for _ in range(TRIES):
            proc = subprocess.Popen(
                [RAY, "start", "--block", "--disable-usage-stats", *args],
                env={**env, **extra_env},
                stdout=open(log, "a"),
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            nodes.append(proc)
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline and proc.poll() is None:
                if "Ray runtime started" in log.read_text(errors="replace"):
                    return
                time.sleep(0.5)
            _end(proc)
        raise RuntimeError(f"Ray node did not come up in {TRIES} tries; log: {log.read_text(errors='replace')[-3000:]}")

    try:
        start(
            [
                "--head",
                f"--port={port}",
                f"--ray-client-server-port={client_port}",
                f"--temp-dir={head_tmp}",
                "--num-cpus=0",
                "--include-dashboard=false",
                f"--object-store-memory={512 << 20}",
                *_node_ports(),
            ],
            root / "head.log",
            {},
        )
        address = f"127.0.0.1:{port}"
        start(
            [
                f"--address={address}",
                f"--temp-dir={worker_tmp}",
                "--num-cpus=2",
                '--resources={"refit_worker": 2}',
                f"--memory={12 << 30}",
                f"--object-store-memory={512 << 20}",
                *_node_ports(),
            ],
            root / "worker.log",
            {"REFIT_HARNESS_STAGE_DIR": str(stage)},
        )
        yield {"address": address, "stage": stage, "env": env, "root": root}
    finally:
        for proc in reversed(nodes):  # exactly the process groups this fixture started
            _end(proc)
        # Ray daemons that left the group still name our temp dirs on their command line.
        deadline = time.monotonic() + 20
        while (left := _our_processes(str(root))) and time.monotonic() < deadline:
            time.sleep(1)
        for pid in _our_processes(str(root)):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(root, ignore_errors=True)
        assert not left, f"Ray processes of the test cluster outlived it: {left}"


def _end(proc: subprocess.Popen) -> None:
    """SIGTERM the node's process group (ray start stops its daemons), SIGKILL after 20 s."""
    for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def test_arms_run_on_a_second_node_and_return_through_the_object_store(two_node_cluster, tmp_path):
    cluster = two_node_cluster
    out = tmp_path / "run"
    proc = cli(
        "run",
        "--model",
        str(tiny_qwen3()),
        "--paths",
        "reload_weights",
        "--ray-address",
        cluster["address"],
        "--ray-resource",
        "refit_worker=1",
        "--out",
        str(out),
        env=cluster["env"],
        timeout=1200,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["paths"]["reload_weights"]["verdict"] == "PASS", summary["paths"]
    ran = [
        json.loads((out / "arms" / f"{a['arm']}.result.json").read_text())["data"]
        for a in summary["arms"]
        if not a["reused"]
    ]
    assert ran and all(a["status"] == "ok" for a in ran)
    nodes = {dict(map(tuple, a["environment"]))["ray_node"] for a in ran}
    assert len(nodes) == 1  # the head offers no CPU: every arm ran on the worker, by its resource
    for a in ran:  # the parent wrote each log from what came back through Ray
        assert "observe cold_" in (out / "arms" / f"{a['arm']}.log").read_text()
    # The checkpoints the arms read were staged on the worker, one directory per content.
    staged = [d for d in cluster["stage"].iterdir() if d.is_dir() and ".tmp" not in d.name]
    # A, B, B' and, for the sabotaged twin (run by default), B without the control tensor.
    assert len(staged) == 4, staged
    for a in ran:  # and the engines loaded them from there
        assert str(cluster["stage"]) in (out / "arms" / f"{a['arm']}.log").read_text()
    assert all((d / "config.json").is_file() and any(d.glob("*.safetensors")) for d in staged)
    plans = [json.loads((out / "arms" / f"{a['arm']}.plan.json").read_text())["data"] for a in ran]
    assert all(p["checkpoints"]["b"] == str(Path(summary["checkpoints"]["B"])) for p in plans)  # the head's paths

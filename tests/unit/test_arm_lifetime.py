"""An arm and everything in its process group die with the arm's parent, and at the arm's
own deadline, without anyone left to kill them (the parent's timeout lives in the parent)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# The arm: a group leader (as the runner starts it) with a grandchild in its group, like an
# engine core. It prints both pids, then waits forever.
ARM = textwrap.dedent("""
    import subprocess, sys, time
    from harness.arm.process import die_with_parent_and_deadline
    die_with_parent_and_deadline(float(sys.argv[1]))
    core = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    print(f"{__import__('os').getpid()} {core.pid}", flush=True)
    time.sleep(600)
""")

# The parent (the CLI or a Ray actor): starts the arm in its own session, reports, then idles.
PARENT = textwrap.dedent("""
    import subprocess, sys, time
    arm = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]], stdout=subprocess.PIPE, text=True,
                           start_new_session=True)
    print(arm.stdout.readline().strip(), flush=True)
    time.sleep(600)
""")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _start(deadline_s: float) -> tuple[subprocess.Popen, int, int]:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, ARM, str(deadline_s)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    arm, core = map(int, parent.stdout.readline().split())
    assert _alive(arm) and _alive(core)
    return parent, arm, core


def _gone_within(pids: tuple[int, ...], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not any(_alive(p) for p in pids):
            return True
        time.sleep(0.1)
    return False


def test_the_arm_and_its_engine_die_with_the_parent():
    parent, arm, core = _start(deadline_s=600)
    try:
        time.sleep(1.0)
        assert _alive(arm) and _alive(core)  # alive while the parent is
        parent.send_signal(signal.SIGKILL)  # a CI runner killing the CLI outright
        parent.wait()
        assert _gone_within((arm, core), 10), "the arm or its engine outlived its parent"
    finally:
        for pid in (arm, core):
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_the_arm_enforces_its_own_deadline():
    parent, arm, core = _start(deadline_s=2)
    try:
        assert _gone_within((arm, core), 15), "the arm ran past its own deadline"
        assert parent.poll() is None  # the parent was never involved
    finally:
        parent.kill()
        parent.wait()
        for pid in (arm, core):
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_the_last_shutdown_collects_nothing_and_collections_come_back_after_it():
    """vLLM's shutdown calls ``gc.collect``; inside ``collections_skipped`` that frees no cycle,
    and afterwards (an exception in between included) collections free it again."""
    import gc
    import weakref

    from harness.arm.process import collections_skipped

    class Node:
        pass

    def orphan_cycle() -> weakref.ref:
        a, b = Node(), Node()
        a.other, b.other = b, a  # only a collection frees a cycle
        return weakref.ref(a)

    gc.disable()  # no automatic collection between the steps
    try:
        with collections_skipped():
            kept = orphan_cycle()
            assert gc.collect() == 0
            assert kept() is not None
        try:
            with collections_skipped():
                raise RuntimeError("the shutdown raised")
        except RuntimeError:
            pass
        assert gc.collect() > 0
        assert kept() is None
    finally:
        gc.enable()

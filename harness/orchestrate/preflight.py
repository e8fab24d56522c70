"""The preflight's parent side: plan every cell of a scenario for machines of N GPUs, on
stand-in checkpoints (the model's config and tensor names, no weights), and have the engine
side check them (``harness.arm.preflight``, in a process of its own: the parent never imports
vLLM, torch or Ray). ``refit-harness preflight`` and the start of every GPU run use it."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from harness import store
from harness.errors import InfrastructureError
from harness.plan import PathNeeds, PreflightArm, PreflightCell, PreflightFinding, PreflightRequest, make_plan
from harness.spec.run import RunSpec

PREFLIGHT_TIMEOUT_S = 900.0
"""The engine side's whole budget (vLLM's import, one Ray start, every cell)."""


def plan_cells(
    cell_id: str, spec: RunSpec, checkpoints, gpus: tuple[int, ...], resolve=None, adapters=None
) -> tuple[PreflightCell, ...]:
    """One ``PreflightCell`` per GPU count: the cell's arms as the planner makes them on a
    machine of that many GPUs, and the paths it would SKIP there, with the reason. LoRA paths
    get ``adapters``, or the harness's own adapters for the checkpoint (made from its headers)."""
    from harness.orchestrate.fanout import FanoutSpec, arm_resources
    from harness.orchestrate.resolve import resolve_engine, resolve_prompts, unavailable_paths
    from harness.paths import PATHS

    classes = {p: PATHS.get(p) for p in spec.paths}
    needs = {p: PathNeeds.of(cls) for p, cls in classes.items()}
    resolved = resolve_engine(resolve_prompts(spec), checkpoints.a) if resolve is None else resolve
    if adapters is None and any(cls.requirements.lora for cls in classes.values()):
        from harness.checkpoints.lora import prepare_adapters

        adapters = prepare_adapters(checkpoints.a, spec.lora, spec.lora_target, spec.perturb, False)
    if any(n.trains for n in needs.values()) and not checkpoints.trainer_steps:
        # The trainer's steps stand in as B: the preflight places and configures arms, it trains nothing.
        steps = spec.trainer.steps + (1 if spec.sabotage else 0)
        checkpoints = replace(checkpoints, trainer_steps=(checkpoints.b,) * steps)
    cells = []
    for n in gpus:
        unavailable = unavailable_paths(classes, spec.engine.tensor_parallel_size, n, cuda=True, packages=False)
        plan = make_plan(resolved, checkpoints, needs, unavailable, adapters)
        arms = tuple(
            PreflightArm(arm, float(arm_resources(arm, FanoutSpec(), cuda=True).get("num_gpus", 0)))
            for arm in plan.arms
        )
        cells.append(
            PreflightCell(id=cell_id, gpus=n, arms=arms, skipped=plan.skipped, packages=spec.requires_packages)
        )
    return tuple(cells)


def scenario_request(scenario, gpus: tuple[int, ...], model: str | None = None) -> tuple[PreflightRequest, list[str]]:
    """The request for every cell group of ``scenario`` (its model, or ``model``), and notes on
    where each model's config came from."""
    from harness.checkpoints.builders import with_model
    from harness.checkpoints.standin import standin
    from harness.spec.scenario import expand

    cells: list[PreflightCell] = []
    notes: list[str] = []
    made: dict[tuple[str, str], tuple] = {}
    for group in expand(scenario):
        source = model or (with_model(group).spec.model if group.model.builder else group.model.path or "")
        key = (source, group.spec.engine.dtype)
        if key not in made:
            made[key] = standin(source, group.spec.engine.dtype)
            notes.append(f"{source} ({group.spec.engine.dtype}): config from {made[key][1]}; tensors stand in")
        checkpoints = made[key][0]
        spec = replace(group.spec, model=checkpoints.a, sabotage=False)
        cells += plan_cells(group.id, spec, checkpoints, gpus)
    return PreflightRequest(scenario=scenario.name, cells=tuple(cells)), notes


def run(request: PreflightRequest, python: str | None = None) -> tuple[PreflightFinding, ...]:
    """The engine side's findings for ``request`` (``python``: the interpreter of a build)."""
    with tempfile.TemporaryDirectory(prefix="refit-preflight-") as tmp:
        req, out = Path(tmp) / "request.json", Path(tmp) / "findings.json"
        store.dump(request, req, "preflight_request")
        env = dict(os.environ, PYTHONUNBUFFERED="1", VLLM_ENABLE_V1_MULTIPROCESSING="0")
        try:
            done = subprocess.run(
                [python or sys.executable, "-m", "harness.arm.preflight", str(req), str(out)],
                capture_output=True,
                text=True,
                env=env,
                timeout=PREFLIGHT_TIMEOUT_S,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            raise InfrastructureError(f"the preflight did not finish in {PREFLIGHT_TIMEOUT_S:.0f} s") from None
        if done.returncode != 0 or not out.exists():
            tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
            raise InfrastructureError(f"the preflight's engine side exited with code {done.returncode}: {tail[:600]}")
        return store.load(tuple[PreflightFinding, ...], out, "preflight_findings")


def problems(findings: tuple[PreflightFinding, ...]) -> list[PreflightFinding]:
    return [f for f in findings if f.kind == "problem"]

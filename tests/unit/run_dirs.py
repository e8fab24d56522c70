"""A report directory built from synthetic records (no vLLM): run.json and arms/*.result.json
as a real run leaves them, for tests of everything that reads the disk."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from harness import store
from harness.judge.evaluation import RunRecord
from harness.paths import PATHS
from harness.plan import PathNeeds, make_plan
from harness.run_dir import RunDir
from harness.spec.checkpoint_set import CheckpointSet
from harness.spec.run import RunSpec
from tests.records import A, B, arm, obs, segment


def write_run(
    out: Path,
    paths=("reload_weights", "http_reload"),
    tensor_names: dict[str, str] | None = None,
    errors: dict[str, str] | None = None,
    failed: dict[str, tuple[str, str]] | None = None,
    drop: dict[str, tuple[str, ...]] | None = None,
) -> RunRecord:
    """Every arm finished and every path passes, unless ``errors`` (arm name -> error text),
    ``failed`` (arm name -> (failed path, failed step)) or ``drop`` (path -> missing labels) say
    otherwise. ``tensor_names`` renames the synthetic tensors (e.g. to hostile names)."""
    rename = tensor_names or {}
    a = {rename.get(k, k): v for k, v in A.items()}
    b = {rename.get(k, k): v for k, v in B.items()}
    control = {**b, rename.get("qkv_proj.<kernel-output>", "qkv_proj.<kernel-output>"): "b'-k"}
    spec = RunSpec(model=str(out / "model"), paths=tuple(paths))
    cs = CheckpointSet(a="/a", b="/b", b_control="/c", control_tensor="q_proj.weight")
    needs = {p: PathNeeds.of(PATHS.get(p)) for p in paths}
    plan = make_plan(spec, cs, needs, {})
    record = RunRecord(spec=spec, checkpoints=cs, plan=plan, git_sha="test", started="2026-11-30T00:00:00Z")
    store.dump(record, out / "run.json", "run_record")
    for arm_plan in plan.arms:
        error = (errors or {}).get(arm_plan.name)
        if arm_plan.role == "subject":
            observations = [obs(arm_plan.cold_label, a)]
            for p in arm_plan.paths:
                observations += segment(p, warm_b=b, warm_a=a, control=control, drop=(drop or {}).get(p, ()))
        else:
            observations = [obs("cold_B", b)]
        result = arm(arm_plan.name, arm_plan.role, *observations, paths=arm_plan.paths, error=error)
        where = (failed or {}).get(arm_plan.name)
        if where:
            result = dataclasses.replace(result, failed_path=where[0], failed_step=where[1])
        store.dump(result, RunDir(out).arm(arm_plan).result, "arm_result")
    return record

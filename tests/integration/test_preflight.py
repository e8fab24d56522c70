"""``refit-harness preflight -s gpu-nightly``: every GPU cell checked on this CPU against the
installed vLLM's own classes, and its arms and trainers placed on a Ray told it has 1, 2 and 4
GPUs (no engine starts; one vLLM import and one Ray start per preflight). Planted
misconfigurations must fail it: a trainer that cannot be placed (the arm holds only its engine's
GPUs, as before issue 20), and the fixed 64 MiB fp32 KV cache the nightly had."""

from __future__ import annotations

import dataclasses

from harness.orchestrate import preflight
from scenarios import SCENARIOS
from tests.helpers import cli


def test_the_gpu_nightly_passes_its_preflight_on_1_2_and_4_gpus():
    run = cli("preflight", "-s", "gpu-nightly", "--gpus", "1,2,4", timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "no problems" in run.stdout
    # Cells that need more GPUs than a machine has are SKIPPED there, with the reason.
    assert "SKIP gpus: transfer_nccl[Qwen3-0.6B-eager-tp2-bf16]: on 2 GPU(s): transfer_nccl needs 3 GPUs" in run.stdout
    assert "SKIP gpus: transfer_nccl[Qwen3-0.6B-eager-tp2-bf16]: on 4 GPU(s)" not in run.stdout
    # Without Tencent's hpc module (no extra installs it), each HPC cell group is a SKIP, not a problem.
    hpc = [line for line in run.stdout.splitlines() if line.startswith("SKIP packages: hunyuan-v3-")]
    assert len(hpc) == 4 and all("module hpc is not installed" in line for line in hpc), run.stdout


def test_planted_misconfigurations_fail_the_preflight():
    nightly = SCENARIOS.get("gpu-nightly")()
    request, _ = preflight.scenario_request(
        dataclasses.replace(nightly, paths=("reload_weights", "transfer_nccl"), modes=("eager",), tp_sizes=(1,)), (2,)
    )
    cell = request.cells[0]
    planted = []
    for a in cell.arms:
        if a.plan.requirements.weight_transfer_backend == "nccl":
            # The arm asks only its engine's GPU: the trainer's own GPU is not in the arm's Ray.
            a = dataclasses.replace(a, gpus=float(a.plan.engine.tensor_parallel_size))
        elif a.plan.role == "reference":
            # The nightly's old engine: fp32 and a fixed 64 MiB KV cache.
            engine = dataclasses.replace(a.plan.engine, dtype="float32", kv_cache_memory_bytes=64 << 20)
            a = dataclasses.replace(a, plan=dataclasses.replace(a.plan, engine=engine))
        planted.append(a)
    findings = preflight.run(dataclasses.replace(request, cells=(dataclasses.replace(cell, arms=tuple(planted)),)))
    problems = [f.line() for f in preflight.problems(findings)]
    assert any("placement" in p and "subject-transfer_nccl" in p and "trainer rank 0" in p for p in problems), problems
    assert any("kv-cache" in p and "reference" in p and "0.11 GiB KV cache is needed" in p for p in problems), problems
    assert any("attention" in p and "dtype not supported" in p for p in problems), problems
    assert len(problems) == 3, problems


def test_a_gpu_run_starts_with_the_preflight_and_stops_at_a_problem(tmp_path):
    import pytest

    from harness.checkpoints.standin import standin
    from harness.errors import UsageError
    from harness.orchestrate.execute import preflight_run
    from harness.spec.engine_config import encode
    from harness.spec.run import EngineSpec, RunSpec

    cs, _ = standin("Qwen/Qwen3-0.6B", "float32")
    pinned = EngineSpec(engine_args=encode({"attention_backend": "FLASH_ATTN"}))
    old = RunSpec(model=cs.a, paths=("reload_weights",), engine=pinned)
    with pytest.raises(UsageError, match="problem"):
        preflight_run(old, cs, tmp_path, lambda line: None)  # fp32, 64 MiB: what the nightly had
    assert "kv-cache" in (tmp_path / "preflight.json").read_text()

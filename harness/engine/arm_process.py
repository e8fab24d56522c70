"""Entry point of one isolated engine arm: ``python -m harness.engine.arm_process PLAN RESULT``.

Reads an ArmPlan, starts a real vLLM engine, runs the steps, and writes an ArmResult.
The result is rewritten after every observation, so a crash or kill keeps what was
already measured.
"""

from __future__ import annotations

import platform
import sys
import time
import traceback
from pathlib import Path

from harness import store
from harness.plan import ArmPlan
from harness.records import ArmResult, ModelInfo, Observation, PromptOutput, TensorRecord

WORKER_EXTENSION = "harness.engine.worker_ext.RefitObserver"


def build_llm(arm: ArmPlan, extra: dict):
    from vllm import LLM

    e = arm.engine
    return LLM(
        model=arm.checkpoints.directory(arm.start), skip_tokenizer_init=True, dtype=e.dtype,
        enforce_eager=e.mode == "eager", kv_cache_memory_bytes=e.kv_cache_memory_bytes,
        max_model_len=e.max_model_len, max_num_seqs=e.max_num_seqs, seed=e.seed,
        tensor_parallel_size=e.tensor_parallel_size, enable_prefix_caching=e.enable_prefix_caching,
        worker_extension_cls=WORKER_EXTENSION, **extra,
    )


def generate(llm, arm: ArmPlan) -> tuple[PromptOutput, ...]:
    from vllm import SamplingParams

    p = arm.prompts
    params = SamplingParams(temperature=0.0, max_tokens=p.max_tokens, detokenize=False, logprobs=p.logprobs)
    results = llm.generate([{"prompt_token_ids": list(ids)} for ids in p.token_ids], params, use_tqdm=False)
    outputs = []
    for i, result in enumerate(results):
        completion = result.outputs[0]
        per_position = tuple(
            tuple((int(tok), float(lp.logprob)) for tok, lp in sorted(pos.items(), key=lambda kv: kv[1].rank)[: p.logprobs])
            for pos in (completion.logprobs or [])
        )
        outputs.append(PromptOutput(prompt=i, token_ids=tuple(int(t) for t in completion.token_ids), logprobs=per_position))
    return tuple(outputs)


def observe(llm, arm: ArmPlan, label: str) -> Observation:
    per_rank = llm.collective_rpc("refit_harness_census")
    multi = len(per_rank) > 1
    tensors = tuple(
        TensorRecord(
            name=f"rank{r['rank']}:{t['name']}" if multi else t["name"], kind=t["kind"], dtype=t["dtype"],
            shape=tuple(t["shape"]), device=t["device"], address=t["address"], digest=t["digest"],
            nan_count=t["nan_count"], absmax=t["absmax"],
        )
        for r in per_rank for t in r["tensors"]
    )
    first = per_rank[0]
    model = ModelInfo(
        architecture=first["architecture"],
        packed_modules_mapping=tuple((k, tuple(v)) for k, v in sorted(first["packed_modules_mapping"].items())),
        world_size=len(per_rank),
    )
    # Census before generation, so every arm's census sees the same kind of moment.
    return Observation(label=label, tensors=tensors, outputs=generate(llm, arm), model=model)


def environment() -> tuple[tuple[str, str], ...]:
    import torch
    import vllm

    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"cpu ({platform.processor() or platform.machine()})"
    return (("vllm", vllm.__version__), ("torch", torch.__version__), ("device", device),
            ("python", platform.python_version()))


def run(arm: ArmPlan, result_path: Path) -> ArmResult:
    started = time.monotonic()
    observations: list[Observation] = []
    env: tuple[tuple[str, str], ...] = ()

    def save(status: str, error: str | None) -> ArmResult:
        result = ArmResult(arm=arm.name, role=arm.role, path=arm.path, status=status, error=error,
                           observations=tuple(observations), seconds=round(time.monotonic() - started, 2),
                           environment=env)
        store.dump(result, result_path, "arm_result")
        return result

    path = None
    llm = None
    try:
        env = environment()
        if arm.path:
            from harness.paths import PATHS

            path = PATHS.get(arm.path)()
        llm = build_llm(arm, path.engine_kwargs() if path else {})
        if path:
            path.attach(llm)
        for step in arm.steps:
            print(f"[{arm.name}] {step.action} {step.argument}", flush=True)
            if step.action == "refit":
                path.refit(llm, arm.checkpoints.directory(step.argument))
            else:
                observations.append(observe(llm, arm, step.argument))
                # Keep what was measured; if the arm dies later, this file says so.
                save("error", f"arm stopped after observing {step.argument!r}")
        return save("ok", None)
    except Exception as exc:  # noqa: BLE001 - an arm's failure is a value
        traceback.print_exc()
        return save("error", f"{type(exc).__name__}: {exc}".strip()[:2000])
    finally:
        if path is not None:
            path.close()
        del llm


def main(argv: list[str]) -> int:
    plan_path, result_path = Path(argv[0]), Path(argv[1])
    arm = store.load(ArmPlan, plan_path, "arm_plan")
    result = run(arm, result_path)
    return 0 if result.status == "ok" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""``make bench``: speed goals, measured on a real engine (not timed tests).

Recorder overhead: wall time of one prefill with the kernel-input recorder on, divided by
the same prefill without it (same batch, same engine; the recorder's start/stop RPCs and
naming pass included). Goal: at most 3x. Results go to ``reports/bench.json``.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

GOAL = 3.0
REPEATS = 7


def main() -> int:
    from harness import checkpoints
    from harness.engine.handles import LocalEngine
    from harness.paths.base import EngineRequirements
    from harness.pipeline import resolve_prompts
    from harness.plan import PathNeeds, make_plan
    from harness.spec import PromptSpec, RunSpec

    model = str(checkpoints.tiny_qwen3())
    spec = resolve_prompts(RunSpec(model=model))
    cs = checkpoints.CheckpointSet(a=model, b=model, b_control=model, control_tensor="")
    arm = make_plan(spec, cs, {"reload_weights": PathNeeds(EngineRequirements(), ("B",))}, {}).arms[0]
    engine = LocalEngine(arm)
    batch = PromptSpec(token_ids=arm.prompts.token_ids, max_tokens=1, logprobs=1)

    def plain() -> None:
        engine.generate(batch)

    def recorded() -> None:
        engine.rpc("refit_harness_recorder_start")
        engine.generate(batch)
        engine.rpc("refit_harness_recorder_stop")

    for fn in (plain, recorded):  # warm up both
        fn()
    timings = {"plain": [], "recorded": []}
    for _ in range(REPEATS):  # interleaved, so drift hits both alike
        for name, fn in (("plain", plain), ("recorded", recorded)):
            start = time.perf_counter()
            fn()
            timings[name].append(time.perf_counter() - start)
    plain_s, recorded_s = (statistics.median(timings[k]) for k in ("plain", "recorded"))
    ratio = recorded_s / plain_s
    result = {"benchmark": "recorder_overhead", "batch_prompts": len(batch.token_ids), "repeats": REPEATS,
              "plain_prefill_s": plain_s, "recorded_prefill_s": recorded_s, "ratio": ratio, "goal": GOAL,
              "goal_met": ratio <= GOAL}
    Path("reports").mkdir(exist_ok=True)
    Path("reports/bench.json").write_text(json.dumps(result, indent=2))
    print(f"recorder overhead: {recorded_s * 1e3:.1f} ms recorded vs {plain_s * 1e3:.1f} ms plain prefill "
          f"= {ratio:.2f}x (goal <= {GOAL}x: {'met' if ratio <= GOAL else 'MISSED'})")
    engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

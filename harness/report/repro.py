"""``repro.py``: a standalone script, pasteable into an upstream vLLM issue, that reproduces
a FAIL or XFAIL without the harness: cold start on B vs a cold start on A that generates, is
refit the same way, and generates again (the arm's sequence, and an RL loop's: state a model
makes on its first forward exists before the refit), greedy tokens of the run's prompts, exit
1 when they differ.

Written into the report directory from the records alone, for stock architectures and the
harness's planted-bug fixtures (which run where refit-harness is installed: its vLLM plugin
registers them), not for a user's out-of-tree models, and for paths whose refit is a few lines
of public vLLM API.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from harness.judge.evaluation import Evaluation
from harness.judge.verdict import VerdictStatus
from harness.run_dir import REPRO

# path -> (extra LLM(...) arguments, lines that refit `llm` to `b`), public vLLM API only.
REFITS: dict[str, tuple[dict, str]] = {
    "reload_weights": ({}, 'llm.collective_rpc("reload_weights", kwargs={"weights_path": b})'),
    "discard_reload": (
        {},
        'llm.collective_rpc("reset_weights")\n    llm.collective_rpc("reload_weights", kwargs={"weights_path": b})',
    ),
    "prefix_cache": (
        {"enable_prefix_caching": True},
        'llm.collective_rpc("reload_weights", kwargs={"weights_path": b})\n    llm.reset_prefix_cache()',
    ),
    "compiled": ({"enforce_eager": False}, 'llm.collective_rpc("reload_weights", kwargs={"weights_path": b})'),
}

_TEMPLATE = '''#!/usr/bin/env python3
"""{title}

Reproduces a refit-harness finding with vLLM alone: greedy tokens after refitting an engine
started on checkpoint A to checkpoint B ({path}) differ from a cold start on B.
Measured: vLLM {vllm}, torch {torch}, {device}, dtype {dtype}, model class {architecture}.{fixture}
Verdict there: {verdict}. {reason}

Usage: python {script} [A_DIR B_DIR]   (defaults: the checkpoints of the original run)
Exit code: 1 when the token lists differ, or when the logprobs of the generated tokens differ
by more than LOGPROB_TOLERANCE (refit-harness's tolerance plus the difference measured between
two cold starts); 0 otherwise.
"""

import gc
import sys

from vllm import LLM, SamplingParams

A = {a!r}
B = {b!r}
PROMPTS = {prompts!r}
ENGINE = {engine!r}
MAX_TOKENS = {max_tokens}
LOGPROB_TOLERANCE = {tolerance!r}


def greedy(llm):
    """Greedy token ids per prompt, and the logprob of each generated token."""
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, detokenize=False, logprobs=1)
    outputs = llm.generate([{{"prompt_token_ids": p}} for p in PROMPTS], params)
    tokens = [list(o.outputs[0].token_ids) for o in outputs]
    logprobs = [[pos[t].logprob for t, pos in zip(o.outputs[0].token_ids, o.outputs[0].logprobs)] for o in outputs]
    return tokens, logprobs


def main():
    a, b = (sys.argv[1], sys.argv[2]) if len(sys.argv) == 3 else (A, B)
    llm = LLM(model=b, **{cold_engine})
    cold, cold_lp = greedy(llm)
    del llm
    gc.collect()

    llm = LLM(model=a, **{warm_engine})
    greedy(llm)  # on A first, as an RL loop does
    {refit}
    warm, warm_lp = greedy(llm)

    differ = 0
    for i, (c, w) in enumerate(zip(cold, warm)):
        first = next((j for j, (x, y) in enumerate(zip(c, w)) if x != y), None)
        # Logprobs are comparable up to the first differing token only.
        shift = max((abs(x - y) for x, y in zip(cold_lp[i][:first], warm_lp[i][:first])), default=0.0)
        differ += first is not None or shift > LOGPROB_TOLERANCE
        print(f"prompt {{i}}: cold B          {{c}}")
        print(f"prompt {{i}}: A + refit to B  {{w}}" + ("" if first is None else f"   <- differs at token {{first}}")
              + (f"   logprobs differ by {{shift:.3g}}" if shift > LOGPROB_TOLERANCE else ""))
    print(f"{{differ}} of {{len(PROMPTS)}} prompt(s) differ" if differ else "identical: not reproduced")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
'''


def is_stock(architecture: str | None) -> bool:
    """Not one of the harness's planted-bug fixtures nor a user's out-of-tree model."""
    from harness.spec.architectures import FIXTURE_ARCHITECTURES

    return reproducible(architecture) and architecture not in FIXTURE_ARCHITECTURES


def reproducible(architecture: str | None) -> bool:
    """A class vLLM (or the installed refit-harness plugin) registers: not a user's out-of-tree
    model, which only the harness's ``REFIT_HARNESS_MODELS`` registers."""
    from harness.settings import EXTRA_MODELS_ENV
    from harness.spec.architectures import extra_architectures

    try:
        extra = extra_architectures(os.environ.get(EXTRA_MODELS_ENV))
    except ValueError:
        extra = {}
    return bool(architecture) and architecture not in extra


def repro_script(ev: Evaluation) -> str | None:
    """The script for the first FAIL/XFAIL path with a plain-API refit, or None."""
    record = ev.record
    try:
        config = json.loads((Path(record.checkpoints.a) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    architecture = (config.get("architectures") or [None])[0]
    if not reproducible(architecture):
        return None
    failed = [v for v in ev.verdicts if v.status in (VerdictStatus.FAIL, VerdictStatus.XFAIL) and v.path in REFITS]
    if not failed:
        return None
    verdict = failed[0]
    extra, refit = REFITS[verdict.path]
    prompts = record.plan.arms[0].prompts  # as the arms ran them: resolved from the model's vocabulary
    e = record.plan.arms[0].engine  # as the arms ran it too: a KV cache sized from the model's config
    engine = dict(
        skip_tokenizer_init=True,
        dtype=e.dtype,
        enforce_eager=e.mode == "eager",
        kv_cache_memory_bytes=e.kv_cache_memory_bytes,
        max_model_len=e.max_model_len,
        max_num_seqs=e.max_num_seqs,
        seed=e.seed,
        tensor_parallel_size=e.tensor_parallel_size,
        **e.vllm_kwargs(),  # the run's engine arguments (--engine-arg, --engine-config, a scenario's configuration)
    )
    env = dict(next((a.environment for a in ev.arms if a.environment), ()))
    title = next((r.split(": ", 1)[1] for r in verdict.reasons if r.startswith("known issue on ")), None)
    title = f"vLLM refit finding: {verdict.path} on {architecture}" if title is None else title
    reason = next(
        (r for r in verdict.reasons if "diverges at token" in r), verdict.reasons[0] if verdict.reasons else ""
    )
    return _TEMPLATE.format(
        script=REPRO,
        title=f"refit-harness repro: {verdict.path} on {architecture} ({verdict.status.value})",
        path=verdict.path,
        vllm=env.get("vllm", "?"),
        torch=env.get("torch", "?"),
        device=env.get("device", "?"),
        dtype=e.dtype,
        architecture=architecture,
        fixture=""
        if is_stock(architecture)
        else "\nIt is a refit-harness planted-bug fixture: run this where refit-harness is installed.",
        verdict=verdict.status.value,
        reason=_wrap(f"{reason} Known as: {title}" if verdict.status is VerdictStatus.XFAIL else reason),
        a=record.checkpoints.a,
        b=record.checkpoints.b,
        prompts=[list(p) for p in prompts.token_ids or ()],
        engine=engine,
        max_tokens=prompts.max_tokens,
        tolerance=_tolerance(ev, verdict.path),
        cold_engine="ENGINE",
        warm_engine=f"{{**ENGINE, **{extra!r}}}" if extra else "ENGINE",
        refit=refit,
    )


def _tolerance(ev: Evaluation, path: str) -> float:
    """The harness's logprob tolerance plus the largest difference between two cold starts."""
    comparison = next((c for c in ev.comparisons if c.path == path), None)
    noise = (
        max((d.max_logprob_diff for d in comparison.tokens if d.check == "noise"), default=0.0) if comparison else 0.0
    )
    return round(ev.record.spec.judge.logprob_atol + noise, 6)


def _wrap(text: str, width: int = 92) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(text.replace('"""', "'''"), width))

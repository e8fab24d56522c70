"""The vLLM work of ``refit-harness run --paths reload_weights``, with no observation.

``python -m benchmarks.bare_vllm A B B_CONTROL``: the same three engine lifetimes the harness
plans (a subject cold-started on A and refitted through ``reload_weights`` to B, B, B' and A
with a generation after each; a reference and a noise engine cold-started on B with one
generation), two engines at a time, the same engine settings, engine-core layout and thread
placement.
No census, no recorder, no records: the floor the harness is measured against.

``python -m benchmarks.bare_vllm --one ROLE A B B_CONTROL`` runs one engine lifetime.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from harness.checkpoints.read import vocab_size
from harness.spec.prompts import shared_prefix_prompts
from harness.spec.run import EngineSpec, PromptSpec

SUBJECT_TARGETS = ("B", "B", "B_control", "A")  # ReloadPath.refit_targets


def one(role: str, dirs: dict[str, str]) -> None:
    from vllm import LLM, SamplingParams

    e, prompts = EngineSpec(), PromptSpec()
    token_ids = shared_prefix_prompts(vocab_size(dirs["A"]) or 256)  # the harness's default prompts
    llm = LLM(
        model=dirs["A" if role == "subject" else "B"],
        skip_tokenizer_init=True,
        dtype=e.dtype,
        enforce_eager=True,
        kv_cache_memory_bytes=e.kv_cache_memory_bytes,
        max_model_len=e.max_model_len,
        max_num_seqs=e.max_num_seqs,
        seed=e.seed,
        tensor_parallel_size=e.tensor_parallel_size,
        enable_prefix_caching=False,
    )
    params = SamplingParams(temperature=0.0, max_tokens=prompts.max_tokens, detokenize=False, logprobs=prompts.logprobs)
    batch = [{"prompt_token_ids": list(p)} for p in token_ids]
    llm.generate(batch, params, use_tqdm=False)
    if role == "subject":
        for target in SUBJECT_TARGETS:
            llm.collective_rpc("reload_weights", kwargs={"weights_path": dirs[target]})
            llm.generate(batch, params, use_tqdm=False)


def run_all(dirs: dict[str, str], env: dict[str, str]) -> float:
    """Wall time of the three lifetimes, two at a time (subject beside reference, then noise)."""
    start = time.perf_counter()
    args = [dirs["A"], dirs["B"], dirs["B_control"]]

    # The engine-core layout the harness's arms use (EngineSpec.engine_core_process).
    layout = {"VLLM_ENABLE_V1_MULTIPROCESSING": "1" if EngineSpec().engine_core_process else "0"}

    def launch(role: str) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-m", "benchmarks.bare_vllm", "--one", role, *args],
            env={**os.environ, **env, **layout},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    running = [launch("subject"), launch("reference")]
    waiting = ["noise"]
    while running:
        for proc in list(running):
            if proc.poll() is not None:
                if proc.returncode != 0:
                    raise RuntimeError(f"bare vLLM engine exited with {proc.returncode}")
                running.remove(proc)
                if waiting:
                    running.append(launch(waiting.pop()))
        time.sleep(0.2)
    return time.perf_counter() - start


if __name__ == "__main__":
    if sys.argv[1] == "--one":
        one(sys.argv[2], dict(zip(("A", "B", "B_control"), sys.argv[3:6])))
    else:
        print(f"{run_all(dict(zip(('A', 'B', 'B_control'), sys.argv[1:4])), {}):.1f} s")

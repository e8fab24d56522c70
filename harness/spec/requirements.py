"""What a reload path asks of its engine, as plain data the planner can read.

These live in the spec layer, not in ``harness.paths``, so that the planner never imports
the path plug-ins (or anything they import) to plan a run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from harness.spec.run import Mode

EngineKind = Literal["llm", "ray_llm", "http"]
"""How a subject engine is run (see ``EngineRequirements.kind``)."""
RefitTarget = str
"""The weights a refit updates an engine to: ``A``, ``B``, ``B_control`` (B', the positive
control), or a live trainer's optimizer step ``T<k>`` / ``T<k>_control``
(``harness.spec.checkpoint_set.trainer_target``)."""
LoRARole = Literal["adapter", "base"]
"""What a LoRA engine's checkpoints A, B, B' are (see ``EngineRequirements.lora``)."""


DATA_PARALLEL_RANK_HEADER = "X-data-parallel-rank"
"""The request header by which ``vllm serve`` pins a request to one data-parallel rank."""


def data_parallel_rank(prompt: int, data_parallel_size: int) -> int | None:
    """The rank prompt ``prompt``'s requests are pinned to: round-robin, so every rank serves
    some observed prompts; None without data parallelism."""
    return prompt % data_parallel_size if data_parallel_size > 1 else None


@dataclass(frozen=True)
class EngineRequirements:
    """How the subject engine of a path must be built. Paths with equal requirements
    share one engine, one segment after another, so cold starts do not grow with paths."""

    kind: EngineKind = "llm"
    """``llm``: ``vllm.LLM`` in the arm process; ``ray_llm``: ``LLM`` inside a Ray actor (as
    RL frameworks run it, so a Ray trainer can drive it); ``http``: a real ``vllm serve``."""
    load_format: str = "auto"
    """``LLM(load_format=...)`` for the cold start (``dummy`` starts from random weights)."""
    enable_prefix_caching: bool | None = None
    """Override the run's prefix-caching setting."""
    weight_transfer_backend: str | None = None
    """Build the engine with ``WeightTransferConfig(backend=...)``."""
    mode: Mode | None = None
    """Override the run's eager/compiled mode."""
    enable_sleep_mode: bool = False
    """Build the engine with ``enable_sleep_mode=True``."""
    apart: str = ""
    """Keeps the engine apart from paths with otherwise equal requirements (equal ``apart``
    share): for paths whose transport state in the engine another path would replace (the
    worker holds one weight-transfer group; a second sender's init replaces the first's)."""
    restarts: bool = False
    """The path ends the engine and starts a new one at every refit: it cannot share an
    engine, and addresses or hook counts are not comparable across its refits."""
    isolated: bool = False
    """The path gets an engine of its own: a refit vLLM may refuse midway (the raw
    ``load_weights`` on CPU) must not end the segments of other paths."""
    data_parallel_size: int = 1
    """``vllm serve --data-parallel-size``: engine cores (ranks) behind one API server, each
    holding the whole model. Above 1 (``kind="http"`` only), observed greedy requests are pinned
    round-robin to the ranks (``X-data-parallel-rank``), so every rank is judged against cold B."""
    lora: LoRARole | None = None
    """A LoRA engine (``enable_lora``): ``adapter``, the base stays at A and A, B, B' are the
    run's adapters (``--lora``, ``--lora-target``), served by every request; ``base``, adapter A
    is served by every request while A, B, B' are the base weights. The path is judged against
    cold LoRA engines of the same role (``reference-lora-<role>``), never the plain reference."""


@dataclass(frozen=True)
class EngineRestart:
    """What a refit returns when it replaces the engine: the arm closes the old engine
    and cold-starts a new one from ``model`` with ``load_format``."""

    model: str
    """Directory the new engine starts from."""
    load_format: str
    """``LLM(load_format=...)`` of the new engine."""

"""Every use of vLLM's private API, in one place, each with why no public way exists (checked
on vLLM 0.32). A vLLM upgrade that moves one of these breaks here, not across the harness.

Engine side only: imports vLLM lazily, inside each function.
"""

from __future__ import annotations

from typing import Any


def transfer_backend_registered(factory: Any, name: str) -> bool:
    """Whether a weight-transfer backend is registered in one of vLLM's factories.

    Private: ``WeightTransferEngineFactory._registry`` / ``WeightTransferTrainerFactory._registry``.
    Why: the factories have ``register_engine`` (which raises a bare ``ValueError`` when the
    name is taken) and ``create_engine``/``trainer_init`` (which build and connect an
    engine), but no lookup; a plugin that may run twice in one process must ask first."""
    return name in factory._registry


def trainer_engine_class(backend: str) -> Any:
    """The trainer-side engine class registered for ``backend`` (its ``init_info_cls`` is the
    backend's own ``TrainerInitInfo`` dataclass).

    Private: ``WeightTransferTrainerFactory._registry``. Why: ``trainer_init`` takes an
    already-typed ``TrainerInitInfo`` and resolves the class internally; nothing public maps
    a backend name to its ``TrainerInitInfo`` class."""
    from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory

    return WeightTransferTrainerFactory._registry[backend]()


def shutdown_engine_core(llm: Any) -> None:
    """Stop an in-process ``LLM``'s engine core and its workers now, and wait for them.

    Private: ``LLM.llm_engine.engine_core.shutdown()``. Why: ``LLM`` has no ``close`` or
    ``shutdown``; dropping it relies on ``__del__`` and the garbage collector, which neither
    waits for the workers nor happens at a known time."""
    llm.llm_engine.engine_core.shutdown()


def forward_step_tensors(ctx: Any) -> list[Any]:
    """The per-step inputs a forward context holds (attention metadata: slot mapping, block
    tables, lengths), to exclude from the kernel-input recorder.

    Private: ``ForwardContext.attn_metadata`` / ``.slot_mapping`` and each metadata object's
    attributes (``get_forward_context`` itself is public). Why: vLLM exposes no list of the
    step's input tensors; these attributes are where the model's forward finds them."""
    trees: list[Any] = []
    meta = getattr(ctx, "attn_metadata", None)
    for m in meta.values() if isinstance(meta, dict) else [meta]:
        if m is not None:
            trees.append(list(vars(m).values()) if hasattr(m, "__dict__") else m)
    trees.append(getattr(ctx, "slot_mapping", None))
    return trees


def kv_cache_tensors(worker: Any) -> list[Any]:
    """The KV cache tensors of a worker (one entry per layer: a tensor, or a list/tuple).

    Private: ``Worker.model_runner.kv_caches``. Why: vLLM exposes the cache's size and
    configuration, never its tensors; the recorder must know them to leave them out."""
    return list(getattr(worker.model_runner, "kv_caches", None) or [])


def weights_name_mapper(model: Any) -> Any:
    """The function a model's ``hf_to_vllm_mapper`` renames checkpoint names with, or None.

    Private, only as a fallback: ``WeightsMapper._map_name``, for a vLLM build without the
    public ``map_name`` (0.32 has both; builds under comparison may be other versions)."""
    mapper = getattr(model, "hf_to_vllm_mapper", None)
    return getattr(mapper, "map_name", None) or getattr(mapper, "_map_name", None)


def skip_cpu_gemm_dispatch(linear: Any) -> None:
    """Opt one linear layer out of vLLM's CPU GEMM dispatch (a planted-bug fixture keeps its
    weight in the Parameter, as on a GPU).

    Private: the ``_cpu_skip_gemm_dispatch`` flag vLLM sets on MLA's ``kv_b_proj``. Why: it is
    the only switch; no public option keeps a CPU linear weight out of the oneDNN handle."""
    linear._cpu_skip_gemm_dispatch = True


def lora_step_tensors(model: Any) -> list[Any]:
    """The tensors of a LoRA engine's punica wrappers: which adapter each token of the last batch
    used (``_token_lora_indices``, ``_embeddings_indices``, ...), rebuilt before every forward.

    Private: ``model.lora_manager`` (set by vLLM's ``LoRAModelManager``) and its
    ``punica_wrapper_mapping``. Why: per-step batch state is not weights and differs between any
    two engines that last ran different batches; the census and the recorder must leave it out,
    as they leave out the KV cache."""
    import torch

    manager = getattr(model, "lora_manager", None)
    wrappers = list((getattr(manager, "punica_wrapper_mapping", None) or {}).values())
    out = []
    for wrapper in wrappers:
        for value in vars(wrapper).values():
            if isinstance(value, torch.Tensor):
                out.append(value)
            elif isinstance(value, (list, tuple)):
                out += [v for v in value if isinstance(v, torch.Tensor)]
    return out


def drafter_model(worker: Any) -> Any:
    """The speculative-decoding drafter's own model (an ``nn.Module``), or None without one.

    Private: ``model_runner.drafter.model``. Why: ``Worker.get_model()`` returns the target only,
    and nothing public reaches a drafter that keeps weights of its own (``draft_model``, EAGLE,
    MTP); an n-gram drafter has none (no ``model``)."""
    drafter = getattr(getattr(worker, "model_runner", None), "drafter", None)
    return getattr(drafter, "model", None)


def encoder_cache(worker: Any) -> dict[str, Any] | None:
    """The model runner's encoder outputs by image hash (``{mm_hash: embeddings}``), or None
    where the runner keeps none.

    Private: ``model_runner.encoder_cache``. Why: vLLM exposes only resetting it
    (``reset_encoder_cache``); nothing public says what it holds, and the harness must see
    whether embeddings computed before a refit are still there to be served."""
    return getattr(getattr(worker, "model_runner", None), "encoder_cache", None)


def reset_encoder_cache(llm: Any) -> None:
    """Empty the engine's encoder cache: the scheduler's record of cached images and every
    worker's cached embeddings together.

    Private: ``LLM.llm_engine.reset_encoder_cache()``. Why: vLLM 0.32's ``LLM`` has
    ``reset_prefix_cache`` and ``reset_mm_cache`` but no ``reset_encoder_cache`` (its
    ``LLMEngine`` and ``AsyncLLM`` have one); resetting only the workers' cache (a
    ``collective_rpc``) leaves the scheduler expecting embeddings that are gone."""
    llm.llm_engine.reset_encoder_cache()

"""Mixed into vLLM's worker via ``worker_extension_cls``; its methods are called by
name through ``collective_rpc`` and answer once per rank, under any executor."""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import Any

from harness.records import DRAFTER_PREFIX, HookRecord, RankCensus, RankRecording, TensorRecord, UnobservedRecord
from harness.store import to_jsonable
from harness.worker import vllm_compat
from harness.worker.census import (
    observe_entries,
    observe_number,
    probe_linear_kernels,
    quant_kernels,
    walk_model,
    walk_numbers,
)
from harness.worker.digest import resolve as resolve_digest
from harness.worker.recorder import ConsumptionRecorder, name_consumed


class RefitObserver:
    """Observation entry points that run inside each vLLM worker (the model is vLLM's public
    ``Worker.get_model()``; private vLLM API goes through ``harness.worker.vllm_private``)."""

    def refit_harness_ping(self) -> int:
        return int(getattr(self, "rank", 0))

    def refit_harness_reload_on_data_parallel_rank(self, rank: int, weights_path: str) -> bool:
        """``reload_weights(weights_path)`` on data-parallel rank ``rank`` only (a trainer that
        refits one rank of a DP engine: the sabotaged twin of ``http_dp_reload``). True where it
        reloaded. vLLM's DP client sends a collective RPC to every rank."""
        # ``data_parallel_index``: a dense model's DP ranks run as independent DP=1 engines,
        # whose ``data_parallel_rank`` vLLM resets to 0; the index keeps the rank.
        if int(self.vllm_config.parallel_config.data_parallel_index) != int(rank):
            return False
        self.reload_weights(weights_path=weights_path)
        return True

    def refit_harness_pace(self, seconds_per_step: float) -> None:
        """Hold each engine step that computes tokens for ``seconds_per_step`` (0: full speed).

        Timing only, never values: the HTTP in-flight path paces generation until ``/pause``
        answers, so that a tiny model on a loaded CPU cannot finish a request before the pause
        lands (which would leave nothing in flight to judge)."""
        pace_steps(self, float(seconds_per_step))

    def refit_harness_cpu_dispatch(self) -> dict[str, Any]:
        """The CPU as vLLM sees it in this worker (after any ``--cpu-isa`` override) and the
        kernel each layer got at load, as JSON (``CpuCapabilities``, ``KernelPath`` records)."""
        from harness.worker.cpu_dispatch import capabilities, kernel_paths

        return {
            "cpu": to_jsonable(capabilities("torch (worker)")),
            "kernel_paths": to_jsonable(kernel_paths(self.get_model())),
        }

    def refit_harness_reload_from_iterator(self, checkpoint_dir: str, exclude: list[str] | None = None) -> None:
        """reload_weights fed from memory, the way a colocated trainer hands over tensors;
        ``exclude``: names left out of the feed (a sabotaged refit)."""
        from harness import safetensors_files

        tensors = list(safetensors_files.tensors(safetensors_files.files(checkpoint_dir), exclude=exclude or ()))
        self.reload_weights(weights_iterator=iter(tensors))

    def refit_harness_raw_load_weights(self, checkpoint_dir: str, exclude: list[str] | None = None) -> int:
        """``model.load_weights(iterator)`` under ``torch.no_grad()``, the call colocated trainers
        make (verl's sharding managers, TRL's colocate mode), not vLLM's layerwise
        ``reload_weights``: no post-load hook runs. ``exclude``: names left out of the feed (a
        sabotaged refit). Returns how many parameters vLLM says it loaded."""
        import torch

        from harness import safetensors_files

        tensors = safetensors_files.tensors(safetensors_files.files(checkpoint_dir), exclude=exclude or ())
        with torch.no_grad():
            loaded = self.get_model().load_weights(iter(list(tensors)))
        return len(loaded) if loaded is not None else -1

    def refit_harness_load_tensors(self, tensors: list) -> None:
        """reload_weights fed a trainer's ``(name, tensor)`` pairs as they were sent: its own
        names and dtype, for vLLM's loaders to map, pack and cast."""
        self.reload_weights(weights_iterator=iter(tensors))

    def refit_harness_save_kernel_state(self, directory: str) -> None:
        """vLLM's sharded-state saver, one subdirectory per rank: the tensors exactly as this
        rank's kernels hold them (fused, repacked, already sharded)."""
        own = self._refit_harness_rank_dir(directory)
        own.mkdir(parents=True, exist_ok=True)
        self.save_sharded_state(path=str(own))

    def refit_harness_reload_kernel_format(self, directory: str, exclude: list[str] | None = None) -> None:
        """reload_weights(is_checkpoint_format=False) fed from this rank's saved kernel state,
        without ``exclude`` (a sabotaged refit).

        Only parameters are fed: vLLM's kernel-format reload resolves names with
        ``get_parameter`` (its "TODO: buffers?"), so a buffer in the state would raise.
        Under ``no_grad``, as an in-worker caller must: vLLM 0.32 copies with a plain
        ``param.copy_``, which raises "a leaf Variable that requires grad is being used in an
        in-place operation" on any parameter that requires grad (RMSNorm weights do).
        """
        import torch

        from harness import safetensors_files

        # Every alias: a module shared under two names (Qwen3-MoE passes its router ``gate`` to
        # the experts) is saved under the lexically smaller one (``mlp.experts.gate.weight``),
        # which deduplicated ``named_parameters()`` does not list; filtering on it left the router
        # STALE, a harness-made FAIL.
        model = self.get_model()
        params = {name for name, _ in model.named_parameters(remove_duplicate=False)}
        # The saved state has the model's own names; a left-out checkpoint name is left out under
        # the name vLLM's weights mapper gives it (NemotronH: backbone.* is model.*), or the
        # sabotaged twin would leave nothing out and could not fail.
        exclude = list(exclude or ())
        exclude += list(_vllm_names(model, exclude).values())
        own = self._refit_harness_rank_dir(directory)
        tensors = list(safetensors_files.tensors(safetensors_files.files(own), exclude=exclude, only=params))
        with torch.no_grad():
            self.reload_weights(weights_iterator=iter(tensors), is_checkpoint_format=False)

    def refit_harness_census(self, checkpoint_names: list[str] | None = None, digest: str = "auto") -> dict[str, Any]:
        """This rank's ``RankCensus``, as JSON (what every transport carries, ``vllm serve``'s
        included); ``checkpoint_names`` are also mapped to the model's own names with vLLM's
        ``hf_to_vllm_mapper`` (NemotronH loads ``backbone.*`` as ``model.*``). Every tensor is
        digested with ``digest`` (a ``DigestChoice``, resolved here as in the arm)."""
        algorithm = resolve_digest(digest)
        model = self.get_model()
        rank = int(getattr(self, "rank", 0))
        self._refit_harness_watch_hooks(model)
        records: list[TensorRecord] = []
        unobserved: list[UnobservedRecord] = []
        try:
            entries = walk_model(model, self._refit_harness_kv_storages())
        except Exception as exc:
            entries = []
            unobserved.append(UnobservedRecord("<module-walk>", "attribute", f"{type(exc).__name__}: {exc}"[:300]))
        entries += probe_linear_kernels(model, unobserved)
        entries += self._refit_harness_drafter_entries(unobserved)
        for seen in observe_entries(entries, rank, algorithm):
            (unobserved if isinstance(seen, UnobservedRecord) else records).append(seen)
        try:
            records += [observe_number(n, rank) for n in walk_numbers(model)]
        except Exception as exc:
            unobserved.append(UnobservedRecord("<number-walk>", "number", f"{type(exc).__name__}: {exc}"[:300]))
        packed = getattr(model, "packed_modules_mapping", {}) or {}
        census = RankCensus(
            rank=rank,
            tensors=tuple(records),
            unobserved=tuple(replace(u, rank=rank) for u in unobserved),
            architecture=type(model).__name__,
            packed_modules_mapping=tuple((k, tuple(v)) for k, v in sorted(dict(packed).items())),
            hooks=tuple(
                HookRecord(module=m, kind=k, calls=n, owner=self._refit_harness_hook_owners.get((m, k), ""))
                for (m, k), n in sorted(self._refit_harness_hook_calls.items())
            ),
            weight_names=tuple(sorted(_vllm_names(model, checkpoint_names or []).items())),
            quant_kernels=quant_kernels(model),
        )
        return to_jsonable(census)

    def refit_harness_encoder_cache(self, digest: str = "auto") -> list[list[str]] | None:
        """``[mm_hash, digest]`` of every image's embeddings in this rank's encoder cache, in hash
        order; None where the model runner keeps none."""
        from harness.worker.digest import digest_many
        from harness.worker.vllm_private import encoder_cache

        cache = encoder_cache(self)
        if cache is None:
            return None
        hashes = sorted(cache)
        found = digest_many([cache[h] for h in hashes], resolve_digest(digest))
        return [[h, d if isinstance(d, str) else f"<{type(d).__name__}>"] for h, d in zip(hashes, found)]

    def _refit_harness_drafter_entries(self, unobserved: list[UnobservedRecord]) -> list:
        """A speculative-decoding drafter's tensors and linear-kernel probes, named under
        ``DRAFTER_PREFIX``: ``reload_weights`` reaches the target only (``get_model()``), so a
        drafter a refit leaves behind must be in the census to be judged."""
        from harness.worker.vllm_private import drafter_model

        drafter = drafter_model(self)
        if drafter is None:
            return []
        try:
            entries = walk_model(drafter) + probe_linear_kernels(drafter, unobserved)
        except Exception as exc:
            unobserved.append(UnobservedRecord("<drafter-walk>", "attribute", f"{type(exc).__name__}: {exc}"[:300]))
            return []
        return [replace(e, name=DRAFTER_PREFIX + e.name) for e in entries]

    def refit_harness_reload_drafter(self, weights_path: str) -> None:
        """vLLM's reload lifecycle (``reload_weights`` from a directory) on the drafter's own model,
        as an RL integration that refits a drafter must: ``Worker.reload_weights`` stops at the
        target. ``weights_path``: the drafter's own checkpoint (``CheckpointSet.drafter_checkpoint``)."""
        import torch

        from harness import safetensors_files
        from harness.worker.vllm_private import drafter_model

        drafter = drafter_model(self)
        if drafter is None:
            raise ValueError("this engine has no drafter with weights of its own (run with --draft-tokens)")
        speculative = self.vllm_config.speculative_config
        config = getattr(speculative, "draft_model_config", None) or self.vllm_config.model_config
        with torch.no_grad():
            vllm_compat.start_reload(drafter)
            drafter.load_weights(safetensors_files.tensors(safetensors_files.files(weights_path)))
            vllm_compat.finish_reload(drafter, config, self.device)

    # ---- kernel-input recorder -------------------------------------------------------

    def refit_harness_recorder_start(self, digest: str = "auto") -> None:
        """Record the persistent inputs of every op until ``refit_harness_recorder_stop``,
        digested with ``digest`` (as the census)."""
        model = self.get_model()
        recorder = ConsumptionRecorder(model, self._refit_harness_kv_storages(), resolve_digest(digest))
        # vLLM 0.34's standalone CPU runner samples through torch.compile(fullgraph=True) functions;
        # dynamo will not trace them under a dispatch mode and raises ("found no compiled frames").
        # They run eagerly for the recorded step alone.
        self._refit_harness_stance = vllm_compat.eager_while_recording()
        self._refit_harness_stance.__enter__()
        recorder.__enter__()  # stays active on this thread across the next engine step
        self._refit_harness_recorder = recorder

    def refit_harness_recorder_stop(self) -> dict[str, Any]:
        """This rank's ``RankRecording``, as JSON."""
        recorder = self._refit_harness_recorder
        recorder.__exit__(None, None, None)
        self._refit_harness_stance.__exit__(None, None, None)
        recorder.close()
        self._refit_harness_recorder = None
        model = self.get_model()
        by_address: dict[int, str] = {}
        by_storage: dict[int, str] = {}
        for entry in walk_model(model, self._refit_harness_kv_storages()):
            t = entry.tensor
            if t.device.type != "meta" and t.numel():
                by_address.setdefault(t.data_ptr(), entry.name)
                by_storage.setdefault(t.untyped_storage().data_ptr(), entry.name)
        rank = int(getattr(self, "rank", 0))
        return to_jsonable(
            RankRecording(
                rank=rank,
                consumed=tuple(name_consumed(recorder.records, by_address, by_storage, rank)),
                unreadable=tuple(recorder.unreadable[:50]),
            )
        )

    def refit_harness_zero_sleep_backup(self, names: list[str]) -> int:
        """While asleep at level 1: zero the named parameters' bytes in the CPU copies
        ``wake_up`` will restore (``harness.worker.sleep_backup``); the bytes zeroed."""
        from vllm.device_allocator.cumem import CuMemAllocator

        from harness.worker.sleep_backup import zero_in_backups

        model = self.get_model()
        mapped = _vllm_names(model, names)
        backups = CuMemAllocator.get_instance().pointer_to_data
        zeroed = 0
        for name in names:
            try:
                param = model.get_parameter(mapped.get(name, name))
            except AttributeError:
                raise LookupError(f"{name} is not a parameter of the model: its sleep backup cannot be found") from None
            where = f"{name} ({param.data_ptr():#x}, {param.numel() * param.element_size()} bytes)"
            try:
                zeroed += zero_in_backups(backups, param.data_ptr(), param.numel() * param.element_size())
            except LookupError as exc:
                raise LookupError(f"{where}: {exc}") from None
        return zeroed

    def refit_harness_zero_sleep_saved_buffer(self) -> str:
        """While asleep at level 2: zero one model buffer in the CPU copies ``wake_up`` restores
        (``harness.worker.sleep_backup.zero_saved_buffer``); its name."""
        from harness.worker.sleep_backup import zero_saved_buffer

        return zero_saved_buffer(getattr(self, "_sleep_saved_buffers", None) or {})

    # ---- reads of moved storage by captured graphs (harness.worker.graph_reads) ------

    def _refit_harness_named_tensors(self) -> dict[str, Any]:
        model = self.get_model()
        return {e.name: e.tensor for e in walk_model(model, self._refit_harness_kv_storages()) if e.kind != "kernel"}

    def refit_harness_hold_tensors(self) -> int:
        """Before a refit: hold every census tensor, so a moved one's old storage stays as it was."""
        from harness.worker.graph_reads import hold

        self._refit_harness_held = hold(self._refit_harness_named_tensors().items())
        return len(self._refit_harness_held)

    def refit_harness_moved_tensors(self) -> dict[str, Any]:
        """After a refit: the held tensors whose address moved, those whose old address a captured
        graph recorded as an input, the ones that cannot be poisoned (with why), and how many
        graphs are captured (the V2 runner's FULL graphs, which record no inputs, apart)."""
        from harness.worker.graph_reads import captured_input_addresses, full_graphs_without_inputs, moved, poison_plan

        held = getattr(self, "_refit_harness_held", None)
        if held is None:
            return {"rank": int(getattr(self, "rank", 0)), "held": False}
        now = self._refit_harness_named_tensors()
        names = moved(held, now)
        addresses, recorded = captured_input_addresses()
        unrecorded = full_graphs_without_inputs(getattr(self, "model_runner", None))
        captured = [n for n in names if held[n].data_ptr() in addresses]
        poisonable, refused = poison_plan(held, [n for n in names if n not in captured], now.values())
        return {
            "rank": int(getattr(self, "rank", 0)),
            "held": True,
            "graphs": recorded + unrecorded,
            "graphs_without_inputs": unrecorded,
            "moved": names,
            "captured": captured,
            "poisonable": poisonable,
            "refused": refused,
        }

    def refit_harness_flip_held(self, names: list[str]) -> None:
        """Flip every bit of the named held tensors' old bytes (twice restores them)."""
        from harness.worker.graph_reads import flip

        held = self._refit_harness_held
        flip(held, [n for n in names if n in held])
        import torch

        if torch.cuda.is_available():
            torch.cuda.synchronize()

    def refit_harness_release_held(self) -> None:
        self._refit_harness_held = None

    # ---- post-load hook census ------------------------------------------------------

    def _refit_harness_watch_hooks(self, model) -> None:
        """Wrap every post-load hook once, so each later refit shows which ones ran."""
        if hasattr(self, "_refit_harness_hook_calls"):
            return
        calls: dict[tuple[str, str], int] = {}
        owners: dict[tuple[str, str], str] = {}  # the class whose hook it is: mounting points by class
        self._refit_harness_hook_calls = calls
        self._refit_harness_hook_owners = owners
        names = {id(m): n for n, m in model.named_modules()}

        def counting(fn, key_of):
            @functools.wraps(fn)
            def wrapper(*args, **kwargs):
                key = key_of(*args)
                calls[key] = calls.get(key, 0) + 1
                return fn(*args, **kwargs)

            return wrapper

        for name, module in model.named_modules():
            method = getattr(module, "quant_method", None)
            if (
                method is not None
                and callable(getattr(method, "process_weights_after_loading", None))
                and not getattr(method, "_refit_harness_wrapped", False)
            ):
                method.process_weights_after_loading = counting(
                    method.process_weights_after_loading, lambda layer, *a: (names.get(id(layer), "?"), "quant_method")
                )
                method._refit_harness_wrapped = True
                calls.setdefault((name, "quant_method"), 0)
                owners[(name, "quant_method")] = type(method).__name__
            own = getattr(type(module), "process_weights_after_loading", None)
            if own is not None and callable(own):
                kind = "model" if module is model else "module"
                module.process_weights_after_loading = counting(
                    module.process_weights_after_loading, lambda *a, _k=(name or "<model>", kind): _k
                )
                calls.setdefault((name or "<model>", kind), 0)
                owners[(name or "<model>", kind)] = type(module).__name__

    def _refit_harness_rank_dir(self, directory: str):
        from pathlib import Path

        return Path(directory) / f"rank{int(getattr(self, 'rank', 0))}"

    def _refit_harness_kv_storages(self) -> frozenset[int]:
        # The KV cache changes with every step; it is engine state, not weights.
        from harness.worker.vllm_private import kv_cache_tensors

        ptrs = set()
        for kv in kv_cache_tensors(self):
            for t in kv if isinstance(kv, (list, tuple)) else [kv]:
                if t is not None and t.numel() > 0:
                    ptrs.add(t.untyped_storage().data_ptr())
        # A LoRA engine's per-step adapter indices: batch state too (which adapter each token used).
        from harness.worker.vllm_private import lora_step_tensors

        for t in lora_step_tensors(self.get_model()):
            if t.numel() > 0:
                ptrs.add(t.untyped_storage().data_ptr())
        return frozenset(ptrs)


def pace_steps(worker: Any, seconds_per_step: float) -> None:
    """Make ``worker.execute_model`` wait ``seconds_per_step`` before each step that schedules
    tokens. The wrapper is installed once, on the instance (vLLM's executors and worker wrapper
    call ``worker.execute_model``), and reads the delay each step, so it can be changed live."""
    import time

    worker._refit_harness_step_delay = seconds_per_step
    if getattr(worker, "_refit_harness_paced", False):
        return
    unpaced = worker.execute_model

    @functools.wraps(unpaced)
    def execute_model(scheduler_output, *args, **kwargs):
        delay = worker._refit_harness_step_delay
        if delay > 0 and getattr(scheduler_output, "total_num_scheduled_tokens", 0) > 0:
            time.sleep(delay)
        return unpaced(scheduler_output, *args, **kwargs)

    worker.execute_model = execute_model
    worker._refit_harness_paced = True


def _vllm_names(model, names: list[str]) -> dict[str, str]:
    """Checkpoint name -> the name vLLM loads it as, where its weights mapper renames it."""
    from harness.worker.vllm_private import weights_name_mapper

    map_name = weights_name_mapper(model)
    out = {}
    for name in names:
        try:
            mapped = map_name(name) if map_name else name
        except Exception:
            mapped = name
        if mapped and mapped != name:
            out[name] = mapped
    return out

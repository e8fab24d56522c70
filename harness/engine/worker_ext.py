"""Mixed into vLLM's worker via ``worker_extension_cls``; its methods are called by
name through ``collective_rpc`` and answer once per rank, under any executor."""

from __future__ import annotations

from typing import Any

from harness.observe import probe_linear_kernels, tensor_digest, tensor_stats, walk_model


class RefitObserver:
    """Observation entry points that run inside each vLLM worker."""

    def refit_harness_ping(self) -> int:
        return int(getattr(self, "rank", 0))

    def refit_harness_reload_from_iterator(self, checkpoint_dir: str) -> None:
        """reload_weights fed from memory, the way a colocated trainer hands over tensors."""
        from pathlib import Path

        from safetensors.torch import load_file

        tensors = [item for f in sorted(Path(checkpoint_dir).glob("*.safetensors")) for item in load_file(str(f)).items()]
        self.reload_weights(weights_iterator=iter(tensors))

    def refit_harness_census(self) -> dict[str, Any]:
        model = self.model_runner.get_model()
        records = []
        for entry in walk_model(model, self._refit_harness_kv_storages()) + probe_linear_kernels(model):
            t = entry.tensor
            nan_count, absmax = tensor_stats(t)
            records.append({
                "name": entry.name, "kind": entry.kind,
                "dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
                "device": str(t.device), "address": int(t.data_ptr()) if t.device.type != "meta" else 0,
                "digest": tensor_digest(t), "nan_count": nan_count, "absmax": absmax,
            })
        packed = getattr(model, "packed_modules_mapping", {}) or {}
        return {
            "rank": int(getattr(self, "rank", 0)),
            "tensors": records,
            "architecture": type(model).__name__,
            "packed_modules_mapping": {k: list(v) for k, v in dict(packed).items()},
        }

    def _refit_harness_kv_storages(self) -> frozenset[int]:
        # The KV cache changes with every step; it is engine state, not weights.
        ptrs = set()
        for kv in getattr(self.model_runner, "kv_caches", None) or []:
            for t in kv if isinstance(kv, (list, tuple)) else [kv]:
                if t is not None and t.numel() > 0:
                    ptrs.add(t.untyped_storage().data_ptr())
        return frozenset(ptrs)

"""A planted-bug model the harness was never written for, registered only through
``REFIT_HARNESS_MODELS``: its final norm reads a copy hidden in a tuple attribute set
with ``object.__setattr__`` at cold start."""

from __future__ import annotations

import torch
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.models.qwen3 import Qwen3ForCausalLM


class TupleCopyFinalNorm(RMSNorm):
    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if residual is not None:
            x = x + residual
            residual = x
        xf = x.float()
        out = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.variance_epsilon) * self._frozen[0]).to(x.dtype)
        return out if residual is None else (out, residual)


class HiddenFinalNormCopyQwen3(Qwen3ForCausalLM):
    def __init__(self, *, vllm_config, prefix: str = "") -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        self.model.norm.__class__ = TupleCopyFinalNorm

    def process_weights_after_loading(self) -> None:
        object.__setattr__(self.model.norm, "_frozen", (self.model.norm.weight.detach().clone(),))

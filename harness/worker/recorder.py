"""Record what the kernels actually consume during one forward (torch only).

A ``TorchDispatchMode`` sees every op that reaches the dispatcher, aten and custom ops
alike. For each tensor argument that existed before the forward began (a weight, a
derived copy, any cached state), it records the op, argument position, dtype, shape,
address, an exact digest, and the module whose forward was running. Tensors produced by
earlier ops of the same forward are activations and are not recorded; the KV cache and
the step inputs are excluded by storage.

Runs in the vLLM worker, switched on and off by ``harness.worker.extension``.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from harness.records import ConsumedTensor
from harness.worker.census import nan_count, tensor_digest
from harness.worker.digest import XXH3


class ConsumptionRecorder(TorchDispatchMode):
    """Records persistent op inputs while any module of ``model`` is running forward."""

    def __init__(self, model: nn.Module, excluded_storages: frozenset[int], algorithm: str = XXH3) -> None:
        super().__init__()
        self.algorithm = algorithm  # the arm's digest (harness.worker.digest), as for its census
        self.excluded = set(excluded_storages)
        self.records: list[tuple[int, ConsumedTensor]] = []  # (storage pointer, record)
        self.unreadable: list[str] = []  # op inputs that could not be digested, with the reason
        self._produced: set[int] = set()
        self._keep_alive: list[torch.Tensor] = []  # so ids of produced tensors are not reused
        self._digests: dict[tuple[int, int], tuple[str, int]] = {}  # (digest, NaN count)
        self._stack: list[str] = []
        self._op_index = 0
        self._handles = []
        names = {id(m): n for n, m in model.named_modules()}
        root = model

        def pre(module, args, kwargs=None):
            if module is root:  # step inputs arrive as the root forward's arguments
                self._exclude_tree((args, kwargs))
                self._exclude_forward_context()
            self._stack.append(names.get(id(module), "?"))

        def post(module, args, output):
            if self._stack:
                self._stack.pop()
            self._mark_produced(output)

        for module in model.modules():
            self._handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
            self._handles.append(module.register_forward_hook(post))

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._keep_alive.clear()

    def _exclude_tree(self, tree) -> None:
        for leaf in tree_flatten(tree)[0]:
            if isinstance(leaf, torch.Tensor) and leaf.device.type != "meta":
                self.excluded.add(leaf.untyped_storage().data_ptr())

    def _exclude_forward_context(self) -> None:
        # Attention metadata (slot mapping, block tables, lengths) is per-step input too.
        try:
            from vllm.forward_context import get_forward_context

            ctx = get_forward_context()
        except (ImportError, AssertionError, RuntimeError):
            return
        from harness.worker.vllm_private import forward_step_tensors

        for tree in forward_step_tensors(ctx):
            self._exclude_tree(tree)

    def _mark_produced(self, tree) -> None:
        for leaf in tree_flatten(tree)[0]:
            if isinstance(leaf, torch.Tensor):
                self._produced.add(id(leaf))
                self._keep_alive.append(leaf)

    def _record(self, func, position: int, leaf: torch.Tensor) -> None:
        storage = leaf.untyped_storage().data_ptr()
        if storage in self.excluded:
            return
        key = (id(leaf), _version(leaf))
        if key not in self._digests:
            self._digests[key] = (tensor_digest(leaf, self.algorithm), nan_count(leaf))
        digest, nans = self._digests[key]
        # Named later, once the whole census is known (see name_consumed).
        self.records.append(
            (
                storage,
                ConsumedTensor(
                    name="",
                    op_index=self._op_index,
                    op=str(func),
                    arg=position,
                    module=self._stack[-1],
                    dtype=str(leaf.dtype).removeprefix("torch."),
                    shape=tuple(leaf.shape),
                    address=int(leaf.data_ptr()),
                    digest=digest,
                    nan_count=nans,
                ),
            )
        )

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self._stack:
            flat = tree_flatten((args, kwargs))[0]
            for position, leaf in enumerate(flat):
                if isinstance(leaf, torch.Tensor) and id(leaf) not in self._produced and leaf.device.type != "meta":
                    try:
                        self._record(func, position, leaf)
                    except Exception as exc:
                        self.unreadable.append(
                            f"{self._stack[-1]}:{func}#{position}: {type(exc).__name__}: {exc}"[:300]
                        )
            self._op_index += 1
        out = func(*args, **kwargs)
        # Track outputs even between module forwards: the runner slices hidden states
        # before compute_logits, and those are activations, not state.
        self._mark_produced(out)
        return out


def _version(t: torch.Tensor) -> int:
    try:
        return t._version
    except RuntimeError:  # inference tensors keep no version counter
        return -1


def name_consumed(
    records: list[tuple[int, ConsumedTensor]], census: dict[int, str], census_by_storage: dict[int, str], rank: int = 0
) -> list[ConsumedTensor]:
    """Census name of each recorded tensor (by exact address, then by storage), or
    ``unregistered@<module>:<op>#<arg>`` with an occurrence count for repeats; ``rank``: the
    worker's."""
    seen: dict[str, int] = {}
    named = []
    for storage, r in records:
        name = census.get(r.address) or census_by_storage.get(storage)
        if name is None:
            base = f"unregistered@{r.module}:{r.op}#{r.arg}"
            seen[base] = seen.get(base, 0) + 1
            name = base if seen[base] == 1 else f"{base}~{seen[base]}"
        named.append(replace(r, name=name, rank=rank))
    return named

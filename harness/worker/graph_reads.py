"""Do captured graphs still read a tensor at the storage it had before a refit? (torch only)

A captured CUDA graph replays the addresses it captured. After a refit that gives a tensor new
storage (REBOUND), the graph keeps reading the old storage until it is captured again; a
``TorchDispatchMode`` recording cannot see that (a replay dispatches no op, and reads inside
Triton/Inductor kernels are no ops either). So under CUDA graphs a moved tensor is judged by what
can be shown of the captured graphs:

- before the refit the worker **holds** an alias of every census tensor (``hold``: ``t.detach()``,
  a new tensor on the same storage): the old storage of a tensor that moves stays allocated, so
  its old address keeps its old bytes and is never reused, even when the refit rebinds
  ``param.data`` on the same Parameter object;
- after it, **moved** tensors are those whose address differs from the held alias's (the
  address the census saw before the refit);
- a moved tensor is READ when its old address is an input address vLLM's ``CUDAGraphWrapper``
  recorded at capture (``CUDAGraphEntry.input_addresses``: the piecewise graphs' inputs, weights
  included). vLLM's V2 model runner keeps its FULL graphs in ``CudaGraphManager.graphs`` with no
  input addresses, so for those only poisoning can tell; otherwise its old bytes are **poisoned** (every bit flipped, which undoes itself),
  the arm generates a batch inside the captured sizes, and any change from the same batch before
  poisoning is a READ; no change shows it UNREAD;
- a tensor that cannot be poisoned safely (not floating point: an index could fault the device;
  not contiguous; its old bytes shared with a live tensor) is UNCHECKED, which counts as read.

The same functions run on the CPU against a graph's twin: anything that captured the old tensor
object and keeps reading it (``tests/unit/test_graph_reads.py``).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

POISONABLE = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})
"""Dtypes whose old storage is poisoned: flipping every bit of an index could fault the device."""


def hold(named: Iterable[tuple[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Aliases of the tensors as they are before a refit, by name: ``t.detach()`` shares the
    storage, so holding it keeps that storage alive and at its address whatever the refit does
    to the object itself (a ``param.data = new`` rebind replaces the object's storage, and would
    free the old one if the object were held)."""
    return {name: t.detach() for name, t in named if t.device.type != "meta" and t.numel()}


def moved(held: dict[str, torch.Tensor], now: dict[str, torch.Tensor]) -> list[str]:
    """Names whose tensor's address now differs from its held alias's (its address before the refit)."""
    return sorted(n for n, t in held.items() if n in now and now[n].data_ptr() != t.data_ptr())


def full_graphs_without_inputs(model_runner: object) -> int:
    """How many FULL graphs vLLM's V2 model runner captured (``CudaGraphManager.graphs``): they
    record no input addresses, so a moved tensor they read shows only by poisoning."""
    manager = getattr(model_runner, "cudagraph_manager", None)
    return len(getattr(manager, "graphs", None) or {})


def captured_input_addresses() -> tuple[set[int], int]:
    """Every input address vLLM's ``CUDAGraphWrapper`` graphs (piecewise, and the V1 runner's
    FULL ones) recorded, and how many such graphs there are."""
    # In every supported vLLM (0.31-0.34; the adapter's API check lists it): no ImportError to hide.
    from vllm.compilation.cuda_graph import CUDAGraphWrapper

    addresses: set[int] = set()
    graphs = 0
    for wrapper in list(CUDAGraphWrapper._all_instances):
        for entry in wrapper.concrete_cudagraph_entries.values():
            if entry.cudagraph is not None:
                graphs += 1
                addresses.update(entry.input_addresses or ())
    return addresses, graphs


def _span(t: torch.Tensor) -> tuple[int, int]:
    return t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()


def poison_plan(
    held: dict[str, torch.Tensor], names: Iterable[str], live: Iterable[torch.Tensor]
) -> tuple[list[str], dict[str, str]]:
    """Which of ``names`` can be poisoned at their old storage without touching a live tensor,
    and why each of the others cannot."""
    spans = sorted(_span(t) for t in live if t.device.type != "meta" and t.numel())
    ok: list[str] = []
    refused: dict[str, str] = {}
    for name in names:
        t = held[name]
        lo, hi = _span(t)
        shared = next((other for other in ok if lo < _span(held[other])[1] and _span(held[other])[0] < hi), None)
        if t.dtype not in POISONABLE:
            refused[name] = f"{str(t.dtype).removeprefix('torch.')}: not poisoned (an index could fault the device)"
        elif not t.is_contiguous():
            refused[name] = "not contiguous: its old bytes cannot be poisoned alone"
        elif any(a < hi and lo < b for a, b in spans):
            refused[name] = "its old bytes overlap a live tensor"
        elif shared is not None:  # flipped twice with it, the bytes would be back as they were
            refused[name] = f"its old bytes overlap those of {shared}, which is poisoned instead"
        else:
            ok.append(name)
    return ok, refused


def flip(held: dict[str, torch.Tensor], names: Iterable[str]) -> None:
    """Flip every bit of each named tensor's old bytes; flipping twice restores them exactly."""
    with torch.inference_mode():  # vLLM's parameters may be inference tensors
        for name in names:
            raw = held[name].reshape(-1).view(torch.uint8)
            torch.bitwise_not(raw, out=raw)

"""The CPU twin of the CUDA-graph read probe: the worker's own code (``RefitObserver`` and
``harness.worker.graph_reads``) and the arm's (``probe_graph_reads``), over a toy model whose
"captured graph" keeps the tensor objects it captured, as a CUDA graph keeps their addresses.
A graph that reads the moved tensor's old storage must be READ; one that reads the new one,
UNREAD; one that vLLM recorded as a captured input, READ without poisoning; an index, UNCHECKED."""

from __future__ import annotations

import types

import pytest
import torch
from torch import nn

from harness.arm.process import probe_graph_reads
from harness.plan import ArmPlan
from harness.records import PromptOutput
from harness.spec.checkpoint_set import CheckpointSet
from harness.spec.requirements import EngineRequirements
from harness.spec.run import EngineSpec, PromptSpec
from harness.worker.extension import RefitObserver


class Toy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.w = nn.Parameter(torch.randn(4, 4, generator=gen), requires_grad=False)
        self.register_buffer("index", torch.arange(4))


class Graph:
    """A captured graph's twin: with ``captured``, it reads the tensors it held at capture,
    whatever the module holds later; without, it reads the module's current ones (re-captured)."""

    def __init__(self, model: Toy, captured: bool) -> None:
        self.model = model
        self.held = (model.w, model.index) if captured else None

    def __call__(self) -> torch.Tensor:
        w, index = self.held or (self.model.w, self.model.index)
        return torch.ones(1, 4) @ w[index]


class Worker(RefitObserver):
    rank = 0

    def __init__(self, model: Toy) -> None:
        self.model = model
        self.model_runner = types.SimpleNamespace(kv_caches=[])

    def get_model(self) -> Toy:
        return self.model


class Engine:
    """The arm's engine interface over one in-process worker and its graph."""

    def __init__(self, worker: Worker, graph: Graph) -> None:
        self.worker, self.graph = worker, graph

    def rpc(self, method, kwargs=None):
        return [getattr(self.worker, method)(**(kwargs or {}))]

    def generate(self, prompts):
        out = self.graph()
        return tuple(
            PromptOutput(prompt=i, token_ids=(int(out.argmax()),), logprobs=(((0, float(out.sum())),),))
            for i in range(len(prompts.token_ids))
        )


def arm() -> ArmPlan:
    cs = CheckpointSet(a="/a", b="/b", b_control="/c", control_tensor="w")
    return ArmPlan(
        name="subject",
        role="subject",
        paths=("compiled",),
        start="A",
        steps=(),
        engine=EngineSpec(mode="compiled"),
        requirements=EngineRequirements(),
        prompts=PromptSpec(token_ids=(tuple(range(1, 20)),)),
        checkpoints=cs,
        timeout_s=60,
    )


def refit(model: Toy, rebind: bool, index: bool = False) -> None:
    """Refit to new weights: in place, or rebinding ``w`` (and ``index``) to new storage."""
    new = model.w.detach() * 2 + 1
    if rebind:
        model.w = nn.Parameter(new, requires_grad=False)
        if index:
            model.register_buffer("index", model.index.clone())
    else:
        with torch.no_grad():
            model.w.copy_(new)


def probe(captured: bool, rebind: bool, index: bool = False):
    model = Toy()
    worker = Worker(model)
    engine = Engine(worker, Graph(model, captured))
    assert worker.refit_harness_hold_tensors() == 2
    refit(model, rebind, index)
    before = engine.generate(PromptSpec(token_ids=((1,),)))
    reads = {g.name: g for g in probe_graph_reads(engine, arm())}
    assert engine.generate(PromptSpec(token_ids=((1,),))) == before  # the probe restored every byte it flipped
    return reads


def test_a_graph_still_reading_the_old_storage_is_read():
    reads = probe(captured=True, rebind=True)
    assert reads["w"].status == "read" and "poisoning" in reads["w"].evidence


def test_a_graph_reading_the_new_storage_is_shown_unread():
    reads = probe(captured=False, rebind=True)
    assert reads["w"].status == "unread"


def test_a_refit_in_place_moves_nothing():
    assert probe(captured=True, rebind=False) == {}


def test_an_index_that_moved_is_not_poisoned_and_counts_as_unchecked():
    reads = probe(captured=False, rebind=True, index=True)
    assert reads["index"].status == "unchecked" and "int64" in reads["index"].evidence
    assert reads["w"].status == "unread"


def test_an_old_address_vllm_recorded_as_a_captured_input_is_read_without_poisoning():
    from vllm.compilation.cuda_graph import CUDAGraphEntry, CUDAGraphWrapper

    model = Toy()
    worker = Worker(model)
    engine = Engine(worker, Graph(model, captured=False))  # poisoning alone would say unread
    worker.refit_harness_hold_tensors()

    class Captured:  # the attributes vLLM's CUDAGraphWrapper keeps, with vLLM's own entry class
        concrete_cudagraph_entries = {
            "batch 4": CUDAGraphEntry(batch_descriptor=None, cudagraph=object(), input_addresses=[model.w.data_ptr()])
        }

    wrapper = Captured()
    CUDAGraphWrapper._all_instances.add(wrapper)
    try:
        refit(model, rebind=True)
        reads = {g.name: g for g in probe_graph_reads(engine, arm())}
    finally:
        CUDAGraphWrapper._all_instances.discard(wrapper)
    assert reads["w"].status == "read" and "captured graph" in reads["w"].evidence


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_flipping_twice_restores_the_bytes(dtype):
    from harness.worker.graph_reads import flip

    t = torch.randn(8, dtype=torch.float32).to(dtype)
    before = t.clone()
    flip({"t": t}, ["t"])
    assert not torch.equal(t.view(torch.uint8), before.view(torch.uint8))
    flip({"t": t}, ["t"])
    assert torch.equal(t.view(torch.uint8), before.view(torch.uint8))


def test_old_bytes_shared_by_two_moved_tensors_are_poisoned_once():
    from harness.worker.graph_reads import poison_plan

    old = torch.zeros(8)
    held = {"a": old[:4], "b": old[2:6], "c": torch.zeros(4), "i": torch.zeros(4, dtype=torch.int32)}
    ok, refused = poison_plan(held, ["a", "b", "c", "i"], live=[torch.ones(4)])
    assert ok == ["a", "c"] and "overlap those of a" in refused["b"] and "int32" in refused["i"]
    assert "overlap a live tensor" in poison_plan(held, ["c"], live=[held["c"]])[1]["c"]

import torch
from torch import nn

from harness.worker.census import walk_model
from harness.worker.recorder import ConsumptionRecorder, name_consumed

REGISTRY: dict[str, torch.Tensor] = {}


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.scale = nn.Parameter(torch.full((4,), 2.0))
        REGISTRY["block"] = torch.full((4,), 3.0)  # reachable from no module

    def forward(self, x):
        h = self.lin(x) * self.scale  # weight, bias and scale are state; h is an activation
        return h + REGISTRY["block"]


def record(model, x):
    recorder = ConsumptionRecorder(model, frozenset())
    with recorder, torch.no_grad():
        model(x)
    recorder.close()
    census = walk_model(model)
    by_address = {e.tensor.data_ptr(): e.name for e in census}
    by_storage = {e.tensor.untyped_storage().data_ptr(): e.name for e in census}
    return name_consumed(recorder.records, by_address, by_storage)


def test_records_state_not_activations_or_step_inputs():
    model = nn.Sequential(Block())
    consumed = record(model, torch.ones(2, 4))
    names = [c.name for c in consumed]
    assert "0.lin.weight" in names and "0.lin.bias" in names and "0.scale" in names
    assert "unregistered@0:aten.add.Tensor#1" in names  # the module-level dict's tensor
    assert len(names) == 4  # nothing else: the input x and every intermediate are excluded
    assert {c.module for c in consumed if c.name.startswith("0.lin.")} == {"0.lin"}


def test_digests_follow_the_values_read():
    model = nn.Sequential(Block())
    before = {c.name: c.digest for c in record(model, torch.ones(2, 4))}
    REGISTRY["block"] = torch.full((4,), 4.0)  # rebuilt elsewhere: new value, new address
    after = {c.name: c.digest for c in record(model, torch.ones(2, 4))}
    changed = {n for n in before if before[n] != after.get(n)}
    assert changed == {"unregistered@0:aten.add.Tensor#1"}

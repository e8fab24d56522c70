"""The example package's packing on its own (no engine): tensors flattened into fixed buckets and
rebuilt by the worker-side function come back bit for bit, straddling tensors included; a stream
cut short is an error, not a silent partial refit."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[2] / "examples" / "bucketed_sync" / "src"))
from refit_bucketed_sync import _receive, pack


class _Worker:
    """What ``_receive`` needs of a vLLM worker: somewhere to keep state, and reload_weights."""

    def __init__(self) -> None:
        self.fed: list[tuple[str, torch.Tensor]] = []

    def reload_weights(self, weights_iterator) -> None:
        self.fed = list(weights_iterator)


def _tensors():
    g = torch.Generator().manual_seed(0)
    return [
        ("a.weight", torch.randn(70, 130, generator=g).to(torch.bfloat16)),
        ("b.bias", torch.randn(3, generator=g)),
        ("c.weight", torch.randn(257, 64, generator=g)),
        ("d.scale", torch.randn(1, generator=g).to(torch.float16)),
    ]


def _send(buckets, worker, upto=None):
    start = 0
    buckets = buckets[:upto] if upto else buckets
    for i, (bucket, entries) in enumerate(buckets):
        _receive(worker, bucket, entries, first=i == 0, last=i == len(buckets) - 1, bucket_start=start)
        start += bucket.numel()


def test_every_tensor_comes_back_bit_for_bit_across_bucket_boundaries():
    tensors = _tensors()
    buckets = list(pack(tensors, bucket_bytes=4096))
    assert len(buckets) > 10 and any(len(entries) == 0 for _, entries in buckets)  # some tensors span buckets
    worker = _Worker()
    _send(buckets, worker)
    assert [n for n, _ in worker.fed] == [n for n, _ in tensors]
    for (_, got), (_, want) in zip(worker.fed, tensors):
        assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)


def test_a_stream_cut_short_raises_instead_of_feeding_part_of_it():
    buckets = list(pack(_tensors(), bucket_bytes=4096))
    with pytest.raises(RuntimeError, match="incomplete after the last bucket"):
        _send(buckets, _Worker(), upto=len(buckets) - 1)

"""A bucketed weight sync as an out-of-tree refit-harness reload path.

RL frameworks do not send a trainer's tensors one by one: they flatten them into fixed-size
byte buckets (verl's ``bucketed_weight_transfer``, SGLang's ``FlattenedTensorBucket``, NeMo-RL's
packed broadcast), send each bucket, and the engine side rebuilds the tensors from a small
metadata table (name, dtype, shape, offset) and feeds them to the model. The packing is where
such code breaks: an offset off by one element, a dtype reinterpreted, a tensor that straddles two
buckets, a tensor dropped at a bucket boundary. The harness checks the whole round trip against a
cold engine on the same weights.

The "trainer" side runs in the arm process (it reads the target checkpoint); the engine side runs
inside every vLLM worker, as a module-level function handed to ``collective_rpc`` (vLLM pickles
it by reference, so this package must be importable in the workers: install it in the same
environment as the harness).
"""

from __future__ import annotations

from typing import ClassVar

from harness.paths.base import Engine, ReloadPath
from harness.spec.requirements import RefitTarget

BUCKET_BYTES = 64 << 10
"""Bucket size: small, so that the tiny test models' tensors straddle bucket boundaries."""


def pack(named_tensors, bucket_bytes: int = BUCKET_BYTES):
    """Flatten tensors into fixed-size uint8 buckets: yields ``(bucket, entries)`` where each entry
    is ``(name, dtype, shape, start, stop)`` in bytes of the concatenated stream. A tensor may
    straddle buckets; the last bucket is cut to what it holds."""
    import torch

    entries, offset = [], 0
    current = torch.empty(bucket_bytes, dtype=torch.uint8)
    filled = 0
    for name, tensor in named_tensors:
        raw = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
        entries.append(
            (name, str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape), offset, offset + raw.numel())
        )
        offset += raw.numel()
        pos = 0
        while pos < raw.numel():
            n = min(bucket_bytes - filled, raw.numel() - pos)
            current[filled : filled + n] = raw[pos : pos + n]
            filled, pos = filled + n, pos + n
            if filled == bucket_bytes:
                yield current, entries
                entries, current, filled = [], torch.empty(bucket_bytes, dtype=torch.uint8), 0
    if filled:
        yield current[:filled].clone(), entries


def _receive(worker, bucket, entries, first: bool, last: bool, bucket_start: int) -> int:
    """Engine side (runs inside each vLLM worker): keep the byte stream's tail, rebuild every tensor
    whose bytes are complete, and after the last bucket feed them all to vLLM's layerwise reload.
    Returns how many tensors were rebuilt so far."""
    import torch

    if first:
        worker._bucketed_sync = {"pending": [], "tensors": [], "stream": torch.empty(0, dtype=torch.uint8), "base": 0}
    state = worker._bucketed_sync
    state["pending"] += [tuple(e) for e in entries]
    state["stream"] = torch.cat([state["stream"], bucket])
    done = []
    for name, dtype, shape, start, stop in state["pending"]:
        if stop - state["base"] > state["stream"].numel():
            break
        raw = state["stream"][start - state["base"] : stop - state["base"]]
        state["tensors"].append((name, raw.clone().view(getattr(torch, dtype)).reshape(shape)))
        done.append(name)
    state["pending"] = state["pending"][len(done) :]
    if done:  # drop the bytes no pending tensor needs any more
        keep_from = (state["pending"][0][3] if state["pending"] else bucket_start + bucket.numel()) - state["base"]
        state["stream"] = state["stream"][keep_from:].clone()
        state["base"] += keep_from
    if last:
        if state["pending"]:
            raise RuntimeError(f"bucketed sync: {len(state['pending'])} tensor(s) incomplete after the last bucket")
        tensors, worker._bucketed_sync = state["tensors"], None
        worker.reload_weights(weights_iterator=iter(tensors))
        return len(tensors)
    return len(state["tensors"])


class BucketedSync(ReloadPath):
    name: ClassVar[str] = "bucketed_sync"
    exercises: ClassVar[str] = (
        "an out-of-tree path (examples/bucketed_sync): the target's tensors flattened into fixed 64 KiB uint8 "
        "buckets with a (name, dtype, shape, offset) table, sent bucket by bucket through collective_rpc, rebuilt "
        "in the worker and fed to reload_weights(weights_iterator=...), as verl, SGLang and NeMo-RL sync weights"
    )
    sabotage: ClassVar[str] = "the positive-control tensor dropped from the bucket stream"

    def refit(self, engine: Engine, checkpoint_dir: str, target: RefitTarget, exclude: tuple[str, ...] = ()) -> None:
        from harness import safetensors_files

        tensors = safetensors_files.tensors(safetensors_files.files(checkpoint_dir), exclude=exclude)
        buckets = list(pack(tensors))
        start = 0
        for i, (bucket, entries) in enumerate(buckets):
            engine.rpc(
                _receive,
                {
                    "bucket": bucket,
                    "entries": entries,
                    "first": i == 0,
                    "last": i == len(buckets) - 1,
                    "bucket_start": start,
                },
            )
            start += bucket.numel()

    def sabotaged_refit(self, engine: Engine, target: RefitTarget) -> None:
        self.refit(engine, self.checkpoints.directory(target), target, exclude=(self.left_out,))

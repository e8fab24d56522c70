"""Exact tensor digests: one algorithm per arm, chosen by ``--digest`` (``DigestChoice``).

Digests only have to tell A, B and "neither" apart on one machine; they are not a security
boundary, so the default is a non-cryptographic 128-bit hash at memory speed.

- ``xxh3-128-tree4M`` (``xxh3``, the default on CPU): a tensor of at most 4 MiB is the
  xxh3-128 of its bytes; a larger one is the xxh3-128 (seeded with its byte count) of the
  xxh3-128 digests of its 4 MiB leaves, hashed in parallel on the arm's torch threads
  (xxhash releases the GIL), the way a copy uses them.
- ``blake3-128`` (``blake3``): blake3 of the bytes, 16 bytes of output.
- ``poly31x4`` (``device``, the default with CUDA): an exact reduction over the raw bytes on
  the tensor's own device, no host copy (``harness.worker.device_digest``).

Every algorithm hashes the tensor's bytes in row-major order, whatever its layout; dtype
and shape are recorded beside the digest. A contiguous CPU tensor is hashed in place; a
non-contiguous or device tensor is copied to the host a bounded run of rows at a time.

A census digests all its tensors in one call, ``digest_many``; the kernel-input recorder, which
meets its tensors one op at a time, calls ``digest``. Both give the same digest of a tensor.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import cast

import blake3
import torch
import xxhash

from harness.spec.run import DigestChoice

XXH3 = "xxh3-128-tree4M"
BLAKE3 = "blake3-128"
ALGORITHMS: dict[str, str] = {"xxh3": XXH3, "blake3": BLAKE3, "device": "poly31x4"}
"""``--digest`` choice -> the algorithm's recorded name (``ArmResult.environment['digest']``)."""
LEAF_BYTES = 4 << 20
"""Leaf size of ``xxh3-128-tree4M`` (part of its name: changing it changes every digest)."""
_HOST_CHUNK_BYTES = 64 << 20  # bounds the host copy of a non-contiguous or device tensor
_BLAKE3_THREADED_BYTES = 1 << 20  # below this, blake3's thread pool costs more than it saves


def resolve(choice: DigestChoice | str = "auto") -> str:
    """The recorded name of the algorithm ``choice`` means in this process (``auto``: the device
    digest where CUDA is available, xxh3 elsewhere)."""
    if choice == "auto":
        choice = "device" if torch.cuda.is_available() else "xxh3"
    try:
        return ALGORITHMS[choice]
    except KeyError:
        raise ValueError(f"unknown digest {choice!r}; available: {['auto', *ALGORITHMS]}") from None


def digest(t: torch.Tensor, algorithm: str = XXH3) -> str:
    """The digest of ``t``'s bytes in row-major order with ``algorithm`` (a recorded name)."""
    if algorithm == XXH3 and t.is_cpu and (nbytes := t.nbytes) <= LEAF_BYTES and t.is_contiguous():
        # The common case, first and with the fewest calls: a census digests thousands of these.
        return xxhash.xxh3_128_hexdigest(_in_place(t, nbytes) if nbytes else b"")
    if t.device.type == "meta":
        return "meta"
    data = t.detach()
    if algorithm == XXH3:
        return _xxh3(data)
    if algorithm == BLAKE3:
        return _blake3(data)
    if algorithm == ALGORITHMS["device"]:
        from harness.worker.device_digest import device_digest

        return device_digest(data)
    raise ValueError(f"unknown digest algorithm {algorithm!r}; available: {sorted(ALGORITHMS.values())}")


def digest_many(tensors: Sequence[torch.Tensor], algorithm: str = XXH3) -> list[str | Exception]:
    """The digest of each tensor, as ``digest`` gives it, or the exception that stopped it there
    (one tensor that cannot be read spoils no other).

    Under xxh3 the contiguous CPU tensors, nearly all of a census, are taken together: the small
    ones in one loop with the fewest calls each, then the leaves of all the large ones from one
    queue on every thread, so no thread waits at the end of each tensor. Measured by the bench
    on the 2-core EPYC with nothing else running, 1.24 GB in 6154 tensors: 0.93-1.02 of a
    copy's bandwidth, where one ``digest`` call per tensor reached 0.85-0.94 (docs/digest.md)."""
    found: list[str | Exception | None] = [None] * len(tensors)
    if algorithm == XXH3:
        _xxh3_in_place(tensors, found)
    for i, t in enumerate(tensors):
        if found[i] is None:
            try:
                found[i] = digest(t, algorithm)
            except Exception as exc:
                found[i] = exc
    return cast("list[str | Exception]", found)  # every place is filled by now


def _xxh3_in_place(tensors: Sequence[torch.Tensor], found: list[str | Exception | None]) -> None:
    """Fill ``found`` with the xxh3 digests of the contiguous CPU tensors, read in place; the
    others (and any that raised here) stay ``None``, for ``digest``, which says why."""
    trees: list[tuple[int, int, memoryview]] = []  # (position, bytes, the bytes) of each tensor above a leaf
    hexdigest, byte = xxhash.xxh3_128_hexdigest, ctypes.c_char  # bound once: thousands of small tensors
    for i, t in enumerate(tensors):
        try:
            if not (t.is_cpu and t.is_contiguous()):
                continue
            nbytes = t.nbytes
            if nbytes > LEAF_BYTES:
                trees.append((i, nbytes, memoryview(_in_place(t, nbytes)).cast("B")))
            else:
                found[i] = hexdigest((byte * nbytes).from_address(t.data_ptr()) if nbytes else b"")
        except Exception:
            continue
    leaves = [view[at : at + LEAF_BYTES] for _, nbytes, view in trees for at in range(0, nbytes, LEAF_BYTES)]
    leaf_digests = iter(_leaf_hasher()(leaves))
    for i, nbytes, _ in trees:
        found[i] = _tree_root([next(leaf_digests) for _ in range(-(-nbytes // LEAF_BYTES))], nbytes)


def _tree_root(leaf_digests: list[bytes], nbytes: int) -> str:
    """xxh3-128-tree4M of a tensor above one leaf, from its leaves' digests in order."""
    return xxhash.xxh3_128_hexdigest(b"".join(leaf_digests), seed=nbytes)


def _xxh3(data: torch.Tensor) -> str:
    nbytes = data.numel() * data.element_size()
    if nbytes <= LEAF_BYTES:
        h = xxhash.xxh3_128()
        for chunk in host_chunks(data, nbytes):
            h.update(chunk)
        return h.hexdigest()
    leaves: list[bytes] = []
    partial, filled = None, 0  # a leaf split between two host chunks
    hash_all = _leaf_hasher()
    for chunk in host_chunks(data, nbytes):
        at = 0
        if partial is not None:
            at = min(LEAF_BYTES - filled, len(chunk))
            partial.update(chunk[:at])
            filled += at
            if filled < LEAF_BYTES:
                continue
            leaves.append(partial.digest())
            partial, filled = None, 0
        whole = (len(chunk) - at) // LEAF_BYTES
        leaves += hash_all([chunk[at + i * LEAF_BYTES : at + (i + 1) * LEAF_BYTES] for i in range(whole)])
        at += whole * LEAF_BYTES
        if at < len(chunk):
            partial, filled = xxhash.xxh3_128(chunk[at:]), len(chunk) - at
    if partial is not None:
        leaves.append(partial.digest())
    return _tree_root(leaves, nbytes)


_POOL: tuple[int, ThreadPoolExecutor] | None = None


def _leaf_hasher() -> Callable[[list[memoryview]], list[bytes]]:
    """Hash leaves on as many threads as torch uses here (the arm sets them per engine): the
    caller and ``threads - 1`` pool workers each take the next leaf from one shared iterator
    until none is left. No future per leaf: on the 2-core EPYC this hashes 64-128 MiB tensors
    1.2-1.3 times as fast as a ``pool.map`` over the leaves with the caller waiting on each
    result; and a thread that the shared machine slows down takes fewer leaves."""
    global _POOL
    threads = torch.get_num_threads()
    if threads <= 1:
        return lambda leaves: [xxhash.xxh3_128_digest(leaf) for leaf in leaves]
    if _POOL is None or _POOL[0] != threads:
        if _POOL is not None:
            _POOL[1].shutdown(wait=False)
        _POOL = (threads, ThreadPoolExecutor(threads - 1, thread_name_prefix="refit-harness-digest"))
    pool = _POOL[1]

    def hash_all(leaves: list[memoryview]) -> list[bytes]:
        digests = [b""] * len(leaves)
        todo = iter(range(len(leaves)))  # next() on it is atomic under the GIL

        def work() -> None:
            for i in todo:
                digests[i] = xxhash.xxh3_128_digest(leaves[i])

        helpers = [pool.submit(work) for _ in range(min(threads, len(leaves)) - 1)]
        work()
        for helper in helpers:
            helper.result()
        return digests

    return hash_all


def _blake3(data: torch.Tensor) -> str:
    nbytes = data.numel() * data.element_size()
    hasher = blake3.blake3(max_threads=blake3.blake3.AUTO if nbytes >= _BLAKE3_THREADED_BYTES else 1)
    for chunk in host_chunks(data, nbytes):
        hasher.update(chunk)
    return hasher.hexdigest(length=16)


def host_chunks(data: torch.Tensor, nbytes: int) -> Iterator[memoryview]:
    """The tensor's bytes in row-major order, as host buffers of at most a chunk (one row
    of dim 0 may be larger), without copying a contiguous CPU tensor."""
    if data.numel() == 0:
        return
    if data.device.type == "cpu" and data.is_contiguous():
        yield memoryview(_in_place(data, nbytes)).cast("B")  # bytes, to be cut into leaves
        return
    if data.dim() == 0 or nbytes <= _HOST_CHUNK_BYTES:
        yield _bytes_view(data.contiguous().cpu())
        return
    rows = max(1, data.shape[0] * _HOST_CHUNK_BYTES // nbytes)
    for start in range(0, data.shape[0], rows):
        yield _bytes_view(data[start : start + rows].contiguous().cpu())


def _in_place(data: torch.Tensor, nbytes: int) -> ctypes.Array[ctypes.c_char]:
    """The ``nbytes`` bytes of a non-empty contiguous CPU tensor, read in place from its address
    (measured per small tensor: a numpy view 1.9 µs, this 0.35 µs, and a memoryview cast over it
    another 0.27 µs, which counts for thousands of small tensors: hashing takes the array as is).
    The array does not keep ``data`` alive: the caller holds it while the array is used."""
    return (ctypes.c_char * nbytes).from_address(data.data_ptr())


def _bytes_view(data: torch.Tensor) -> memoryview:
    """The flat bytes of a contiguous CPU tensor through numpy, which keeps the tensor alive
    (for the temporary host copies). Through uint8: numpy has no bfloat16 or float8."""
    return memoryview(data.reshape(-1).view(torch.uint8).numpy())  # flat: leaves are cut by byte

"""Break what ``sleep`` will restore: the sleep paths' sabotaged twins (torch only).

``sleep(level=1)`` copies every allocation of vLLM's cumem pool tagged ``weights`` to a CPU
tensor (``CuMemAllocator.pointer_to_data[ptr].cpu_backup_tensor``, an ``AllocationData``) and
unmaps the GPU memory; ``wake_up()`` maps it again and copies the backups back. Zeroing a
tensor's bytes in those backups between the two is a wake-up that restores nothing for that
tensor: if the path's observation after ``wake_up`` could not see it, the path proves nothing
about the restore.

``sleep(level=2)`` discards the weights instead, and saves a CPU copy of every model buffer
(``Worker._sleep_saved_buffers``) that ``wake_up(tags=["weights"])`` copies back: a reload
rewrites the weights, not those buffers. Zeroing one saved copy is a level-2 wake-up that
restores nothing for it.
"""

from __future__ import annotations


def zero_in_backups(pointer_to_data: dict, address: int, nbytes: int) -> int:
    """Zero ``[address, address + nbytes)`` in the CPU backups of the allocations that hold it
    (``pointer_to_data``: allocation base address -> vLLM's ``AllocationData``); the bytes
    zeroed. Raises ``LookupError`` unless every byte lies in an offloaded allocation."""
    covered = 0
    for base, data in pointer_to_data.items():
        size = data.handle[1]
        lo, hi = max(address, base), min(address + nbytes, base + size)
        if lo >= hi:
            continue
        if data.cpu_backup_tensor is None:
            raise LookupError(
                f"the allocation at {base:#x} ({data.tag!r}) holds it but has no CPU backup: not asleep at level 1, "
                "or not memory sleep offloads"
            )
        data.cpu_backup_tensor[lo - base : hi - base].zero_()
        covered += hi - lo
    if covered != nbytes:
        raise LookupError(f"only {covered} of its {nbytes} bytes lie in sleep-mode memory")
    return covered


ROTARY_CACHE = "cos_sin_cache"
"""The buffer the level-2 twin damages when the model has one: every attention layer reads it
(RoPE), no checkpoint holds it (non-persistent), and a reload never rewrites it, so only
``wake_up``'s restore of the saved buffers brings it back."""


def zero_saved_buffer(saved: dict, prefer: str = ROTARY_CACHE) -> str:
    """Zero one entry of the CPU copies of the model's buffers that ``sleep(level=2)`` saved and
    ``wake_up(tags=["weights"])`` copies back (vLLM's ``Worker._sleep_saved_buffers``: name ->
    tensor): the first whose name ends with ``prefer``, else the first floating-point one. Returns
    its name. Raises ``LookupError`` when nothing was saved (not asleep at level 2)."""
    if not saved:
        raise LookupError("no saved buffers: the worker is not asleep at level 2 (only level 2 saves them)")
    floating = [n for n, t in saved.items() if t.is_floating_point() and t.numel()]
    name = next((n for n in floating if n.endswith(prefer)), floating[0] if floating else None)
    if name is None:
        raise LookupError(f"none of the {len(saved)} saved buffers is floating point: {sorted(saved)[:5]}")
    saved[name].zero_()
    return name

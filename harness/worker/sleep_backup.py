"""Break what ``sleep(level=1)`` will restore: the sleep paths' sabotaged twin (torch only).

``sleep(level=1)`` copies every allocation of vLLM's cumem pool tagged ``weights`` to a CPU
tensor (``CuMemAllocator.pointer_to_data[ptr].cpu_backup_tensor``, an ``AllocationData``) and
unmaps the GPU memory; ``wake_up()`` maps it again and copies the backups back. Zeroing a
tensor's bytes in those backups between the two is a wake-up that restores nothing for that
tensor: if the path's observation after ``wake_up`` could not see it, the path proves nothing
about the restore.
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

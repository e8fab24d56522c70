"""An exact digest computed where the tensor lives: a reduction over its raw bytes in torch
ops, so a CUDA tensor is digested on the GPU with no copy to the host.

The bytes (row-major, little-endian) are read as 16-bit units ``u_i``, in blocks of
``BLOCK_UNITS``; unit ``i`` sits at position ``j = i mod BLOCK_UNITS`` of block
``b = i div BLOCK_UNITS``. Each of four lanes is a two-variable polynomial over a prime
``p < 2**31``::

    lane = sum_i u_i * g**j * h**b   (mod p)

Every intermediate stays below ``2**63`` in int64 (``u < 2**16``, ``g**j < 2**31``, a block
sums ``2**16`` such products), so the value is exact and the same on every device: the
same code on a CPU tensor is the CPU twin, and ``reference_digest`` recomputes it from the
bytes with Python integers. A 16-bit unit never wraps modulo ``p``, so changing one unit
always changes every lane; two different tensors agree in a lane with probability about
``1/p`` (the four lanes together: about ``2**-124``). Not a cryptographic hash: digests
only tell A, B and "neither" apart. The length is not mixed in: dtype and shape are
compared beside the digest.
"""

from __future__ import annotations

import torch

ALGORITHM = "poly31x4"
BLOCK_UNITS = 1 << 16
_BLOCK_BYTES = 2 * BLOCK_UNITS
_CHUNK_BYTES = 256 * _BLOCK_BYTES  # 32 MiB of data at a time (int64 temporaries: 4x that, twice)
# (prime p, generator g of the position in a block, generator h of the block index)
LANES = (
    (2147483647, 1103515245, 1664525013),
    (2147483629, 22695477, 134775813),
    (2147483587, 1140671485, 214013),
    (2147483579, 16843009, 69069001),
)


def device_digest(t: torch.Tensor) -> str:
    """The digest of ``t``'s bytes, computed on ``t``'s own device (see the module docstring)."""
    data = t.detach()
    if data.device.type == "meta":
        return "meta"
    state = _State(data.device)
    for chunk in _device_chunks(data):
        state.feed(chunk)
    return state.finish()


def _device_chunks(data: torch.Tensor):
    """The tensor's bytes in row-major order as flat uint8 tensors on its device: a view of a
    contiguous tensor, else a contiguous copy of a bounded run of rows (never on the host)."""
    if data.numel() == 0:
        return
    if data.dim() == 0:
        data = data.reshape(1)
    if data.is_contiguous():
        flat = data.reshape(-1).view(torch.uint8)
        for start in range(0, flat.numel(), _CHUNK_BYTES):
            yield flat[start : start + _CHUNK_BYTES]
        return
    nbytes = data.numel() * data.element_size()
    rows = max(1, data.shape[0] * _CHUNK_BYTES // nbytes)
    for start in range(0, data.shape[0], rows):
        yield data[start : start + rows].contiguous().reshape(-1).view(torch.uint8)


class _State:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.blocks = 0  # whole blocks reduced so far
        self.carry = torch.empty(0, dtype=torch.uint8, device=device)
        self.acc = torch.zeros(len(LANES), dtype=torch.int64, device=device)
        self.g_powers = _g_powers(device)

    def feed(self, u8: torch.Tensor) -> None:
        if self.carry.numel():
            u8 = torch.cat((self.carry, u8))
        whole = u8.numel() // _BLOCK_BYTES * _BLOCK_BYTES
        if whole:
            self._reduce(u8[:whole])
        self.carry = u8[whole:].clone()

    def finish(self) -> str:
        if self.carry.numel():
            pad = torch.zeros(_BLOCK_BYTES - self.carry.numel(), dtype=torch.uint8, device=self.device)
            self._reduce(torch.cat((self.carry, pad)))
        return "".join(f"{v:08x}" for v in self.acc.tolist())

    def _reduce(self, u8: torch.Tensor) -> None:
        """Add whole blocks (``u8.numel()`` a multiple of the block size) to every lane."""
        if u8.storage_offset() % 2:
            u8 = u8.clone()  # a 16-bit view needs an even byte offset
        units = (u8.view(torch.int16).to(torch.int64) & 0xFFFF).view(-1, BLOCK_UNITS)
        n = units.shape[0]
        index = torch.arange(self.blocks, self.blocks + n, dtype=torch.int64, device=self.device)
        for k, (p, _, h) in enumerate(LANES):
            inner = (units * self.g_powers[k]).sum(dim=1) % p  # < 2**16 * 2**31 * 2**16 = 2**63
            self.acc[k] = (self.acc[k] + (inner * _pow_mod(h, index, p, self.blocks + n - 1) % p).sum()) % p
        self.blocks += n


_G_POWERS: dict[str, torch.Tensor] = {}


def _g_powers(device: torch.device) -> torch.Tensor:
    """``g**j mod p`` for every lane and block position, made once per device."""
    key = str(device)
    if key not in _G_POWERS:
        j = torch.arange(BLOCK_UNITS, dtype=torch.int64)
        _G_POWERS[key] = torch.stack([_pow_mod(g, j, p, BLOCK_UNITS - 1) for p, g, _ in LANES]).to(device)
    return _G_POWERS[key]


def _pow_mod(base: int, exponents: torch.Tensor, p: int, largest: int) -> torch.Tensor:
    """``base ** e mod p`` for every exponent ``e <= largest``, by squaring (products < 2**62;
    the loop count comes from ``largest``, so a CUDA tensor is never read back for it)."""
    result = torch.ones_like(exponents)
    power = base % p
    for bit in range(max(1, largest.bit_length())):
        odd = ((exponents >> bit) & 1).bool()
        result = torch.where(odd, result * power % p, result)
        power = power * power % p
    return result


def reference_digest(raw: bytes) -> str:
    """The same digest from the bytes alone, with Python integers (slow: for tests)."""
    if len(raw) % 2:
        raw += b"\0"
    units = [int.from_bytes(raw[i : i + 2], "little") for i in range(0, len(raw), 2)]
    out = []
    for p, g, h in LANES:
        acc, gj, hb = 0, 1, 1
        for i, u in enumerate(units):
            j = i % BLOCK_UNITS
            if j == 0:
                gj = 1
                hb = pow(h, i // BLOCK_UNITS, p)
            acc = (acc + u * gj * hb) % p
            gj = gj * g % p
        out.append(f"{acc:08x}")
    return "".join(out) if units else "0" * 8 * len(LANES)

"""The memory behind a ``KVBlockPool``: the preallocated device buffer and the CPU tier.

torch is optional: ``load_torch()`` imports it lazily and returns ``None`` without it, and the
pool then keeps its bookkeeping only (the demo's simulator runs that way on machines with no
torch). Both classes here hold exactly one preallocated tensor each, so the pool never asks the
caching allocator for memory after construction.

Buffer layout, block-major: ``(num_blocks, num_layers, 2, block_size, num_kv_heads, head_dim)``
where index 0 of the third axis is K and 1 is V. One block's KV for every layer is contiguous,
so an offload or a restore is one contiguous copy; per-layer access uses strided views.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from types import ModuleType
from typing import TYPE_CHECKING

from vramscope.hooks.kvpool_types import KVPoolError

if TYPE_CHECKING:  # torch is optional: names for annotations only
    from torch import Tensor
    from torch import device as TorchDevice

log = logging.getLogger("vramscope.kvpool")


def load_torch() -> ModuleType | None:
    """The torch module, or ``None`` when it is not installed."""
    try:
        import torch
    except ImportError:
        return None
    return torch


class DeviceBuffer:
    """One tensor holding every block of the pool, on the pool's device."""

    def __init__(self, torch: ModuleType, block_shape: tuple[int, ...], num_blocks: int,
                 dtype_name: str, device: str | TorchDevice) -> None:
        self.torch = torch
        self.block_size = block_shape[2]
        dtype = getattr(torch, dtype_name)
        self.tensor: Tensor = torch.zeros((num_blocks, *block_shape), dtype=dtype, device=device)

    def key_cache(self, layer: int) -> Tensor:
        """K of ``layer`` as a view ``(num_blocks, block_size, num_kv_heads, head_dim)``."""
        return self.tensor[:, layer, 0]

    def value_cache(self, layer: int) -> Tensor:
        return self.tensor[:, layer, 1]

    def _slots(self, blocks: Sequence[int], start: int, end: int
               ) -> tuple[Tensor, Tensor]:
        bs = self.block_size
        device = self.tensor.device
        block_idx = [blocks[p // bs] for p in range(start, end)]
        offsets = [p % bs for p in range(start, end)]
        as_tensor = self.torch.tensor
        return (as_tensor(block_idx, dtype=self.torch.long, device=device),
                as_tensor(offsets, dtype=self.torch.long, device=device))

    def write(self, blocks: Sequence[int], layer: int, start: int, key: Tensor,
              value: Tensor) -> None:
        """Store ``key``/``value`` of shape ``(n, num_kv_heads, head_dim)`` at token ``start``."""
        block_idx, offsets = self._slots(blocks, start, start + key.shape[0])
        self.tensor[block_idx, layer, 0, offsets] = key.to(self.tensor.dtype)
        self.tensor[block_idx, layer, 1, offsets] = value.to(self.tensor.dtype)

    def read(self, blocks: Sequence[int], layer: int, start: int, end: int
             ) -> tuple[Tensor, Tensor]:
        """K and V of tokens ``[start, end)``, each ``(end - start, num_kv_heads, head_dim)``."""
        block_idx, offsets = self._slots(blocks, start, end)
        return (self.tensor[block_idx, layer, 0, offsets],
                self.tensor[block_idx, layer, 1, offsets])


class HostTier:
    """Offloaded blocks in host memory, keyed by their prefix key, bounded in bytes.

    Capacity is ``capacity_bytes // bytes_per_block`` slots of one preallocated host tensor,
    pinned when CUDA is available (fast, asynchronous-capable copies) and plain otherwise. When
    full, the least recently offloaded entry is dropped for a new one. Without torch it keeps
    the same bookkeeping with no tensor, so slot counts and hits behave identically.
    """

    def __init__(self, capacity_bytes: int, bytes_per_block: int, torch: ModuleType | None,
                 block_shape: tuple[int, ...], dtype_name: str) -> None:
        slots = capacity_bytes // bytes_per_block
        if slots < 1:
            raise KVPoolError(f"cpu_tier_bytes={capacity_bytes} is smaller than one block "
                              f"({bytes_per_block} bytes); raise it or pass 0 to disable the tier")
        self.num_slots = slots
        self.bytes_per_block = bytes_per_block
        self.capacity_bytes = slots * bytes_per_block
        self.dropped = 0  # entries pushed out by newer offloads
        self._free_slots = list(range(slots - 1, -1, -1))
        self._index: OrderedDict[Hashable, int] = OrderedDict()  # LRU first
        self.pinned = False
        self.host: Tensor | None = None
        if torch is not None:
            self.pinned = bool(torch.cuda.is_available())
            self.host = torch.zeros((slots, *block_shape), dtype=getattr(torch, dtype_name),
                                    pin_memory=self.pinned)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._index

    def __len__(self) -> int:
        return len(self._index)

    @property
    def bytes_used(self) -> int:
        return (self.num_slots - len(self._free_slots)) * self.bytes_per_block

    def put(self, key: Hashable) -> int | None:
        """A slot for ``key`` (dropping the oldest entry if full), or None if all are claimed."""
        slot = self._index.get(key)
        if slot is not None:
            self._index.move_to_end(key)
            return slot
        if self._free_slots:
            slot = self._free_slots.pop()
        elif self._index:
            _, slot = self._index.popitem(last=False)
            self.dropped += 1
        else:
            return None
        self._index[key] = slot
        return slot

    def claim(self, key: Hashable) -> int:
        """Take ``key``'s slot out of the index; it stays reserved until ``release``."""
        return self._index.pop(key)

    def release(self, slot: int) -> None:
        self._free_slots.append(slot)


def copy_block(dst: Tensor, dst_index: int, src: Tensor, src_index: int) -> None:
    """Copy one block (every layer, K and V) between the device buffer and the host tier."""
    dst[dst_index].copy_(src[src_index])


_no_torch_logged = False  # one line per process, however many pools


def log_no_torch_once() -> None:
    global _no_torch_logged
    if not _no_torch_logged:
        _no_torch_logged = True
        log.info("vramscope: torch is not installed; KVBlockPool keeps bookkeeping only "
                 "(no tensors). Install torch for a real KV buffer.")

"""The KV-cache manager: the engine's per-slot K/V storage for either step kind (plain per-layer tensors for the fused
step, a `SlotCache` for the model's own forward), its allocation, moving one row's K/V into another, and which
request holds which slot.

Each slot is one row of `max_cache_len` positions in every layer, at its own position. The ownership half (`take`,
`release`, `follow`, `busy`, `free_slots`) is host bookkeeping that the scheduler reads and writes; the storage half
(`allocate`, `slot_cache`, `move_row`) holds device tensors, which the runner's steps write and which move only when
the runner asks (`move_row`).
"""

from __future__ import annotations

from typing import Any


class KVCache:
    """K/V rows for `slots` requests of up to `max_cache_len` positions each, and the request id each row holds."""

    def __init__(self, slots: int, max_cache_len: int) -> None:
        self.slots = slots
        self.max_cache_len = max_cache_len
        self.owner: list[Any] = [None] * slots  # request id per slot (None: free)
        self.keys: list[Any] = []  # the fused step's plain (slots, kv heads, max_cache_len, head dim) per layer ...
        self.values: list[Any] = []
        self.cache: Any = None  # ... or the model step's SlotCache

    # ---- which request holds which slot (host) ----------------------------------------------------------------

    @property
    def free_slots(self) -> int:
        """Slots no request holds."""
        return self.owner.count(None)

    def take(self, request_id: Any) -> int | None:
        """Give `request_id` the lowest free slot (None when every slot is held)."""
        if None not in self.owner:
            return None
        slot = self.owner.index(None)
        self.owner[slot] = request_id
        return slot

    def release(self, slot: int) -> None:
        """Free `slot` (its K/V stays until overwritten: a row's positions are written before they are read)."""
        self.owner[slot] = None

    def busy(self) -> list[int]:
        """The held slots, ascending."""
        return [slot for slot, owner in enumerate(self.owner) if owner is not None]

    def follow(self, source: int, target: int) -> None:
        """The request in `source` now holds `target` (after its row moved there); `source` is free."""
        self.owner[target], self.owner[source] = self.owner[source], None

    # ---- storage (device) ----------------------------------------------------------------------------------------

    def allocate(self, layers: int, shape: tuple[int, ...], dtype: Any, device: Any) -> tuple[list[Any], list[Any]]:
        """The fused step's K/V: `layers` pairs of zeroed (slots, kv heads, max_cache_len, head dim) tensors."""
        import torch

        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        return self.keys, self.values

    def slot_cache(self, layers: int, positions: Any) -> Any:
        """The model step's `SlotCache` of `layers` layers writing at `positions` (each layer allocates its rows on
        its first update, where the model's heads, head size and dtype are known)."""
        from ..decode.slot_cache import SlotCache

        self.cache = SlotCache(self.slots, self.max_cache_len, layers, positions)
        return self.cache

    def tensors(self) -> list[tuple[Any, Any]]:
        """(keys, values) of every layer, whichever step kind owns them."""
        if self.cache is not None:
            return [(layer.keys, layer.values) for layer in self.cache.layers]
        return list(zip(self.keys, self.values, strict=True))

    @property
    def nbytes(self) -> int:
        """Device bytes the K/V rows hold."""
        return sum(t.numel() * t.element_size() for pair in self.tensors() for t in pair)

    def move_row(self, source: int, target: int, columns: int) -> None:
        """Copy row `source`'s K/V (its first `columns` positions, every layer) into row `target`."""
        for keys, values in self.tensors():
            keys[target, :, :columns] = keys[source, :, :columns]
            values[target, :, :columns] = values[source, :, :columns]

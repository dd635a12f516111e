"""The KV-cache manager: the engine's paged K/V storage for both step kinds, its blocks, and which request holds
which slot.

K/V live in a pool of fixed-size blocks per layer, (kv heads, blocks + 1, block_size, head dim); a request holds
ceil(positions / block_size) of them (`block_manager.BlockManager`), so the requests a device holds at once are
bounded by the tokens they hold, not by slots x `max_cache_len` (vLLM's paged attention, Transformers' continuous
batching's PagedAttentionCache, nano-vllm's block manager). Each slot (a row of the step) has a row of a fixed-shape
device block table, (slots, ceil(max_cache_len / block_size)): its request's blocks in position order, block 0 (the
scratch block, never a request's) everywhere else, so an idle row's or a finished row's write lands there and
a captured step keeps its shapes and addresses. A decode step writes each row's new K/V at `table[row, position //
block_size]`, offset `position % block_size` (computed on the device from the row's position: no host slot
mapping), and reads a row's K/V by gathering its blocks up to the step's column bucket into the attention input.

The host half (`take`, `release`, `follow`, `busy`, `free_slots`; `needed`, `reserve`, `drop`, `holds`) is
bookkeeping the scheduler reads and writes; `sync()` (the runner, before each forward) writes the rows that changed
into a host copy of the table (pinned where the platform allows, `transfers.Transfers`) and, only when one changed,
copies it to the device table in one non-blocking copy: no stream synchronize, the device table's storage never
changes (captured steps keep reading it). The device half (`allocate`, `write_decode`, `write`, `write_positions`,
`gather`, `gather_rows`, `copy`) is what the steps call. A row moving to another slot moves its table row, not its K/V.
"""

from __future__ import annotations

from typing import Any

from ...errors import FastDecodeError
from .block_manager import DEFAULT_BLOCK_SIZE, BlockManager, blocks_for

#: The device block free rows and unheld table entries point at (its contents are never attended: masked).
SCRATCH = 0


class KVCache:
    """Paged K/V for `slots` rows of up to `max_cache_len` positions each: `num_blocks` blocks of `block_size`
    (default: every slot at `max_cache_len`, the old reservation; `sizer(bytes_per_token)` -> blocks decides it
    instead once the model's K/V shape is known, at `allocate`); `prefix_caching` shares full prompt blocks;
    `transfers` (`transfers.Transfers`, default: plain copies) copies the block table to the device."""

    paged = True

    def __init__(self, slots: int, max_cache_len: int, num_blocks: int | None = None,
                 block_size: int = DEFAULT_BLOCK_SIZE, sizer: Any = None, prefix_caching: bool = False,
                 transfers: Any = None) -> None:
        self.slots = slots
        self.max_cache_len = max_cache_len
        self.block_size = block_size
        self.max_blocks = blocks_for(max_cache_len, block_size)  # table columns: blocks of a max-length row
        self.span_len = self.max_blocks * block_size  # positions a whole table row addresses
        self.owner: list[Any] = [None] * slots  # request key per slot (None: free)
        self.prefix_caching = prefix_caching
        self.blocks = BlockManager(num_blocks or slots * self.max_blocks, block_size, prefix_caching=prefix_caching)
        self.sizer = sizer
        self.bytes_per_token = 0  # known at allocate
        self.rows: list[list[int]] = [[] for _ in range(slots)]  # host mirror: each slot's device blocks
        self._dirty: set[int] = set()
        self.table: Any = None  # device (slots, max_blocks) long
        self.attention = "gather"  # how a decode step reads the blocks: "gather" or "triton" (decode/paged_attention)
        self.host_table: Any = None  # its host copy (pinned where supported), rewritten row by row in `sync`
        self.transfers = transfers
        self._copied: Any = None  # the event after the last host -> device table copy (None: none, or no events)
        self.table_copies = 0  # host -> device table copies (one per step at most, when a row changed)
        self.keys: list[Any] = []  # per layer (num_blocks + 1, kv heads, block_size, head dim)
        self.values: list[Any] = []

    # ---- which request holds which slot and which blocks (host) -----------------------------------------------

    @property
    def num_blocks(self) -> int:
        """Blocks in the pool (the scratch block not counted)."""
        return self.blocks.num_blocks

    @property
    def free_slots(self) -> int:
        """Slots no request holds."""
        return self.owner.count(None)

    @property
    def free_blocks(self) -> int:
        """Blocks no request holds."""
        return self.blocks.free_blocks

    def take(self, key: Any) -> int | None:
        """Give `key` the lowest free slot (None when every slot is held); it holds no blocks yet."""
        if None not in self.owner:
            return None
        slot = self.owner.index(None)
        self.owner[slot] = key
        return slot

    def release(self, slot: int) -> None:
        """Free `slot` and its request's blocks."""
        self.drop(slot)
        self.owner[slot] = None

    def busy(self) -> list[int]:
        """The held slots, ascending."""
        return [slot for slot, owner in enumerate(self.owner) if owner is not None]

    def follow(self, source: int, target: int) -> None:
        """The request in `source` now holds `target` with its blocks; `source` is free."""
        self.owner[target], self.owner[source] = self.owner[source], None
        self.rows[target], self.rows[source] = self.rows[source], []
        self._dirty |= {source, target}

    def holds(self, slot: int) -> bool:
        """Whether the request in `slot` holds blocks."""
        return bool(self.rows[slot])

    def needed(self, slot: int, tokens: int) -> int:
        """Blocks the request in `slot` lacks for its first `tokens` positions."""
        return self.blocks.needed(self.owner[slot], min(tokens, self.max_cache_len))

    def reserve(self, slot: int, tokens: int) -> bool:
        """Blocks for the first `tokens` positions of the request in `slot`; False (nothing taken) when too few
        are free."""
        blocks = self.blocks.reserve(self.owner[slot], min(tokens, self.max_cache_len))
        if blocks is None:
            return False
        if len(blocks) != len(self.rows[slot]):
            self.rows[slot] = [b + 1 for b in blocks]  # device block ids: 0 is the scratch block
            self._dirty.add(slot)
        return True

    def share(self, slot: int, tokens: list[int]) -> int:
        """The request in `slot` (holding no blocks) takes the cached blocks of `tokens`' leading full blocks (prefix
        caching; 0 without it): the positions they cover, where its prefill starts."""
        if not self.prefix_caching or self.rows[slot]:
            return 0
        covered = self.blocks.share(self.owner[slot], tokens)
        self.rows[slot] = [b + 1 for b in self.blocks.tables[self.owner[slot]].blocks]
        self._dirty.add(slot)
        return covered

    def register(self, slot: int, tokens: list[int], written: int) -> None:
        """Index the full blocks of `tokens` the request in `slot` has written (its first `written` positions)."""
        if self.prefix_caching:
            self.blocks.register(self.owner[slot], tokens, written)

    def drop(self, slot: int) -> None:
        """Give back the blocks of the request in `slot` (it keeps the slot: preempted, it recomputes later)."""
        if self.owner[slot] is not None:
            self.blocks.free(self.owner[slot])
        if self.rows[slot]:
            self.rows[slot] = []
            self._dirty.add(slot)

    def check_fits(self, tokens: int, copies: int, where: str) -> None:
        """Refuse (FastDecodeError) a request whose `copies` choices of `tokens` positions exceed the whole pool."""
        need = copies * blocks_for(tokens, self.block_size)
        if need > self.num_blocks:
            raise FastDecodeError(
                f"{where} needs {need} KV blocks ({copies} x {tokens} positions in blocks of {self.block_size}) but "
                f"the whole pool holds {self.num_blocks} ({self.num_blocks * self.block_size} tokens); give the "
                "engine more KV memory (kv_cache_memory, hwrun serve --kv-cache-memory) or ask for fewer tokens.")

    # ---- storage (device) ----------------------------------------------------------------------------------------

    def allocate(self, layers: int, kv_heads: int, head_dim: int, dtype: Any, device: Any) -> None:
        """The pools of `layers` layers (once; `sizer` decides the block count from the bytes a position costs)
        and the device block table."""
        import torch

        if self.keys:
            return
        self.bytes_per_token = 2 * layers * kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()
        if self.sizer is not None:
            num_blocks = self.sizer(self.bytes_per_token, self.block_size)
            self.blocks = BlockManager(num_blocks, self.block_size, prefix_caching=self.prefix_caching)
        # heads first: a gather of rows' blocks, pool[:, table], is (heads, rows, blocks, block_size, dim) and its
        # (heads, rows, positions, dim) view needs no second copy; attention batches over (heads, rows) as it is
        shape = (kv_heads, self.num_blocks + 1, self.block_size, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.table = torch.full((self.slots, self.max_blocks), SCRATCH, dtype=torch.long, device=device)
        if self.transfers is None:
            from .transfers import Transfers

            self.transfers = Transfers(None, device)  # plain copies
        self.host_table = self.transfers.host((self.slots, self.max_blocks), torch.long)
        self.head_index = torch.arange(kv_heads, device=device)[None, :].expand(self.slots, kv_heads)
        self.offsets = torch.arange(self.span_len, device=device)
        if not torch.compiler.is_compiling():
            for tensor in (*self.keys, *self.values):
                torch._dynamo.mark_static_address(tensor)  # fixed addresses, as StaticLayer marks its own
        self._dirty = set(range(self.slots))

    def sync(self) -> None:
        """Bring the device table up to the host rows (outside any graph): the rows that changed are written into the
        host table, then one non-blocking copy of it is queued; nothing when no row changed."""
        import torch

        if self.table is None or not self._dirty:
            return
        self.transfers.settle(self._copied)  # the last copy has read the host table (it has, a step ago)
        for slot in self._dirty:
            row = self.rows[slot]
            self.host_table[slot, len(row):] = SCRATCH
            if row:
                self.host_table[slot, :len(row)] = torch.tensor(row, dtype=torch.long)
        self._dirty.clear()
        self.transfers.copy(self.table, self.host_table)
        self._copied = self.transfers.record()
        self.table_copies += 1

    def span(self, columns: int) -> int:
        """Positions a gather up to `columns` returns (whole blocks)."""
        return blocks_for(columns, self.block_size) * self.block_size

    def write_decode(self, layer: int, position: Any, key: Any, value: Any) -> None:
        """Each of the first `rows` rows' new K/V (rows, kv heads, head dim) at its `position` (rows, 1)."""
        rows, heads = key.shape[0], key.shape[1]
        table = self.table if rows == self.slots else self.table[:rows]
        block = table.gather(1, position // self.block_size).expand(rows, heads)
        offset = (position % self.block_size).expand(rows, heads)
        heads_index = self.head_index if rows == self.slots else self.head_index[:rows]
        self.keys[layer].index_put_((heads_index, block, offset), key)
        self.values[layer].index_put_((heads_index, block, offset), value)

    def write(self, layer: int, rows: Any, start: int, key: Any, value: Any) -> None:
        """K/V (batch, kv heads, T, head dim) of table rows `rows` (a long tensor) at positions `start..start+T`."""
        positions = self.offsets[start:start + key.shape[2]]
        block = self.table[rows][:, positions // self.block_size]  # (batch, T)
        offset = (positions % self.block_size).expand_as(block)
        self.keys[layer][:, block, offset] = key.permute(1, 0, 2, 3)  # (heads, batch, T, dim)
        self.values[layer][:, block, offset] = value.permute(1, 0, 2, 3)

    def write_positions(self, layer: int, rows: Any, positions: Any, valid: Any, key: Any, value: Any) -> None:
        """K/V (batch, kv heads, T, head dim) of table rows `rows` (a long tensor) at `positions` (batch, T), each row
        its own; the columns `valid` (batch, T) marks False (padding) are written into the scratch block."""
        import torch

        span = positions.clamp(max=self.span_len - 1)
        block = self.table[rows].gather(1, span // self.block_size)
        block = torch.where(valid, block, torch.full_like(block, SCRATCH))
        offset = span % self.block_size
        self.keys[layer][:, block, offset] = key.permute(1, 0, 2, 3)  # (heads, batch, T, dim)
        self.values[layer][:, block, offset] = value.permute(1, 0, 2, 3)

    def gather(self, layer: int, rows: int, columns: int) -> tuple[Any, Any]:
        """K/V (rows, kv heads, span(columns), head dim) of the first `rows` rows (capturable: fixed views); a view
        of `gather_heads_first`'s copy (heads and rows swapped, not contiguous)."""
        keys, values = self.gather_heads_first(layer, rows, columns)
        return keys.transpose(0, 1), values.transpose(0, 1)

    def gather_heads_first(self, layer: int, rows: int, columns: int) -> tuple[Any, Any]:
        """K/V (kv heads, rows, span(columns), head dim) of the first `rows` rows: one copy of their blocks, laid out
        for attention batched over (heads, rows)."""
        return self._gathered(layer, self.table[:rows, :blocks_for(columns, self.block_size)])

    def gather_rows(self, layer: int, rows: Any, end: int) -> tuple[Any, Any]:
        """K/V (batch, kv heads, end, head dim) of table rows `rows` (a long tensor), positions 0..end-1."""
        keys, values = self._gathered(layer, self.table[rows, :blocks_for(end, self.block_size)])
        return keys.transpose(0, 1)[:, :, :end], values.transpose(0, 1)[:, :, :end]

    def _gathered(self, layer: int, table: Any) -> tuple[Any, Any]:
        rows, blocks = table.shape
        out = []
        index = table.reshape(-1)
        for pool in (self.keys[layer], self.values[layer]):
            heads, dim = pool.shape[0], pool.shape[3]
            # one copy of whole blocks (index_select moves contiguous block_size x dim runs; pool[:, table], an
            # element-wise index, took 1.5-2x as long on this CPU)
            picked = pool.view(heads, pool.shape[1], self.block_size * dim).index_select(1, index)
            out.append(picked.view(heads, rows, blocks * self.block_size, dim))
        return out[0], out[1]

    def copy(self, source: int, target: int, tokens: int) -> None:
        """The K/V of slot `source`'s first `tokens` positions into slot `target`'s blocks (another choice of a
        request: its own blocks, reserved before)."""
        count = blocks_for(tokens, self.block_size)
        src, dst = self.table[source, :count], self.table[target, :count]
        for pool in (*self.keys, *self.values):
            pool[:, dst] = pool[:, src]

    @property
    def nbytes(self) -> int:
        """Device bytes the K/V pools hold."""
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))

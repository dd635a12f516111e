"""Paged KV bookkeeping: a pool of fixed-size blocks, each request's block table, and prefix caching by block hash.

Why: a slot reserves `max_cache_len` positions for every request, so the requests a device holds at once are
bounded by the longest request it might see (64 slots x 4,096 positions of a 1B Llama is 8 GiB of K/V, most of it
never written). Here a request holds ceil(tokens / block_size) blocks of the pool and gets another only when its
last block fills (vLLM's and Transformers' continuous batching's paged cache; nano-vllm's `block_manager.py`), so
the pool is bounded by the tokens requests actually hold. Full blocks of a prompt are also indexed by a hash of
their tokens and of every token before them (the hash chain): a later request whose prompt starts with the same
blocks (a system prompt) shares them (reference counts) and its prefill starts after them. A block whose last user
left keeps its hash until the pool needs it again (least recently freed first), so a prefix outlives its request.

Host bookkeeping only (no torch): which blocks a request holds and where its next token goes. The engine's KV-cache
manager (`kv_cache.KVCache`) owns one and mirrors its tables into a device block table; the scheduler asks it for
room (`needed`, `reserve`) before it prefills or steps a request and preempts (frees and later recomputes) the newest
request when the pool is full. The engine shares cached prefixes with `share` at a prompt's first chunk and indexes
blocks with `register` once their K/V are written (`allocate` indexes a prompt's blocks at once: bookkeeping only).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ...errors import FastDecodeError

#: Tokens per block: Transformers' continuous batching pages hold 256 on accelerators and vLLM's hold 16; 16 keeps
#: the waste of a request's last, partly filled block small (at most 15 positions) on every device.
DEFAULT_BLOCK_SIZE = 16


def block_hash(previous: int | None, tokens: Sequence[int]) -> int:
    """The prefix-cache key of one full block: its tokens and the hash of every block before it (the chain)."""
    return hash((previous, tuple(tokens)))


def blocks_for(tokens: int, block_size: int) -> int:
    """Blocks that hold `tokens` positions."""
    return -(-tokens // block_size)


@dataclass
class BlockTable:
    """One request's blocks in position order, how many positions it holds, and of them how many came from the
    prefix cache (its prefill starts there)."""

    blocks: list[int] = field(default_factory=list)
    tokens: int = 0
    cached_tokens: int = 0


class BlockManager:
    """`num_blocks` blocks of `block_size` positions shared by every request; `allocate`, `grow`, `free`."""

    def __init__(self, num_blocks: int, block_size: int = DEFAULT_BLOCK_SIZE, *, prefix_caching: bool = True) -> None:
        for name, value in (("num_blocks", num_blocks), ("block_size", block_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise FastDecodeError(f"{name}={value!r} must be a positive integer.")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.prefix_caching = prefix_caching
        self.ref_count = [0] * num_blocks
        self.hash_of: list[int | None] = [None] * num_blocks  # a full block's prefix hash (None: partial or none)
        self.by_hash: dict[int, int] = {}  # prefix hash -> block holding it
        self._free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))  # oldest first
        self.tables: dict[Any, BlockTable] = {}
        self.hits = 0  # prompt blocks found in the prefix cache (since construction)
        self.lookups = 0  # full prompt blocks looked up

    # ---- state -------------------------------------------------------------------------------------------------

    @property
    def free_blocks(self) -> int:
        """Blocks no request holds (cached prefixes among them: they are reused last)."""
        return len(self._free)

    @property
    def used_tokens(self) -> int:
        """Positions held by requests (a shared block counts once per request)."""
        return sum(table.tokens for table in self.tables.values())

    def table(self, request_id: Any) -> BlockTable:
        """`request_id`'s block table (FastDecodeError when it holds none)."""
        table = self.tables.get(request_id)
        if table is None:
            raise FastDecodeError(f"request_id={request_id!r} holds no KV blocks (never allocated, or freed).")
        return table

    def slot_of(self, request_id: Any, position: int) -> int:
        """The pool index (block * block_size + offset) of `request_id`'s `position`."""
        table = self.table(request_id)
        if not 0 <= position < len(table.blocks) * self.block_size:
            raise FastDecodeError(f"position {position} of request {request_id!r} is outside its "
                                  f"{len(table.blocks)} block(s) of {self.block_size}.")
        return table.blocks[position // self.block_size] * self.block_size + position % self.block_size

    # ---- admission -----------------------------------------------------------------------------------------------

    def _cached_prefix(self, tokens: Sequence[int]) -> list[int]:
        """The blocks already holding `tokens`' leading full blocks (the prefix cache), in order."""
        if not self.prefix_caching:
            return []
        found: list[int] = []
        previous = None
        # the last token is never taken from the cache: the prefill must compute its logits
        for start in range(0, len(tokens) - 1 - (len(tokens) - 1) % self.block_size, self.block_size):
            previous = block_hash(previous, tokens[start:start + self.block_size])
            block = self.by_hash.get(previous)
            if block is None:
                break
            found.append(block)
        return found

    def can_admit(self, tokens: Sequence[int], reserve: int = 0) -> bool:
        """Whether a request with prompt `tokens` fits now, with `reserve` more positions on top (the cached prefix
        counts as free where its blocks are idle in the cache)."""
        cached = self._cached_prefix(tokens)
        idle_cached = sum(1 for b in cached if self.ref_count[b] == 0)
        need = blocks_for(len(tokens) + reserve, self.block_size) - len(cached)
        return need <= self.free_blocks - idle_cached

    def allocate(self, request_id: Any, tokens: Sequence[int]) -> BlockTable:
        """Blocks for prompt `tokens` (prefix-cache hits shared); FastDecodeError when they do not fit (ask
        `can_admit` first) or the id already holds blocks."""
        if request_id in self.tables:
            raise FastDecodeError(f"request_id={request_id!r} already holds KV blocks; free it first.")
        if not self.can_admit(tokens):
            raise FastDecodeError(f"{blocks_for(len(tokens), self.block_size)} block(s) for a {len(tokens)}-token "
                                  f"prompt do not fit: {self.free_blocks} of {self.num_blocks} free.")
        cached = self._cached_prefix(tokens)
        self.lookups += (len(tokens) - 1) // self.block_size
        self.hits += len(cached)
        for block in cached:
            self._hold(block)
        table = BlockTable(list(cached), len(tokens), len(cached) * self.block_size)
        while len(table.blocks) < blocks_for(len(tokens), self.block_size):
            table.blocks.append(self._take())
        self.tables[request_id] = table
        self._index(table, tokens)
        return table

    def can_grow(self, request_id: Any, positions: int = 1) -> bool:
        """Whether `request_id` may hold `positions` more positions now."""
        table = self.table(request_id)
        return blocks_for(table.tokens + positions, self.block_size) - len(table.blocks) <= self.free_blocks

    def grow(self, request_id: Any, positions: int = 1) -> None:
        """Room for `positions` more positions of `request_id` (a new block when its last one is full)."""
        table = self.table(request_id)
        if not self.can_grow(request_id, positions):
            raise FastDecodeError(f"request {request_id!r} needs another KV block and none is free; preempt a "
                                  "request first (the scheduler does).")
        table.tokens += positions
        while len(table.blocks) < blocks_for(table.tokens, self.block_size):
            table.blocks.append(self._take())

    def needed(self, request_id: Any, tokens: int) -> int:
        """Blocks `request_id` lacks to hold its first `tokens` positions (0 when it holds them)."""
        table = self.tables.get(request_id)
        return max(0, blocks_for(tokens, self.block_size) - (len(table.blocks) if table else 0))

    def reserve(self, request_id: Any, tokens: int) -> list[int] | None:
        """Blocks for `request_id`'s first `tokens` positions (a table made on its first call): its blocks, or None
        (nothing taken) when too few are free."""
        need = self.needed(request_id, tokens)
        if need > self.free_blocks:
            return None
        table = self.tables.setdefault(request_id, BlockTable())
        table.tokens = max(table.tokens, tokens)
        table.blocks += [self._take() for _ in range(need)]
        return table.blocks

    def share(self, request_id: Any, tokens: Sequence[int]) -> int:
        """A new table for `request_id` holding the cached blocks of `tokens`' leading full blocks (the last token's
        never): the positions they cover, where its prefill starts."""
        cached = self._cached_prefix(tokens)
        self.lookups += (len(tokens) - 1) // self.block_size
        self.hits += len(cached)
        for block in cached:
            self._hold(block)
        covered = len(cached) * self.block_size
        self.tables[request_id] = BlockTable(list(cached), covered, covered)
        return covered

    def register(self, request_id: Any, tokens: Sequence[int], written: int) -> None:
        """Index by prefix hash the full blocks of `tokens` whose K/V `request_id` has written (its first `written`
        positions; the last token's block never), so later prompts starting with them share them."""
        table = self.tables.get(request_id)
        if not self.prefix_caching or table is None:
            return
        previous = None
        for index in range(min(written, len(tokens) - 1) // self.block_size):
            start = index * self.block_size
            previous = block_hash(previous, tokens[start:start + self.block_size])
            block = table.blocks[index]
            if self.hash_of[block] is None and previous not in self.by_hash:
                self.hash_of[block], self.by_hash[previous] = previous, block

    def free(self, request_id: Any) -> None:
        """Give back `request_id`'s blocks; full blocks keep their prefix hash until the pool reuses them."""
        table = self.tables.pop(request_id, None)
        if table is None:
            return
        for block in reversed(table.blocks):  # the prompt's first blocks are reused last
            self.ref_count[block] -= 1
            if self.ref_count[block] == 0:
                self._free[block] = None

    # ---- blocks --------------------------------------------------------------------------------------------------

    def _hold(self, block: int) -> None:
        if self.ref_count[block] == 0:
            self._free.pop(block, None)
        self.ref_count[block] += 1

    def _take(self) -> int:
        """The least recently freed block, its old prefix hash forgotten."""
        block, _ = self._free.popitem(last=False)
        old = self.hash_of[block]
        if old is not None and self.by_hash.get(old) == block:
            del self.by_hash[old]
        self.hash_of[block] = None
        self.ref_count[block] = 1
        return block

    def _index(self, table: BlockTable, tokens: Sequence[int]) -> None:
        """Record the prefix hash of each full prompt block (the last token's block never: see `_cached_prefix`)."""
        if not self.prefix_caching:
            return
        previous = None
        for index in range((len(tokens) - 1) // self.block_size):
            start = index * self.block_size
            previous = block_hash(previous, tokens[start:start + self.block_size])
            block = table.blocks[index]
            if self.hash_of[block] is None:
                self.hash_of[block] = previous
                self.by_hash.setdefault(previous, block)


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """Bytes of K and V one position costs across the model's layers."""
    return 2 * layers * kv_heads * head_dim * dtype_bytes


def requests_that_fit(budget_bytes: int, bytes_per_token: int, tokens: int, *, reserved_per_request: int | None = None,
                      block_size: int = DEFAULT_BLOCK_SIZE) -> int:
    """Concurrent requests of `tokens` positions each that `budget_bytes` of KV holds: in blocks of `block_size`, or
    with `reserved_per_request` positions each (slots of `max_cache_len`) when given."""
    per_request = reserved_per_request if reserved_per_request is not None else blocks_for(tokens, block_size) * block_size
    return budget_bytes // (per_request * bytes_per_token)

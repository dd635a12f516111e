"""The paged KV bookkeeping (hwrun.inference.engine.block_manager): blocks by the tokens in use, prefix caching by
hash chain, reference counts, reuse order, and the memory arithmetic the docs report."""

from __future__ import annotations

import pytest
from hwrun.errors import FastDecodeError
from hwrun.inference.engine.block_manager import (
    BlockManager,
    blocks_for,
    kv_bytes_per_token,
    requests_that_fit,
)


def test_a_request_holds_blocks_for_its_tokens_and_grows_one_block_at_a_time():
    manager = BlockManager(8, 4)
    table = manager.allocate("a", list(range(6)))  # 6 tokens: 2 blocks of 4
    assert len(table.blocks) == 2 and table.tokens == 6 and manager.free_blocks == 6
    manager.grow("a", 2)  # positions 6, 7: still block 2
    assert len(table.blocks) == 2
    manager.grow("a")  # position 8: a third block
    assert len(table.blocks) == 3 and manager.free_blocks == 5
    assert manager.slot_of("a", 8) == table.blocks[2] * 4
    assert manager.slot_of("a", 5) == table.blocks[1] * 4 + 1
    with pytest.raises(FastDecodeError, match="outside its 3 block"):
        manager.slot_of("a", 12)
    manager.free("a")
    assert manager.free_blocks == 8 and manager.used_tokens == 0


def test_admission_is_bounded_by_free_blocks_not_by_a_maximum_length():
    manager = BlockManager(4, 4)
    manager.allocate("a", [1] * 8)  # two blocks
    assert manager.can_admit([2] * 8) and not manager.can_admit([2] * 9)
    manager.allocate("b", [2] * 8)
    assert not manager.can_grow("a")
    with pytest.raises(FastDecodeError, match="needs another KV block and none is free"):
        manager.grow("a")
    with pytest.raises(FastDecodeError, match="do not fit: 0 of 4 free"):
        manager.allocate("c", [3])
    with pytest.raises(FastDecodeError, match="already holds KV blocks"):
        manager.allocate("a", [1])


def test_a_shared_prompt_prefix_is_computed_once_and_outlives_its_request():
    system = list(range(100, 112))  # three full blocks of 4
    manager = BlockManager(16, 4)
    first = manager.allocate("a", [*system, 1, 2])
    assert first.cached_tokens == 0
    second = manager.allocate("b", [*system, 7, 8, 9])
    assert second.cached_tokens == 12 and second.blocks[:3] == first.blocks[:3]
    assert [manager.ref_count[b] for b in first.blocks[:3]] == [2, 2, 2]
    manager.free("a")
    manager.free("b")
    third = manager.allocate("c", [*system, 5])  # the prefix stayed in the pool after both left
    assert third.cached_tokens == 12 and manager.hits == 6


def test_the_last_prompt_token_is_never_taken_from_the_cache():
    manager = BlockManager(8, 4)
    manager.allocate("a", [1, 2, 3, 4, 5])
    again = manager.allocate("b", [1, 2, 3, 4])  # a whole-block prompt: its logits must be computed
    assert again.cached_tokens == 0


def test_a_prefix_differs_when_any_earlier_block_differs():
    manager = BlockManager(16, 4)
    manager.allocate("a", [1, 1, 1, 1, 2, 2, 2, 2, 9])
    other = manager.allocate("b", [0, 1, 1, 1, 2, 2, 2, 2, 9])  # same second block, different first
    assert other.cached_tokens == 0


def test_reused_blocks_forget_their_prefix_and_cached_blocks_are_reused_last():
    manager = BlockManager(3, 2)
    manager.allocate("a", [1, 2, 3])  # blocks 0 (hashed: [1, 2]) and 1
    manager.free("a")
    assert manager.can_admit([1, 2, 9, 9, 9])  # the cached block counts: 1 shared + 2 new of 3
    manager.allocate("b", [7, 7, 7, 7, 7])  # 3 blocks: every block, the cached one last
    assert manager.free_blocks == 0
    manager.free("b")
    assert manager.allocate("c", [1, 2, 3]).cached_tokens == 0  # block 0 was reused: its prefix is gone


def test_bad_sizes_are_refused():
    with pytest.raises(FastDecodeError, match="block_size=0 must be a positive integer"):
        BlockManager(4, 0)
    with pytest.raises(FastDecodeError, match="num_blocks=True must be a positive integer"):
        BlockManager(True)
    with pytest.raises(FastDecodeError, match="holds no KV blocks"):
        BlockManager(2).table("x")


def test_memory_arithmetic_slots_against_blocks():
    # the 1.24B Llama of the benchmarks: 16 layers, 8 KV heads of 64, bf16
    per_token = kv_bytes_per_token(16, 8, 64, 2)
    assert per_token == 32768
    budget = 8 * 2**30
    slots = requests_that_fit(budget, per_token, 2000, reserved_per_request=4096)
    blocks = requests_that_fit(budget, per_token, 2000)
    assert (slots, blocks) == (64, 131) and blocks_for(2000, 16) == 125

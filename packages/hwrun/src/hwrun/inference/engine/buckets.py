"""The shapes a decode step runs over: its row buckets (how many slots a step covers, one graph or compile each) and
its cache-length buckets (how many positions its attention reads). The scheduler picks the smallest of each that
holds the running requests."""

from __future__ import annotations

from collections.abc import Sequence

from ...errors import FastDecodeError


def bucket_sizes(slots: int, buckets: Sequence[int] | None = None) -> tuple[int, ...]:
    """The row counts a decode step runs over, ascending: `buckets` (each in 1..slots) or the powers of two
    below `slots`; `slots` itself is always one (every slot busy)."""
    if buckets is None:
        sizes = {1 << i for i in range(slots.bit_length()) if 1 << i < slots}
    else:
        sizes = set()
        for size in buckets:
            if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= slots:
                raise FastDecodeError(f"buckets={list(buckets)!r} holds {size!r}: each bucket is a row count "
                                      f"from 1 to slots={slots} (or leave buckets=None: 1, 2, 4, ... and slots).")
            sizes.add(size)
    return tuple(sorted(sizes | {slots}))


def compiled_buckets(slots: int, compiled: bool) -> tuple[int, ...] | None:
    """Row buckets for an engine whose step is compiled: each bucket is one compile (greedy and sampled), so
    only 1, 8 and `slots` (one stream, light load, full load); None (the default powers of two) when not
    compiled. `generate()` and the server use it."""
    if not compiled:
        return None
    return tuple(sorted({1, min(8, slots), slots}))


def length_buckets(max_cache_len: int, smallest: int = 128) -> tuple[int, ...]:
    """Cache lengths for `EngineCore(cache_buckets=...)`: the powers of two from `smallest` below `max_cache_len`,
    and `max_cache_len`."""
    sizes = []
    size = smallest
    while size < max_cache_len:
        sizes.append(size)
        size *= 2
    return (*sizes, max_cache_len)


def cache_bucket_sizes(max_cache_len: int, cache_buckets: Sequence[int] | None) -> tuple[int, ...]:
    """The cache lengths a decode step may attend over, ascending: `cache_buckets` and `max_cache_len` (None: only
    `max_cache_len`, every position)."""
    if cache_buckets is None:
        return (max_cache_len,)
    sizes = set()
    for size in cache_buckets:
        if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= max_cache_len:
            raise FastDecodeError(f"cache_buckets={list(cache_buckets)!r} holds {size!r}: each is a cache length "
                                  f"from 1 to max_cache_len={max_cache_len} (length_buckets(max_cache_len) "
                                  "gives powers of two; None attends over every position).")
        sizes.add(size)
    return tuple(sorted(sizes | {max_cache_len}))

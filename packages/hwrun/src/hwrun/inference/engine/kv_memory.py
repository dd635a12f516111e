"""How much memory the engine's KV blocks get (`kv_cache_memory`), sized once the model is loaded, and what that holds.

`kv_cache_memory` is bytes (an int, or text such as "4GiB", "512MB") or a fraction of the device's free memory
after the model loaded (a float in (0, 1], as vLLM's `gpu_memory_utilization` is of the whole device). Left out,
the engine decides per device (`kv_budget`):

- on an accelerator, 0.8 of the memory free once the weights are loaded, capped at what every slot at
  `max_cache_len` could ever hold (so a small engine takes no more than it can use). The other 0.2 is for what is
  allocated after the cache: a prefill chunk's activations (512 tokens by default), the sampler's per-row buffers and
  the captured graphs' memory pools. vLLM's 0.9 is of the whole device with its own activation profiling; hwrun does
  not profile, so it leaves more.
- on a CPU (or a device whose free memory cannot be read), a fixed 2 GiB, capped the same way: host memory is
  shared with everything else the machine runs, and a CPU decodes few requests at once anyway.

Under tensor parallelism every rank takes the fewest blocks any rank's budget holds (`agree_across_ranks`).
`KVReport` says what the budget holds (blocks, tokens, bytes per token, max-length requests at once) at start-up
and in hwrun serve's /metrics.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ...errors import FastDecodeError

#: Fraction of the free memory after load the KV blocks get on an accelerator by default.
ACCELERATOR_KV_FRACTION = 0.8
#: Bytes the KV blocks get by default on a CPU, or where free memory cannot be read.
FIXED_KV_BYTES = 2 * 2**30
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")


def parse_kv_memory(value: Any, option: str = "kv_cache_memory") -> int | float | None:
    """`value` as bytes (int) or a fraction of free memory (float in (0, 1]); None stays None (decided per device).
    Text takes "4GiB", "512MiB", "1.5GB", "2000000000" or "0.8". FastDecodeError naming the value otherwise."""
    if value is None:
        return None
    fix = (f"{option} {value!r}: give bytes (e.g. 4GiB, 512MiB, 8000000000) or a fraction of the free device memory "
           "after the model loaded, above 0 and at most 1 (e.g. 0.8)")
    if isinstance(value, bool):
        raise FastDecodeError(fix + ".")
    if isinstance(value, str):
        match = _SIZE.match(value)
        if match is None or match.group(2).lower() not in _UNITS:
            raise FastDecodeError(fix + ".")
        number, unit = match.group(1), match.group(2).lower()
        if not unit and "." in number:
            value = float(number)
        else:
            value = float(number) * _UNITS[unit]
            if value != int(value):
                raise FastDecodeError(fix + " (a whole number of bytes).")
            value = int(value)
    if isinstance(value, float):
        if not 0 < value <= 1:
            raise FastDecodeError(fix + " (a float is a fraction).")
        return value
    if not isinstance(value, int) or value <= 0:
        raise FastDecodeError(fix + ".")
    return value


def free_memory(device: Any) -> int | None:
    """Bytes free on `device` now (its torch module's `mem_get_info`), or None where that cannot be read."""
    import torch

    module = getattr(torch, getattr(device, "type", "cpu"), None)
    query = getattr(module, "mem_get_info", None)
    if query is None:
        return None
    try:
        return int(query(device)[0])
    except (RuntimeError, AssertionError, TypeError):
        return None


def kv_budget(given: int | float | None, device: Any, accelerator: bool, full: int) -> tuple[int, str]:
    """(bytes for KV blocks, why) for `given` (`parse_kv_memory`'s) on `device`; `full` is what every slot at
    `max_cache_len` would hold (the default's cap)."""
    if isinstance(given, int):
        return given, f"kv_cache_memory={given} bytes given"
    free = free_memory(device) if accelerator else None
    if isinstance(given, float):
        if free is None:
            raise FastDecodeError(f"kv_cache_memory={given} is a fraction of the free device memory, which cannot be "
                                  f"read on {device}; give bytes instead (e.g. 4GiB).")
        return int(free * given), f"kv_cache_memory={given} of the {free / 2**30:.1f} GiB free after load"
    if free is not None:
        budget = int(free * ACCELERATOR_KV_FRACTION)
        why = (f"{ACCELERATOR_KV_FRACTION} of the {free / 2**30:.1f} GiB free after load (the rest for prefill "
               "activations, sampler buffers and graph pools)")
    else:
        budget = FIXED_KV_BYTES
        why = (f"a fixed {FIXED_KV_BYTES / 2**30:.0f} GiB on {device} (host memory is shared; free memory is not "
               "read)" if not accelerator else f"a fixed {FIXED_KV_BYTES / 2**30:.0f} GiB: {device}'s free memory "
               "cannot be read")
    if full < budget:
        return full, why + f", capped at {full / 2**20:.0f} MiB: every slot at max_cache_len (more is never used)"
    return budget, why


def blocks_in(budget: int, bytes_per_token: int, block_size: int, why: str) -> int:
    """Blocks of `block_size` positions that `budget` bytes hold (FastDecodeError when not one)."""
    blocks = budget // (bytes_per_token * block_size)
    if blocks < 1:
        raise FastDecodeError(f"{budget} bytes of KV memory ({why}) hold no block of {block_size} positions "
                              f"({bytes_per_token * block_size} bytes); give more (kv_cache_memory).")
    return blocks


def agree_across_ranks(blocks: int, why: str, model: Any) -> tuple[int, str]:
    """(blocks, why) agreed by every rank of a tensor-parallel model (`model.tp_size` > 1, one process per device: the
    default process group): the fewest any rank's free memory allows. Each rank sizes its pool from its own free
    memory, and ranks whose pools differed would preempt differently and their collectives would stop pairing up.
    Every rank builds its engine at the same point (generate: the same call; serve: the followers repeat rank 0), so
    this one all-reduce pairs up too. Unchanged outside tensor parallelism."""
    tp = getattr(model, "tp_size", None) or 1
    if tp <= 1:
        return blocks, why
    import torch
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() != tp:
        return blocks, why
    count = torch.tensor([blocks], dtype=torch.long, device=model.device)
    dist.all_reduce(count, op=dist.ReduceOp.MIN)
    agreed = int(count.item())
    return agreed, why + (f"; {tp} tensor-parallel ranks agreed on the fewest blocks any of them holds ({agreed}, "
                          f"this rank's {blocks})" if agreed != blocks else f"; the same on all {tp} tensor-parallel "
                          "ranks")


@dataclass(frozen=True)
class KVReport:
    """What the KV blocks hold: `blocks` of `block_size` positions, `bytes_per_token` each, and why this much."""

    blocks: int
    block_size: int
    bytes_per_token: int
    max_cache_len: int
    reason: str

    @property
    def tokens(self) -> int:
        """Positions the pool holds."""
        return self.blocks * self.block_size

    @property
    def bytes(self) -> int:
        """Device bytes of the pool (the scratch block not counted)."""
        return self.tokens * self.bytes_per_token

    @property
    def max_length_requests(self) -> int:
        """Requests of `max_cache_len` positions the pool holds at once."""
        return self.tokens // self.max_cache_len

    def line(self) -> str:
        """One start-up line."""
        return (f"KV cache: {self.blocks} blocks of {self.block_size} tokens = {self.tokens} tokens, "
                f"{self.bytes / 2**30:.2f} GiB ({self.bytes_per_token} bytes a token); {self.max_length_requests} "
                f"requests of {self.max_cache_len} tokens at once ({self.reason})")

    def as_dict(self) -> dict[str, Any]:
        """Its numbers and reason (hwrun serve's Ready info and /metrics)."""
        return {"blocks": self.blocks, "block_size": self.block_size, "tokens": self.tokens, "bytes": self.bytes,
                "bytes_per_token": self.bytes_per_token, "max_length_requests": self.max_length_requests,
                "max_cache_len": self.max_cache_len, "reason": self.reason}


@dataclass(frozen=True)
class KVStats:
    """How the KV blocks are used now (hwrun serve's /metrics, sent with every engine batch): `used_blocks` of
    `blocks` held by requests, prompt tokens looked up in the prefix cache (`queried_tokens`: full blocks only, the
    part a cache can hold) and found there (`hit_tokens`), `preemptions` since start, and admitted requests whose
    prefill waits for free blocks (`waiting_for_blocks`). vLLM's `kv_cache_usage_perc`, `prefix_cache_queries`,
    `prefix_cache_hits`, `num_preemptions`."""

    blocks: int
    used_blocks: int
    queried_tokens: int
    hit_tokens: int
    preemptions: int
    waiting_for_blocks: int

    @property
    def usage(self) -> float:
        """The fraction of the pool's blocks requests hold (0 to 1)."""
        return self.used_blocks / self.blocks if self.blocks else 0.0

    def as_list(self) -> list[int]:
        """Its numbers in field order (the IPC's compact form; `KVStats(*values)` reads it back)."""
        return [self.blocks, self.used_blocks, self.queried_tokens, self.hit_tokens, self.preemptions,
                self.waiting_for_blocks]

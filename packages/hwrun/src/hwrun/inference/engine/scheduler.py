"""The scheduler: which request runs where and when. It admits requests into free slots, plans each step's
prefill under a token budget (a long prompt in chunks), picks the rows and cache positions a decode step runs over,
keeps the active requests packed in the lowest slots (one packing rule for `step()` and `generate()`), and finishes
requests (EOS or length) and cancels them. Host bookkeeping only, no torch: it tells the runner what to do.

Chunked prefill: a step prefills at most `prefill_chunk` prompt tokens, in admission order, so a long prompt
arriving while others decode costs each running stream one chunk's time per step instead of its whole prefill
(`prefill_budget.prefill_chunk_for` picks the budget per device and model size). Whole prompts that fit are prefilled together, right- or
left-padded into groups of at most `prefill_tokens` padded tokens; the rest of a prompt that did not fit continues
next step at the position where it stopped. The choices of a request with several (`n`) hold a slot each; the
first prefills the prompt and the others copy its K/V at the end of that prefill (`Chunk.copies`), so a prompt is
prefilled once whatever its `n`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ...errors import FastDecodeError
from .block_manager import blocks_for
from .buckets import bucket_sizes, cache_bucket_sizes, compiled_buckets, length_buckets
from .kv_cache import KVCache
from .requests import Request

__all__ = ["Chunk", "Move", "Scheduler", "bucket_sizes", "cache_bucket_sizes", "compiled_buckets", "length_buckets"]

#: Most padded prompt tokens one prefill forward takes (prompts prefilled together are padded to the longest).
PREFILL_TOKENS = 8192
@dataclass(frozen=True)
class Chunk:
    """Prompt tokens `start..end` of the request in `slot`, to prefill; `last` when they end its prompt."""

    slot: int
    tokens: list[int]
    start: int
    last: bool
    copies: tuple[int, ...] = ()  # slots of the request's other choices: they get this row's K/V when it ends
    resume: int = 0  # a preempted request's recompute: its produced tokens (it keeps them; no new token is chosen)


@dataclass(frozen=True)
class Move:
    """Row `source`'s state into row `target` (its first `columns` K/V positions)."""

    source: int
    target: int
    columns: int


class Scheduler:
    """Admission, prefill planning, decode shapes, packing and finishing for the requests in `kv`'s slots."""

    def __init__(self, kv: KVCache, *, buckets: tuple[int, ...], cache_buckets: tuple[int, ...],
                 prefill_tokens: int, prefill_chunk: int) -> None:
        self.kv = kv
        self.buckets = buckets
        self.cache_buckets = cache_buckets
        self.prefill_tokens = max(1, prefill_tokens)
        self.prefill_chunk = prefill_chunk
        self.requests: dict[Any, Request] = {}  # the admitted requests, in admission order
        self.preempted: list[Request] = []  # preempted since the engine last took them (`take_preempted`)
        self.preemptions = 0  # since construction
        self.waiting_for_blocks = 0  # admitted requests whose prefill the last plan left waiting for free blocks

    def check(self, prompt: list[int], budget: Any, where: str) -> None:
        """Refuse (FastDecodeError) a prompt and budget that no slot can hold."""
        if not prompt:
            raise FastDecodeError(f"{where} is empty: every prompt needs at least one token.")
        if isinstance(budget, bool) or not isinstance(budget, int) or budget <= 0:
            raise FastDecodeError(f"max_new_tokens={budget!r} ({where}) must be a positive integer.")
        if len(prompt) + budget > self.kv.max_cache_len:
            raise FastDecodeError(
                f"{where}: length {len(prompt)} + max_new_tokens {budget} exceeds "
                f"max_cache_len={self.kv.max_cache_len}; build the engine with a larger max_cache_len.")
        self.kv.check_fits(len(prompt) + budget, 1, where)

    def admit(self, request: Request) -> bool:
        """Give `request` the lowest free slot (False when none is free); its prefill is planned from the next step."""
        slot = self.kv.take(request.key)
        if slot is None:
            return False
        request.slot = slot
        self.requests[request.key] = request
        return True

    def prefill_plan(self, steps: int = 1, budget: int | None = None) -> list[list[Chunk]]:
        """This step's KV blocks and prefill forwards. First every decoding request gets blocks for its next `steps`
        writes (`reserve`); then up to `budget` (default `prefill_chunk`) prompt tokens of the admitted requests are planned in
        admission order, each chunk with its blocks (a last chunk also its first decode write's and its other
        choices' blocks). A chunk whose blocks are not free takes them from the newest requests after it
        (preempted); when even that is not enough, it and every request after it wait. Prompts that start here
        share padded forwards of <= `prefill_tokens` tokens; so do prompts that continue (their earlier part already in
        their blocks: a cached prefix, an earlier chunk), in forwards of their own."""
        self.reserve(steps)
        budget = self.prefill_chunk if budget is None else budget
        forwards: list[list[Chunk]] = []
        groups: list[list[Chunk]] = [[], []]  # the forward being filled: of prompts from 0, of continued prompts
        width = [0, 0]  # the longest chunk in each
        self.waiting_for_blocks, starved = 0, False  # starved: an earlier request lacks blocks, so this one waits
        for request in list(self.requests.values()):
            if request.decoding or request.waits:
                continue
            if starved or request in self.preempted:  # first come, first served: a request preempted now waits
                starved, self.waiting_for_blocks = True, self.waiting_for_blocks + 1
                continue
            if budget <= 0:
                break
            source = request.source
            if not request.prefilled and not self.kv.holds(request.slot):  # its first chunk: a cached prefix?
                request.prefilled = self.kv.share(request.slot, source)
            end = min(len(source), request.prefilled + budget)
            last = end == len(source)
            followers = request.followers if last else []
            extra = len(followers) * blocks_for(request.length + steps, self.kv.block_size)
            if not self._room(request, end + (steps if last else 0), extra):
                starved, self.waiting_for_blocks = True, self.waiting_for_blocks + 1  # nobody after it starts first
                continue
            for follower in followers:
                self.kv.reserve(follower.slot, request.length + steps)
            chunk = Chunk(request.slot, source[request.prefilled:end], request.prefilled, last,
                          tuple(f.slot for f in followers), request.produced if request.recompute is not None else 0)
            budget -= end - request.prefilled
            # prompts starting at 0 share padded forwards, and so do continued ones (each at its own positions:
            # after a cached prefix, or a long prompt's next chunk), each kind apart
            kind = bool(chunk.start)
            wider = max(width[kind], len(chunk.tokens))
            if groups[kind] and wider * (len(groups[kind]) + 1) > self.prefill_tokens:
                forwards.append(groups[kind])
                groups[kind], wider = [], len(chunk.tokens)
            groups[kind].append(chunk)
            width[kind] = wider
        return forwards + [group for group in (groups[1], groups[0]) if group]  # continued prompts first, as they came

    def reserve(self, steps: int) -> None:
        """Blocks for the next `steps` writes of every decoding request, in admission order; one that cannot get
        them, even from the newest requests after it, is preempted itself."""
        for request in self.decoding():
            if request in self.preempted:
                continue
            if not self._room(request, request.written + steps):
                self._preempt(request)

    def _room(self, request: Request, tokens: int, extra: int = 0) -> bool:
        """Blocks for `request`'s first `tokens` positions (and `extra` more free ones for its other choices),
        preempting the newest requests admitted after it that hold blocks while too few are free."""
        while self.kv.needed(request.slot, tokens) + extra > self.kv.free_blocks:
            order = list(self.requests.values())
            later = order[order.index(request) + 1:]
            victim = next((r for r in reversed(later) if self.kv.holds(r.slot)), None)
            if victim is None:
                return False
            self._preempt(victim)
        return self.kv.reserve(request.slot, tokens)

    def _preempt(self, request: Request) -> None:
        """Free `request`'s blocks (vLLM V1's preemption by recompute): it keeps its slot and its produced tokens,
        and its prompt (with them) is prefilled again when blocks are free."""
        if request.decoding:
            request.recompute = []  # the engine fills it: prompt + produced tokens but the newest (`take_preempted`)
        request.prefilled = 0
        self.kv.drop(request.slot)
        self.preempted.append(request)
        self.preemptions += 1

    def take_preempted(self) -> list[Request]:
        """The requests preempted since the last call (the engine saves their rows)."""
        taken, self.preempted = self.preempted, []
        return taken

    def prefilled(self, forward: list[Chunk]) -> None:
        """Record a prefill forward the runner ran: a request whose prompt it ended has its first token."""
        for chunk in forward:
            request = self.requests[self.kv.owner[chunk.slot]]
            request.prefilled = chunk.start + len(chunk.tokens)
            self.kv.register(chunk.slot, request.source, request.prefilled)  # its written blocks: a prefix to share
            if chunk.last and request.recompute is not None:  # a preempted request back where it was
                request.prefilled, request.recompute, request.saved = request.length, None, None
            elif chunk.last:
                request.produced = 1
                for follower in request.followers:  # their rows got this prefill's K/V and a first token each
                    follower.prefilled, follower.produced, follower.leader = request.length, 1, None
                request.followers = []

    @property
    def pending(self) -> bool:
        """Whether an admitted request has prompt tokens left to prefill."""
        return any(not r.decoding for r in self.requests.values())

    def decoding(self) -> list[Request]:
        """The requests that step now (prefilled), in admission order."""
        return [r for r in self.requests.values() if r.decoding]

    def shape(self, decoding: list[Request], steps: int = 1) -> tuple[int, int]:
        """(rows, columns) of the next `steps` decode steps: the smallest row bucket holding every admitted request
        (packed in the lowest slots), and the smallest cache bucket past the furthest position they write."""
        rows = next(size for size in self.buckets if size >= max(len(self.requests), *(r.slot + 1 for r in decoding)))
        # a row writes its newest token's K/V at position `written` and attends over 0 .. that position
        furthest = max(r.written for r in decoding) + steps
        columns = next(size for size in self.cache_buckets if size >= min(furthest, self.kv.max_cache_len))
        return rows, columns

    def finish(self, request: Request, tokens: Sequence[int]) -> tuple[int, str | None]:
        """Read `tokens` (its next unread ones, in order) for `request`: (how many it keeps, finish reason). It stops
        after its first EOS id ("stop", included) or its `budget`-th token ("length"), and then leaves its slot."""
        for kept, token in enumerate(tokens, 1):
            request.read += 1
            ended = token in request.eos or (request.stop_after is not None and request.read >= request.stop_after)
            reason = "stop" if ended else "length" if request.read >= request.budget else None
            if reason is not None:
                self.leave(request)
                return kept, reason
        return len(tokens), None

    def leave(self, request: Request) -> None:
        """Drop `request` and free its slot (a choice waiting for its prefill takes it over)."""
        del self.requests[request.key]
        self.kv.release(request.slot)
        if request.leader is not None:
            request.leader.followers.remove(request)
        elif request.followers:
            heir, *rest = request.followers
            heir.leader, heir.followers = None, rest
            for follower in rest:
                follower.leader = heir

    def cancel(self, request_id: Any, index: int | None = None) -> None:
        """Drop an admitted request (every choice, or choice `index`); FastDecodeError for an unknown one."""
        chosen = [r for r in self.requests.values() if r.request_id == request_id and index in (None, r.index)]
        if not chosen:
            which = "" if index is None else f" choice {index}"
            raise FastDecodeError(f"request_id={request_id!r}{which} is not active (finished, cancelled or never "
                                  "added).")
        for request in chosen:
            self.leave(request)

    def pack(self) -> list[Move]:
        """Move the highest held rows into the free slots below them, so the admitted requests hold the lowest slots
        and the next step runs over as few rows as they need; the moves for the runner, in order."""
        moves = []
        while True:
            busy = self.kv.busy()
            holes = [s for s in range(len(busy)) if self.kv.owner[s] is None]
            if not holes:
                return moves
            source, target = busy[-1], holes[0]
            request = self.requests[self.kv.owner[source]]
            moves.append(Move(source, target, min(request.written, self.kv.max_cache_len)))
            request.slot = target
            self.kv.follow(source, target)

"""Whole batches through the engine (`EngineCore.generate`): every prompt admitted into free slots as others leave,
prefill plans run back to back (no live streams to keep flowing), then up to `check_every` decode steps between
two reads of the host, retiring finished requests and packing the rest. KV blocks are reserved for a whole chunk of
steps before it runs (the newest requests preempted when they run out, recomputed later)."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

from ...errors import FastDecodeError
from ..decode.sampling import SamplingParams
from .requests import GREEDY, Request, eos_ids


def generate(self: Any, prompts: Sequence[Sequence[int]], max_new_tokens: int | Sequence[int], *,
             eos_token_id: Any = "model", sampling: SamplingParams | None = None) -> list[list[int]]:
    """`EngineCore.generate` of `self`: new tokens for each prompt (token-id lists), in prompt order."""
    if self.scheduler.requests:
        raise FastDecodeError(f"generate() needs every slot, but {len(self.scheduler.requests)} request(s) added "
                              "with add() are active; step() them to the end or cancel() them first.")
    prompts = [list(p) for p in prompts]
    if not prompts:
        raise FastDecodeError("prompts=[] is empty: pass at least one prompt of token ids.")
    budgets = [max_new_tokens] * len(prompts) if isinstance(max_new_tokens, int) else list(max_new_tokens)
    if len(budgets) != len(prompts):
        raise FastDecodeError(f"{len(budgets)} max_new_tokens for {len(prompts)} prompts: give one number "
                              "or one per prompt.")
    for index, (prompt, budget) in enumerate(zip(prompts, budgets, strict=True)):
        if not prompt:
            raise FastDecodeError(f"prompts[{index}] is empty: every prompt needs at least one token.")
        self.scheduler.check(prompt, budget, f"prompt {index}")
    sampling = GREEDY if sampling is None else sampling
    if sampling.logprobs is not None:
        raise FastDecodeError(f"logprobs={sampling.logprobs}: generate() returns token ids only; use add(), step().")
    self.runner.choice.check(sampling)
    eos = frozenset(eos_ids(self.model, eos_token_id))
    waiting = deque(Request(i, p, b, eos, sampling) for i, (p, b) in enumerate(zip(prompts, budgets, strict=True)))
    results: list[list[int]] = [[] for _ in prompts]
    self.steps = self.prefills = 0
    self.runner.fill_sampling(sampling)
    while waiting or self.scheduler.requests:
        admitted = []
        while waiting and self.scheduler.admit(waiting[0]):
            admitted.append(waiting.popleft())
        if admitted and (sampling.processed or (sampling.seed is None and not sampling.greedy and self.prefills)):
            # a freed row keeps the seed of the request it held (or of one moved into it): unseeded prompts
            # admitted later draw their own, or equal prompts would repeat their samples; penalised ones
            # start their counts from their own prompt
            for request in admitted:
                self.runner.set_sampling(request.slot, sampling, request.prompt)
        while self.scheduler.pending:  # no live streams to keep flowing: one prefill plan after another, each as
            # large as a padded forward may be (`prefill_tokens`), not the serving chunk (`prefill_chunk`): on an H100
            # a prefill forward cost ~8-10 ms at any size up to 1,024 tokens, so 64 prompts of 128 tokens in 512-token
            # chunks were 16 forwards where one does
            forwards = self.scheduler.prefill_plan(budget=self.prefill_tokens)
            self._preempted()
            if not forwards:
                break  # the rest waits for blocks the running requests free
            self._prefill(forwards)
        decode_chunk(self, results)
    return results


def decode_chunk(self: Any, results: list[list[int]]) -> None:
    """Up to `check_every` decode steps (fewer when a budget ends sooner), then one read of every row: the
    requests that stopped or reached their budget leave, and the rest are packed down."""
    decoding = self.scheduler.decoding()
    if not decoding:
        raise FastDecodeError("no request can run: each needs KV blocks the others hold (a bug: the oldest should "
                              "always get them by preempting newer ones).")
    chunk = min(self.check_every, *(r.budget - r.produced for r in decoding))
    self.scheduler.reserve(chunk)
    self._preempted()
    decoding = self.scheduler.decoding()
    if not decoding:
        return
    rows, columns = self.scheduler.shape(decoding, chunk)
    self.runner.run(self.runner.kind(r.slot for r in decoding), rows, columns, chunk)
    self.steps += chunk
    self.last_rows, self.last_columns = rows, columns
    produced = self.runner.produced(rows)  # one transfer per chunk: the host's only sync
    for request in decoding:
        request.produced += chunk
        _, reason = self.scheduler.finish(request, produced[request.slot, request.read:request.produced].tolist())
        if reason is not None:
            results[request.request_id] = produced[request.slot, :request.read].tolist()
    self._move(self.scheduler.pack())

"""Continuous batching over a fixed set of cache slots, with the decode step captured as one device graph.

Why: Transformers' continuous batching (`generate_batch`) with sdpa attends every query over the
padded keys of all requests in the batch and plans each step on the host; on an H200 at 64
prompts it reached 2,617 tokens/s against 20,386 for a static CUDA-graph batch
(docs/benchmarks/decode.md). Here each request owns one slot (one row of a static K/V cache,
hwrun.inference.decode.fused_step with per-row positions). Every decode step runs all slots at once with fixed
shapes, so it is captured once and replayed; a row attends only to its own keys. The host wakes
every `check_every` steps (or sooner, when a request's budget ends), reads the new tokens,
retires finished requests (EOS or `max_new_tokens`) and prefills waiting prompts into the freed
slots: a new request starts while others are mid-way, which is what continuous batching means.
Idle slots step too (their rows are ignored); that costs nothing extra, as a step reads the weights
once for all rows. Greedy only. The graph is a CUDA graph on NVIDIA/ROCm and an XPU graph on Intel
GPUs (the platform's `graph_tools`); elsewhere the same loop runs eagerly, which is how CPU tests
prove that its tokens equal `model.generate`'s for each prompt.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence
from typing import Any

from ...errors import FastDecodeError
from .static import (
    capture_graph,
    check_decoder_args,
    compile_step,
    decoder_graph_tools,
    eos_ids,
    model_platform,
)

logger = logging.getLogger(__name__)

#: Most prompt tokens one prefill call takes (prompts admitted together are right-padded to the longest).
PREFILL_TOKENS = 8192


class SlotDecoder:
    """Greedy continuous batching of any number of prompts through `slots` cache rows of
    `max_cache_len` positions each (a prompt plus its new tokens must fit one row). `use_graphs=None`
    captures where the model's platform (`platform`, default: the one of `model.device`) has graph tools."""

    def __init__(self, model: Any, *, slots: int, max_cache_len: int, use_graphs: bool | None = None,
                 compile_backend: Any = None, compile_mode: str | None = None, tune: bool = False,
                 check_every: int = 16, prefill_tokens: int = PREFILL_TOKENS, platform: Any = None) -> None:
        import torch

        from .fused_step import FusedLlamaStep, fused_step_support

        self.platform = model_platform(model, platform)
        self.graph_tools = decoder_graph_tools(self.platform) if use_graphs is not False else None
        check_decoder_args(model, slots, max_cache_len, use_graphs, self.graph_tools, self.platform)
        unsupported = fused_step_support(model)
        if unsupported is not None:
            raise FastDecodeError(f"continuous graph decoding runs the fused step, which cannot run "
                                  f"{type(model).__name__}: {unsupported}. Use decode='generate' "
                                  "(Transformers' generate_batch).")
        self.model = model
        self.device = model.device
        self.slots = slots
        self.max_cache_len = max_cache_len
        self.check_every = max(1, check_every)
        self.prefill_tokens = max(1, prefill_tokens)
        self.use_graphs = self.graph_tools is not None if use_graphs is None else use_graphs
        self.fused = FusedLlamaStep(model, batch_size=slots, max_cache_len=max_cache_len, per_row_positions=True)
        long = dict(dtype=torch.long, device=self.device)
        self.token = torch.zeros((slots, 1), **long)  # each slot's newest token ...
        self.position = torch.zeros((slots, 1), **long)  # ... and its position
        self.count = torch.zeros((slots, 1), **long)  # tokens each slot's request has produced
        self.out = torch.zeros((slots, max_cache_len), **long)  # those tokens
        self._step_fn = compile_step(self._step, compile_backend, compile_mode, tune)
        self.graph = None
        self.capture_seconds: float | None = None
        self.steps = 0  # decode steps run by the last generate() (for reports)
        self.prefills = 0

    def _step(self) -> None:
        """One decode step of every slot; fixed buffers only (capturable). Idle slots clamp at the end."""
        last = self.fused(self.token, self.position)
        nxt = last.argmax(dim=-1, keepdim=True)
        self.token.copy_(nxt)
        self.out.scatter_(1, self.count, nxt)
        self.count.add_(1).clamp_(max=self.max_cache_len - 1)
        self.position.add_(1).clamp_(max=self.max_cache_len - 1)

    def _prefill(self, slots: list[int], prompts: list[list[int]]) -> None:
        """Prompts (right-padded) into `slots`: their K/V, first token, position and count."""
        import torch

        lengths = [len(p) for p in prompts]
        width = max(lengths)
        ids = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            ids[row, : len(prompt)] = torch.tensor(prompt, dtype=torch.long)
        ids = ids.to(self.device)
        rows = torch.tensor(slots, dtype=torch.long, device=self.device)
        lens = torch.tensor(lengths, dtype=torch.long, device=self.device)
        positions = torch.arange(width, device=self.device).unsqueeze(0).expand(len(prompts), width)
        first = self.fused(ids, positions, rows=rows, last_index=lens - 1).argmax(dim=-1)
        self.token[rows, 0] = first
        self.position[rows, 0] = lens
        self.out[rows, 0] = first
        self.count[rows, 0] = 1
        self.prefills += 1

    def _admit(self, slots: list[int], prompts: list[list[int]]) -> None:
        """Prefill in groups of at most `prefill_tokens` padded tokens."""
        group: list[int] = []
        width = 0  # the longest prompt in `group`
        for index, prompt in enumerate(prompts):
            wider = max(width, len(prompt))
            if group and wider * (len(group) + 1) > self.prefill_tokens:
                self._prefill([slots[i] for i in group], [prompts[i] for i in group])
                group, wider = [], len(prompt)
            group.append(index)
            width = wider
        if group:
            self._prefill([slots[i] for i in group], [prompts[i] for i in group])

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int | Sequence[int], *,
                 eos_token_id: Any = "model") -> list[list[int]]:
        """Greedy new tokens for each prompt (token-id lists), in prompt order; each row ends at its first
        EOS (included) or after its `max_new_tokens` (one number, or one per prompt)."""
        import torch

        prompts = [list(p) for p in prompts]
        if not prompts:
            raise FastDecodeError("prompts=[] is empty: pass at least one prompt of token ids.")
        budgets = ([max_new_tokens] * len(prompts) if isinstance(max_new_tokens, int)
                   else list(max_new_tokens))
        if len(budgets) != len(prompts):
            raise FastDecodeError(f"{len(budgets)} max_new_tokens for {len(prompts)} prompts: give one number "
                                  "or one per prompt.")
        for index, (prompt, budget) in enumerate(zip(prompts, budgets, strict=True)):
            if not prompt:
                raise FastDecodeError(f"prompts[{index}] is empty: every prompt needs at least one token.")
            if isinstance(budget, bool) or not isinstance(budget, int) or budget <= 0:
                raise FastDecodeError(f"max_new_tokens={budget!r} (prompt {index}) must be a positive integer.")
            if len(prompt) + budget > self.max_cache_len:
                raise FastDecodeError(
                    f"prompt {index}: length {len(prompt)} + max_new_tokens {budget} exceeds "
                    f"max_cache_len={self.max_cache_len}; build the decoder with a larger max_cache_len.")
        eos = set(eos_ids(self.model, eos_token_id))
        results: list[list[int] | None] = [None] * len(prompts)
        waiting = deque(range(len(prompts)))
        active: dict[int, tuple[int, int, int]] = {}  # slot -> (request, tokens produced, of them checked for EOS)
        self.steps = self.prefills = 0
        with torch.inference_mode():
            if self.use_graphs and self.graph is None:
                self.graph, self.capture_seconds = capture_graph(
                    self._step_fn, self.device, [self.token, self.position, self.count, self.out],
                    tools=self.graph_tools, platform=self.platform)
            run = self.graph.replay if self.graph is not None else self._step_fn
            while waiting or active:
                free = [s for s in range(self.slots) if s not in active]
                admitted = []
                while free and waiting:
                    admitted.append((free.pop(0), waiting.popleft()))
                if admitted:
                    self._admit([s for s, _ in admitted], [prompts[r] for _, r in admitted])
                    active.update({s: (r, 1, 0) for s, r in admitted})  # the prefill's token, unchecked
                chunk = min(self.check_every, *(budgets[r] - n for r, n, _ in active.values()))
                for _ in range(chunk):
                    run()
                self.steps += chunk
                produced = self.out.cpu()  # one transfer per chunk: the host's only sync
                for slot, (request, n, checked) in list(active.items()):
                    n += chunk
                    fresh = produced[slot, checked:n].tolist() if eos else []
                    hit = next((checked + i for i, t in enumerate(fresh) if t in eos), None)
                    if hit is not None or n >= budgets[request]:
                        results[request] = produced[slot, : hit + 1 if hit is not None else budgets[request]].tolist()
                        del active[slot]
                    else:
                        active[slot] = (request, n, n)
        return [r if r is not None else [] for r in results]

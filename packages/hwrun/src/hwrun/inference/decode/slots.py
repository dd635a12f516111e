"""Continuous batching over a fixed set of cache slots, each decode step captured as one device graph.

Why: Transformers' continuous batching (`generate_batch`) with sdpa attends every query over the
padded keys of all requests in the batch and plans each step on the host; on an H200 at 64
prompts it reached 2,617 tokens/s against 20,386 for a static CUDA-graph batch
(docs/benchmarks/decode.md). Here each request owns one slot (one row of a static K/V cache, each
row at its own position), and a step runs with fixed shapes, so it is captured once and replayed; a
row attends only to its own keys.

Only the rows in use step. The active requests are kept packed in the lowest slots: when one leaves
(finished or cancelled) the highest active row moves into its slot (its K/V up to its length in every
layer, its token, position, token counter, produced tokens and sampling row: `moves` counts them). A
step runs over the first B rows, B the smallest of `buckets` (default 1, 2, 4, ... and `slots`) that
holds every active request, through views of the fixed buffers, so each bucket has its own fixed
shapes and addresses and its own graph (and compiled step). Idle slots are not free: a step's time
grows with its rows (weights are read once, but each row's attention reads its whole cache row, and
on CPU every row costs its own arithmetic), so one active request of 64 slots steps one row, not 64.
Optionally (`cache_buckets`, e.g. `length_buckets(max_cache_len)`: 128, 256, 512, ... and
`max_cache_len`), a step also attends over only the first C cache positions, C the smallest cache
bucket past the furthest position its rows reach (the host knows every row's position), so short
requests in a long cache do not read the whole row; off by default (None: every position), as it
multiplies the graphs. Graphs are captured per (rows, cache length, greedy or sampled): lazily, the
first time one is needed, or all at once by `start()`, which a server calls so that no stream pauses
for a capture (or a compile) mid-run; each captured graph keeps its own activation memory, and each
compiled one is its own compilation.

The step (`step="auto" | "fused" | "model"`, as for the static decoder): "fused" is
hwrun.inference.decode.fused_step with per-row positions (Llama, Mistral, Qwen2: q/k/v and gate/up
read as one matrix each); "model" runs the model's own forward for the stepped slots at once over a
`SlotCache` (hwrun.inference.decode.slot_cache: each row's K/V written at that row's position, a 4D
mask per row, per-row `position_ids`), so any family whose attention goes through Transformers'
attention interface with sdpa or eager attention decodes here; "auto" takes the fused step where it
applies (an optimisation, not a gate), else the model's own forward, and logs which and why
(`decoder.step_name`, `decoder.step_reason`). What neither step runs (an encoder-decoder, a class that
computes attention itself, flash attention, a sliding window shorter than the cache) is a
`FastDecodeError` naming the reason; hwrun's generate() and server then use Transformers' loop.

The graph is a CUDA graph on NVIDIA/ROCm, an XPU graph on Intel GPUs and an HPU graph on Gaudi in
lazy mode (the platform's `graph_tools`); elsewhere the same loop runs eagerly, which is how CPU tests prove that its greedy
tokens equal `model.generate`'s for each prompt. Sampling (temperature, top-p, top-k, seed per
request) runs inside the step (hwrun.inference.decode.sampling); a bucket's sampled graph is captured
the first time a sampled request is active at that bucket, so greedy batches keep the plain argmax step.
A row's noise depends only on its seed and its token counter, both of which move with it.

Two ways to drive it:

- **Step-wise (a server admitting live requests between steps):**
  `decoder.add(request_id, input_ids, *, max_new_tokens, sampling=None, eos_token_id="model")` gives
  the prompt the lowest free slot; the next `step()` prefills every request added since, in padded groups of
  <= `prefill_tokens` (requests arriving together share one forward), and they join that step; `FastDecodeError` when no
  slot is free, the id is already active, or prompt + `max_new_tokens` exceeds `max_cache_len`.
  `decoder.step() -> list[TokenEvent]` runs one decode step (one graph replay where the platform has
  graphs) over the active requests' bucket and returns one
  `TokenEvent(request_id, token_id, finished, finish_reason)` per active request: a request's first
  event is its prefill token; `finish_reason` is `"stop"` (the token is one of its EOS ids, and is
  included), `"length"` (its `max_new_tokens`-th token) or None. A finished request leaves its slot at
  once. Each step reads one token per request to the host (one small transfer); each row is one step
  ahead of what it reported, so a request's last step computes one token nobody reads.
  `decoder.cancel(request_id)` frees its slot before the next step (an unknown id is a
  `FastDecodeError`); `decoder.free_slots` (int) and `decoder.active` (set of request ids) describe the
  state; `decoder.start()` captures every bucket's graphs (or runs each compiled step once) if not yet
  done, so no request pays for it. Greedy requests give exactly `model.generate(do_sample=False)`'s
  tokens; seeded sampled requests give the same tokens whatever else is in the batch and however often
  they move.
- **Whole batches:** `decoder.generate(prompts, max_new_tokens, *, eos_token_id="model", sampling=None)`
  admits prompts into free slots, padded prefills in groups of <= `prefill_tokens` (right-padded for the
  fused step, left-padded for the model's own forward), and reads the
  host only every `check_every` steps (sooner when a request's budget ends), retiring finished
  requests (packing the rest down) and admitting waiting ones while the others continue. It shares the
  prefill, the sampling rows and the graphs with the step-wise API, but not at the same time: it
  refuses while requests added with `add()` are active.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ...errors import FastDecodeError
from .sampling import SamplingParams, SamplingRows, next_tokens
from .static import (
    STEPS,
    FilterChoice,
    cache_keyword,
    capture_graph,
    check_compile_allowed,
    check_decoder_args,
    compile_step,
    decoder_graph_tools,
    eos_ids,
    model_platform,
    with_filter_fallback,
)

logger = logging.getLogger(__name__)

#: Most prompt tokens one prefill call takes (prompts admitted together are right-padded to the longest).
PREFILL_TOKENS = 8192

GREEDY = SamplingParams()

FUSED_REASON = "the fused Llama-family step (q/k/v and gate/up as one matrix each, per-row K/V writes)"


def slot_step_support(model: Any, step: str = "auto", max_cache_len: int | None = None) -> tuple[str | None, str]:
    """(step, reason): which step the slot decoder runs `model` with for `step` ("auto", "fused" or "model"):
    "fused" where `fused_step_support` says it applies (an optimisation), else "model", the model's own
    forward over a `SlotCache` with per-row positions and masks; (None, why neither can) otherwise, e.g. a
    RoPE whose frequencies depend on the batch's longest row (`slot_cache.rope_blocker`, for `max_cache_len`)."""
    from .fused_step import fused_step_support
    from .slot_cache import model_step_support, rope_blocker

    if step not in STEPS:
        raise FastDecodeError(f"step={step!r} is not a decode step; use one of {', '.join(STEPS)}.")
    rope = rope_blocker(model.config, max_cache_len)
    if rope is not None:
        return None, f"neither slot step runs {type(model).__name__}: {rope}"
    unfused = fused_step_support(model) if step != "model" else None
    if step != "model" and unfused is None:
        return "fused", FUSED_REASON
    if step == "fused":
        return None, f"step='fused' cannot run {type(model).__name__}: {unfused}. Use step='model' or 'auto'"
    own = model_step_support(model)
    why = "step='model' given" if step == "model" else f"the fused step does not apply: {unfused}"
    if own is not None:
        return None, f"the model's own forward cannot run here ({own}; {why})"
    return "model", f"the model's own forward over a per-row slot cache ({why})"


@dataclass(frozen=True)
class TokenEvent:
    """One new token of one request: `finish_reason` is "stop" (an EOS id, included), "length"
    (its `max_new_tokens`-th token) or None (more follow)."""

    request_id: Any
    token_id: int
    finished: bool
    finish_reason: str | None = None


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
    """Row buckets for a decoder whose step is compiled: each bucket is one compile (greedy and sampled), so
    only 1, 8 and `slots` (one stream, light load, full load); None (the default powers of two) when not
    compiled. `generate()` and the server use it."""
    if not compiled:
        return None
    return tuple(sorted({1, min(8, slots), slots}))


def length_buckets(max_cache_len: int, smallest: int = 128) -> tuple[int, ...]:
    """Cache lengths for `SlotDecoder(cache_buckets=...)`: the powers of two from `smallest` below `max_cache_len`,
    and `max_cache_len`."""
    sizes = []
    size = smallest
    while size < max_cache_len:
        sizes.append(size)
        size *= 2
    return (*sizes, max_cache_len)


@dataclass
class _Request:
    """A request added with `add()`: its slot, prompt length, budget, stop ids and how many tokens were reported."""

    slot: int
    length: int
    budget: int
    eos: frozenset[int]
    reported: int = 0
    prompt: list[int] | None = None  # until the next step() prefills it (with every request added since)


class SlotDecoder:
    """Continuous batching of any number of prompts through `slots` cache rows of `max_cache_len`
    positions each (a prompt plus its new tokens must fit one row). `use_graphs=None` captures where the
    model's platform (`platform`, default: the one of `model.device`) has graph tools; `step` picks the
    fused Llama-family step or the model's own forward ("auto": fused where it applies); `buckets` are
    the row counts a step runs over (default 1, 2, 4, ... and `slots`; `buckets=[slots]` steps every slot
    always, one graph); `cache_buckets` the cache lengths its attention may be bounded to (default None:
    all `max_cache_len` positions; `length_buckets(max_cache_len)` gives powers of two). See the module docstring for the step-wise API (`add`, `step`, `cancel`, `start`)
    and `generate`."""

    def __init__(self, model: Any, *, slots: int, max_cache_len: int, use_graphs: bool | None = None,
                 compile_backend: Any = None, compile_mode: str | None = None, tune: bool = False,
                 check_every: int = 16, prefill_tokens: int = PREFILL_TOKENS, step: str = "auto",
                 platform: Any = None, buckets: Sequence[int] | None = None,
                 cache_buckets: Sequence[int] | None = None) -> None:
        import torch

        self.platform = model_platform(model, platform)
        check_compile_allowed(self.platform, compile_backend)
        self.graph_tools = decoder_graph_tools(self.platform) if use_graphs is not False else None
        check_decoder_args(model, slots, max_cache_len, use_graphs, self.graph_tools, self.platform)
        self.buckets = bucket_sizes(slots, buckets)
        self.cache_buckets = self._cache_buckets(max_cache_len, cache_buckets)
        self.step_name, self.step_reason = slot_step_support(model, step, max_cache_len)
        if self.step_name is None:
            if step == "fused":
                raise FastDecodeError(f"{self.step_reason}.")
            raise FastDecodeError(f"the slot decoder cannot run {type(model).__name__}: {self.step_reason}. "
                                  "Use decode='generate' (Transformers' generate_batch).")
        if step == "auto":
            logger.info("slot decoder step: %s", self.step_reason)
        self.model = model
        self.device = model.device
        self.slots = slots
        self.max_cache_len = max_cache_len
        self.check_every = max(1, check_every)
        self.prefill_tokens = max(1, prefill_tokens)
        self.use_graphs = self.graph_tools is not None if use_graphs is None else use_graphs
        long = dict(dtype=torch.long, device=self.device)
        self.token = torch.zeros((slots, 1), **long)  # each slot's newest token ...
        self.position = torch.zeros((slots, 1), **long)  # ... and its position
        self.count = torch.zeros((slots, 1), **long)  # tokens each slot's request has produced
        self.out = torch.zeros((slots, max_cache_len), **long)  # those tokens
        self.fused = None
        self.cache = None
        if self.step_name == "fused":
            from .fused_step import FusedLlamaStep

            self.fused = FusedLlamaStep(model, batch_size=slots, max_cache_len=max_cache_len, per_row_positions=True)
        else:
            self._build_cache()
        self.sampling = SamplingRows(slots, self.device)
        self._compile = (compile_backend, compile_mode, tune)
        # (sampled, rows, columns) -> the step over the first rows, attending over the first columns; its graph
        self._step_fns: dict[tuple[bool, int, int], Any] = {}
        self.graphs: dict[tuple[bool, int, int], Any] = {}
        self._warm: set[tuple[bool, int, int]] = set()
        self.compiled = compile_backend is not None
        self.sampling_fallback: str | None = None  # why a compiled sampled step's filter runs eagerly, if one does
        self.capture_seconds: float | None = None
        self.steps = 0  # decode steps run by the last generate() (for reports)
        self.prefills = 0
        self.moves = 0  # rows moved down to keep the active ones packed (since construction)
        self.last_rows = 0  # the rows the latest step ran over ...
        self.last_columns = 0  # ... and the cache positions it attended over
        self._owner: list[Any] = [None] * slots  # request id per slot (step-wise API)
        self._requests: dict[Any, _Request] = {}

    def _build_cache(self) -> None:
        """The model step's per-row cache, allocated now by a one-token prefill of slot 0 (the model's own K/V
        shapes, dtype and device), outside inference mode so later steps may update it from any mode."""
        import torch

        from .slot_cache import SlotCache, attention_kind

        config = self.model.config.get_text_config(decoder=True)
        self.cache = SlotCache(self.slots, self.max_cache_len, config.num_hidden_layers, self.position)
        self.cache_keyword = cache_keyword(self.model)
        self.attention = attention_kind(self.model)
        self.mask_dtype = self.model.dtype
        self.key_index = torch.arange(self.max_cache_len, device=self.device)
        with torch.inference_mode(False), torch.no_grad():
            self._model_prefill(torch.zeros((1, 1), dtype=torch.long, device=self.device),
                                torch.zeros(1, dtype=torch.long, device=self.device))

    @staticmethod
    def _cache_buckets(max_cache_len: int, cache_buckets: Sequence[int] | None) -> tuple[int, ...]:
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

    @property
    def graph(self) -> Any:
        """The captured greedy step over every slot and position (None before capture or without graphs)."""
        return self.graphs.get((False, self.slots, self.max_cache_len))

    @property
    def _step_fn(self) -> Any:
        """The greedy step over every slot (compiled where asked): what tools/bench/profile_decoders.py times."""
        return self._step_function(False, self.slots, self.max_cache_len)

    def bucket(self, active: int) -> int:
        """The rows a step runs over with `active` requests (packed in the lowest slots): the smallest bucket
        that holds them."""
        return next(size for size in self.buckets if size >= active)

    def cache_bucket(self, columns: int) -> int:
        """The cache positions a step attends over when its rows need the first `columns`: the smallest cache
        bucket that holds them."""
        return next(size for size in self.cache_buckets if size >= min(columns, self.max_cache_len))

    # ---- the step and the prefill (shared by both APIs) -------------------------------------------

    def _step(self, sample: bool = False, rows: int | None = None, columns: int | None = None,
              filter: Any = None) -> None:
        """One decode step of the first `rows` slots (default: all), attending over the first `columns` cache
        positions (default: all; every active row's position must be below it); fixed buffers and views of them
        only (capturable). Idle rows among them step too and clamp at the end; the rows above are not touched."""
        rows = self.slots if rows is None else rows
        columns = self.max_cache_len if columns is None else columns
        part = rows != self.slots
        token = self.token[:rows] if part else self.token
        position = self.position[:rows] if part else self.position
        count = self.count[:rows] if part else self.count
        if self.fused is not None:
            last = self.fused(token, position, columns=columns)
        else:
            from .slot_cache import visible_mask

            # each row sees the columns up to its own position (written by this step's update)
            keys = self.key_index if columns == self.max_cache_len else self.key_index[:columns]
            mask = visible_mask(keys[None, None, :] <= position[:, :, None], self.attention, self.mask_dtype)
            last = self.model(input_ids=token, position_ids=position, attention_mask=mask,
                              **{self.cache_keyword: self.cache}, use_cache=True, logits_to_keep=1).logits[:, -1]
        if sample:
            nxt = next_tokens(last, *self.sampling.first(rows), count, filter=filter).unsqueeze(-1)
        else:
            nxt = last.argmax(dim=-1, keepdim=True)
        token.copy_(nxt)
        self.out.scatter_(1, count, nxt)  # on the whole buffer: a smaller index writes only the stepped rows
        count.add_(1).clamp_(max=self.max_cache_len - 1)
        position.add_(1).clamp_(max=self.max_cache_len - 1)

    def _step_buffers(self) -> list[Any]:
        """What one step moves (tokens, positions, counters, produced tokens): restored after capture warm-ups.
        The K/V a step writes is rewritten with the same values when the step runs again."""
        return [self.token, self.position, self.count, self.out]

    def _step_function(self, sample: bool, rows: int, columns: int) -> Any:
        """The step over the first `rows` slots and `columns` positions, compiled where asked; built once per
        (sample, rows, columns). Each gets its own code object, so torch.compile keeps one entry per bucket
        instead of recompiling one past its recompile limit; the model step's cache is told the rows and
        columns outside the compiled region."""
        key = (sample, rows, columns)
        if key not in self._step_fns:
            choice = FilterChoice()

            def step() -> None:
                self._step(sample, rows, columns, choice.filter)

            kind = "sampled" if sample else "greedy"
            step.__code__ = step.__code__.replace(co_name=f"slot_step_{kind}_{rows}_{columns}")
            compiled = compile_step(step, *self._compile)
            if sample and self.compiled:
                compiled = with_filter_fallback(compiled, choice, self)
            if self.cache is None:
                self._step_fns[key] = compiled
            else:
                def run() -> None:
                    self.cache.decoding(rows, columns)
                    compiled()

                self._step_fns[key] = run
        return self._step_fns[key]

    def _prefill(self, slots: list[int], prompts: list[list[int]]) -> None:
        """Prompts into `slots`: their K/V, first token, position and count (no other row is touched). The fused
        step takes them right-padded, the model step left-padded (each row's last token in the last column)."""
        import torch

        lengths = [len(p) for p in prompts]
        width = max(lengths)
        left = self.fused is None
        ids = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            start = width - len(prompt) if left else 0
            ids[row, start:start + len(prompt)] = torch.tensor(prompt, dtype=torch.long)
        ids = ids.to(self.device)
        rows = torch.tensor(slots, dtype=torch.long, device=self.device)
        lens = torch.tensor(lengths, dtype=torch.long, device=self.device)
        if left:
            logits = self._model_prefill(ids, rows, width - lens)
        else:
            positions = torch.arange(width, device=self.device).unsqueeze(0).expand(len(prompts), width)
            logits = self.fused(ids, positions, rows=rows, last_index=lens - 1)
        if self.sampling.sampling(slots):
            first = next_tokens(logits, *self.sampling.take(rows), torch.zeros_like(rows))
        else:
            first = logits.argmax(dim=-1)
        self.token[rows, 0] = first
        self.position[rows, 0] = lens
        self.out[rows, 0] = first
        self.count[rows, 0] = 1
        self.prefills += 1

    def _model_prefill(self, ids: Any, rows: Any, pads: Any = None) -> Any:
        """The model's own forward over left-padded prompts `ids` (pads[i] leading pad columns in row i), their K/V
        written into cache rows `rows` from column 0; the last column's logits (each row's next token)."""
        import torch

        from .slot_cache import visible_mask

        batch, width = ids.shape
        pads = torch.zeros(batch, dtype=torch.long, device=self.device) if pads is None else pads
        cols = torch.arange(width, device=self.device)
        positions = (cols[None, :] - pads[:, None]).clamp(min=0)
        shift = (cols[None, :] + pads[:, None]).clamp(max=width - 1)
        query, key = cols[None, :, None], cols[None, None, :]
        # causal over the row's real tokens; a pad column sees only itself (no row is fully masked)
        visible = (key <= query) & ((key >= pads[:, None, None]) | (key == query))
        self.cache.prefilling(rows, shift)
        try:
            out = self.model(input_ids=ids, position_ids=positions,
                             attention_mask=visible_mask(visible, self.attention, self.mask_dtype),
                             **{self.cache_keyword: self.cache}, use_cache=True, logits_to_keep=1)
        finally:
            self.cache.decoding()
        return out.logits[:, -1]

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

    def _move(self, source: int, target: int, columns: int) -> None:
        """Row `source`'s whole decoding state into row `target`: its K/V (first `columns` positions, every
        layer), token, position, token counter, produced tokens and sampling row (seed included, so its noise
        stream goes on). Outside any graph: the next step reads the fixed buffers."""
        import torch

        columns = min(columns, self.max_cache_len)
        with torch.inference_mode():
            for buffer in (self.token, self.position, self.count, self.out):
                buffer[target] = buffer[source]
            self.sampling.move(source, target)
            if self.fused is not None:
                self.fused.move_row(source, target, columns)
            else:
                self.cache.move_row(source, target, columns)
        self.moves += 1

    def _runner(self, sample: bool, rows: int | None = None, columns: int | None = None) -> Any:
        """The callable that runs one step over the first `rows` slots and `columns` positions (default: all):
        the captured graph (captured now if needed) or the step itself."""
        rows = self.slots if rows is None else rows
        columns = self.max_cache_len if columns is None else columns
        step = self._step_function(sample, rows, columns)
        if not self.use_graphs:
            return step
        key = (sample, rows, columns)
        if key not in self.graphs:
            self.graphs[key], seconds = capture_graph(
                step, self.device, self._step_buffers(),
                tools=self.graph_tools, platform=self.platform)
            self.capture_seconds = (self.capture_seconds or 0.0) + seconds
        return self.graphs[key].replay

    def start(self, *, sampling: bool = True) -> None:
        """Warm up before the first request: capture every (rows, cache length) bucket's greedy step (and
        sampled step when `sampling`) if not yet captured; without graphs, run each compiled step once (its
        compilation). All at once, so that no live stream later waits while a bucket it grew into is captured
        or compiled."""
        import torch

        kinds = (False, True) if sampling else (False,)
        with torch.inference_mode():
            for key in ((s, r, c) for s in kinds for r in self.buckets for c in self.cache_buckets):
                if self.use_graphs:
                    self._runner(*key)
                elif self.compiled and key not in self._warm:
                    saved = [(buffer, buffer.clone()) for buffer in self._step_buffers()]
                    self._step_function(*key)()
                    for buffer, value in saved:
                        buffer.copy_(value)
                self._warm.add(key)

    # ---- step-wise API ------------------------------------------------------------------------------

    @property
    def free_slots(self) -> int:
        """Slots no request holds now."""
        return self._owner.count(None)

    @property
    def active(self) -> set:
        """Ids of the requests added with `add()` that have not finished or been cancelled."""
        return set(self._requests)

    def _check_request(self, prompt: list[int], budget: Any, where: str) -> None:
        if not prompt:
            raise FastDecodeError(f"{where} is empty: every prompt needs at least one token.")
        if isinstance(budget, bool) or not isinstance(budget, int) or budget <= 0:
            raise FastDecodeError(f"max_new_tokens={budget!r} ({where}) must be a positive integer.")
        if len(prompt) + budget > self.max_cache_len:
            raise FastDecodeError(
                f"{where}: length {len(prompt)} + max_new_tokens {budget} exceeds "
                f"max_cache_len={self.max_cache_len}; build the decoder with a larger max_cache_len.")

    def add(self, request_id: Any, input_ids: Sequence[int], *, max_new_tokens: int,
            sampling: SamplingParams | None = None, eos_token_id: Any = "model") -> None:
        """Give `input_ids` the lowest free slot; the next `step()` prefills it (with every request added since,
        in padded groups) and the request joins that step."""
        prompt = [int(t) for t in input_ids]
        if request_id in self._requests:
            raise FastDecodeError(f"request_id={request_id!r} is already active; use a new id or cancel it first.")
        self._check_request(prompt, max_new_tokens, f"request {request_id!r}")
        if None not in self._owner:
            raise FastDecodeError(f"no free slot for request {request_id!r}: all {self.slots} slots are busy; "
                                  "step() until one finishes, cancel one, or build the decoder with more slots.")
        sampling = GREEDY if sampling is None else sampling
        if not isinstance(sampling, SamplingParams):
            raise FastDecodeError(f"sampling={sampling!r} must be a SamplingParams or None (greedy).")
        slot = self._owner.index(None)
        self.sampling.set(slot, sampling)
        self._owner[slot] = request_id
        # the prefill waits for the next step(), which prefills every request added since in padded groups
        # (one forward for requests that arrive together, instead of one each)
        self._requests[request_id] = _Request(slot, len(prompt), max_new_tokens,
                                              frozenset(eos_ids(self.model, eos_token_id)), prompt=prompt)

    def _pack(self) -> None:
        """Move the highest active rows into the free slots below them, so the active requests hold the lowest
        slots and the next step runs over as few rows as they need."""
        while True:
            busy = [s for s, owner in enumerate(self._owner) if owner is not None]
            holes = [s for s in range(len(busy)) if self._owner[s] is None]
            if not holes:
                return
            source, target = busy[-1], holes[0]
            request = self._requests[self._owner[source]]
            # the row has written K/V at positions 0 .. length + reported - 1 (one step ahead of its reports)
            self._move(source, target, request.length + request.reported)
            request.slot = target
            self._owner[target], self._owner[source] = self._owner[source], None

    def cancel(self, request_id: Any) -> None:
        """Drop an active request; its slot is free for the next `add()`."""
        request = self._requests.pop(request_id, None)
        if request is None:
            raise FastDecodeError(f"request_id={request_id!r} is not active (finished, cancelled or never added).")
        self._owner[request.slot] = None
        self._pack()

    def step(self) -> list[TokenEvent]:
        """One decode step over the active requests' bucket of rows; one `TokenEvent` per active request (its
        oldest unreported token)."""
        import torch

        if not self._requests:
            return []
        pending = [r for r in self._requests.values() if r.prompt is not None]
        if pending:
            with torch.inference_mode():
                self._admit([r.slot for r in pending], [r.prompt for r in pending])
            for request in pending:
                request.prompt = None
        items = list(self._requests.items())
        rows = self.bucket(len(items))  # the active requests hold slots 0 .. len(items) - 1
        # a row at position p (its prompt and reported tokens) writes column p and attends over 0 .. p
        columns = self.cache_bucket(max(r.length + r.reported for _, r in items) + 1)
        with torch.inference_mode():
            self._runner(self.sampling.sampling(r.slot for _, r in items), rows, columns)()
            index = torch.tensor([r.slot for _, r in items], device=self.device)
            cols = torch.tensor([r.reported for _, r in items], device=self.device)
            tokens = self.out[index, cols].tolist()  # the host's one read per step
        self.last_rows, self.last_columns = rows, columns
        events = []
        for (request_id, request), token in zip(items, tokens, strict=True):
            request.reported += 1
            reason = "stop" if token in request.eos else "length" if request.reported >= request.budget else None
            if reason is not None:
                del self._requests[request_id]
                self._owner[request.slot] = None
            events.append(TokenEvent(request_id, token, reason is not None, reason))
        self._pack()
        return events

    # ---- whole batches ----------------------------------------------------------------------------

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int | Sequence[int], *,
                 eos_token_id: Any = "model", sampling: SamplingParams | None = None) -> list[list[int]]:
        """New tokens for each prompt (token-id lists), in prompt order; each row ends at its first EOS
        (included) or after its `max_new_tokens` (one number, or one per prompt). Greedy unless `sampling`
        (one `SamplingParams` for every prompt) says otherwise."""
        import torch

        if self._requests:
            raise FastDecodeError(f"generate() needs every slot, but {len(self._requests)} request(s) added with "
                                  "add() are active; step() them to the end or cancel() them first.")
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
            self._check_request(prompt, budget, f"prompt {index}")
        sampling = GREEDY if sampling is None else sampling
        sample = not sampling.greedy
        eos = set(eos_ids(self.model, eos_token_id))
        results: list[list[int] | None] = [None] * len(prompts)
        waiting = deque(range(len(prompts)))
        # slot -> (request, tokens produced, of them checked for EOS); always slots 0 .. len(active) - 1
        active: dict[int, tuple[int, int, int]] = {}
        self.steps = self.prefills = 0
        with torch.inference_mode():
            self.sampling.fill(sampling)
            while waiting or active:
                admitted = []
                while len(active) + len(admitted) < self.slots and waiting:
                    admitted.append((len(active) + len(admitted), waiting.popleft()))
                if admitted:
                    if sampling.seed is None and not sampling.greedy and self.prefills:
                        # a freed row keeps the seed of the request it held (or of one moved into it): unseeded
                        # prompts admitted later draw their own, or equal prompts would repeat their samples
                        for slot, _ in admitted:
                            self.sampling.set(slot, sampling)
                    self._admit([s for s, _ in admitted], [prompts[r] for _, r in admitted])
                    active.update({s: (r, 1, 0) for s, r in admitted})  # the prefill's token, unchecked
                rows = self.bucket(len(active))
                chunk = min(self.check_every, *(budgets[r] - n for r, n, _ in active.values()))
                # n tokens produced: position len + n - 1 now, len + n + chunk - 2 at the chunk's last step
                columns = self.cache_bucket(max(len(prompts[r]) + n for r, n, _ in active.values()) + chunk - 1)
                run = self._runner(sample, rows, columns)
                for _ in range(chunk):
                    run()
                self.steps += chunk
                self.last_rows, self.last_columns = rows, columns
                produced = self.out[:rows].cpu()  # one transfer per chunk: the host's only sync
                for slot, (request, n, checked) in list(active.items()):
                    n += chunk
                    fresh = produced[slot, checked:n].tolist() if eos else []
                    hit = next((checked + i for i, t in enumerate(fresh) if t in eos), None)
                    if hit is not None or n >= budgets[request]:
                        results[request] = produced[slot, : hit + 1 if hit is not None else budgets[request]].tolist()
                        del active[slot]
                    else:
                        active[slot] = (request, n, n)
                self._pack_batch(active, prompts)
        return [r if r is not None else [] for r in results]

    def _pack_batch(self, active: dict[int, tuple[int, int, int]], prompts: list[list[int]]) -> None:
        """generate()'s `_pack`: move the highest active rows into the free slots below them (re-keying `active`)."""
        while True:
            holes = [s for s in range(len(active)) if s not in active]
            if not holes:
                return
            source = max(active)
            request, n, checked = active.pop(source)
            # n tokens produced: the row has written K/V at positions 0 .. len(prompt) + n - 2
            self._move(source, holes[0], len(prompts[request]) + n)
            active[holes[0]] = (request, n, checked)

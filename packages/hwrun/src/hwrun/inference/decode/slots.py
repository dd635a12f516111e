"""Continuous batching over a fixed set of cache slots, with the decode step captured as one device graph.

Why: Transformers' continuous batching (`generate_batch`) with sdpa attends every query over the
padded keys of all requests in the batch and plans each step on the host; on an H200 at 64
prompts it reached 2,617 tokens/s against 20,386 for a static CUDA-graph batch
(docs/benchmarks/decode.md). Here each request owns one slot (one row of a static K/V cache, each
row at its own position). Every decode step runs all slots at once with fixed shapes, so it is
captured once and replayed; a row attends only to its own keys. Idle slots step too (their rows are
ignored); that costs nothing extra, as a step reads the weights once for all rows.

The step (`step="auto" | "fused" | "model"`, as for the static decoder): "fused" is
hwrun.inference.decode.fused_step with per-row positions (Llama, Mistral, Qwen2: q/k/v and gate/up
read as one matrix each); "model" runs the model's own forward for all slots at once over a
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
request) runs inside the step (hwrun.inference.decode.sampling); a second graph is captured for it
the first time a sampled request is active, so greedy batches keep the plain argmax step.

Two ways to drive it:

- **Step-wise (a server admitting live requests between steps):**
  `decoder.add(request_id, input_ids, *, max_new_tokens, sampling=None, eos_token_id="model")` prefills
  the prompt into a free slot now (the request joins at the next step); `FastDecodeError` when no
  slot is free, the id is already active, or prompt + `max_new_tokens` exceeds `max_cache_len`.
  `decoder.step() -> list[TokenEvent]` runs one decode step (one graph replay where the platform has
  graphs) over all slots and returns one `TokenEvent(request_id, token_id, finished, finish_reason)`
  per active request: a request's first event is its prefill token; `finish_reason` is `"stop"`
  (the token is one of its EOS ids, and is included), `"length"` (its `max_new_tokens`-th token) or
  None. A finished request leaves its slot at once. Each step reads one token per request to the
  host (one small transfer); each row is one step ahead of what it reported, so a request's last
  step computes one token nobody reads. `decoder.cancel(request_id)` frees its slot before the next
  step (an unknown id is a `FastDecodeError`); `decoder.free_slots` (int) and `decoder.active` (set of
  request ids) describe the state; `decoder.start()` captures the graphs (and runs the compiled
  step once) if not yet done, so the first request does not pay for it.
  Greedy requests give exactly `model.generate(do_sample=False)`'s tokens; seeded sampled requests
  give the same tokens whatever else is in the batch.
- **Whole batches:** `decoder.generate(prompts, max_new_tokens, *, eos_token_id="model", sampling=None)`
  admits prompts into free slots, padded prefills in groups of <= `prefill_tokens` (right-padded for the
  fused step, left-padded for the model's own forward), and reads the
  host only every `check_every` steps (sooner when a request's budget ends), retiring finished
  requests and admitting waiting ones while the others continue. It shares the prefill, the sampling
  rows and the graphs with the step-wise API, but not at the same time: it refuses while requests
  added with `add()` are active.
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
    cache_keyword,
    capture_graph,
    check_compile_allowed,
    check_decoder_args,
    compile_step,
    decoder_graph_tools,
    eos_ids,
    model_platform,
)

logger = logging.getLogger(__name__)

#: Most prompt tokens one prefill call takes (prompts admitted together are right-padded to the longest).
PREFILL_TOKENS = 8192

GREEDY = SamplingParams()

FUSED_REASON = "the fused Llama-family step (q/k/v and gate/up as one matrix each, per-row K/V writes)"


def slot_step_support(model: Any, step: str = "auto") -> tuple[str | None, str]:
    """(step, reason): which step the slot decoder runs `model` with for `step` ("auto", "fused" or "model"):
    "fused" where `fused_step_support` says it applies (an optimisation), else "model", the model's own
    forward over a `SlotCache` with per-row positions and masks; (None, why neither can) otherwise."""
    from .fused_step import fused_step_support
    from .slot_cache import model_step_support

    if step not in STEPS:
        raise FastDecodeError(f"step={step!r} is not a decode step; use one of {', '.join(STEPS)}.")
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


@dataclass
class _Request:
    """A request added with `add()`: its slot, budget, stop ids and how many tokens were reported."""

    slot: int
    budget: int
    eos: frozenset[int]
    reported: int = 0


class SlotDecoder:
    """Continuous batching of any number of prompts through `slots` cache rows of `max_cache_len`
    positions each (a prompt plus its new tokens must fit one row). `use_graphs=None` captures where the
    model's platform (`platform`, default: the one of `model.device`) has graph tools; `step` picks the
    fused Llama-family step or the model's own forward ("auto": fused where it applies). See the module
    docstring for the step-wise API (`add`, `step`, `cancel`, `start`) and `generate`."""

    def __init__(self, model: Any, *, slots: int, max_cache_len: int, use_graphs: bool | None = None,
                 compile_backend: Any = None, compile_mode: str | None = None, tune: bool = False,
                 check_every: int = 16, prefill_tokens: int = PREFILL_TOKENS, step: str = "auto",
                 platform: Any = None) -> None:
        import torch

        self.platform = model_platform(model, platform)
        check_compile_allowed(self.platform, compile_backend)
        self.graph_tools = decoder_graph_tools(self.platform) if use_graphs is not False else None
        check_decoder_args(model, slots, max_cache_len, use_graphs, self.graph_tools, self.platform)
        self.step_name, self.step_reason = slot_step_support(model, step)
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
        self._step_fns = {sample: compile_step(lambda s=sample: self._step(s), compile_backend, compile_mode, tune)
                          for sample in (False, True)}
        self._step_fn = self._step_fns[False]  # the greedy step (kept under its old name)
        self.graphs: dict[bool, Any] = {}
        self._warm: set[bool] = set()
        self.compiled = compile_backend is not None
        self.capture_seconds: float | None = None
        self.steps = 0  # decode steps run by the last generate() (for reports)
        self.prefills = 0
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

    @property
    def graph(self) -> Any:
        """The captured greedy step (None before capture or without graphs)."""
        return self.graphs.get(False)

    # ---- the step and the prefill (shared by both APIs) -------------------------------------------

    def _step(self, sample: bool = False) -> None:
        """One decode step of every slot; fixed buffers only (capturable). Idle slots clamp at the end."""
        if self.fused is not None:
            last = self.fused(self.token, self.position)
        else:
            from .slot_cache import visible_mask

            # each row sees the columns up to its own position (written by this step's update)
            mask = visible_mask(self.key_index[None, None, :] <= self.position[:, :, None], self.attention,
                                self.mask_dtype)
            last = self.model(input_ids=self.token, position_ids=self.position, attention_mask=mask,
                              **{self.cache_keyword: self.cache}, use_cache=True, logits_to_keep=1).logits[:, -1]
        if sample:
            nxt = next_tokens(last, *self.sampling.all(), self.count).unsqueeze(-1)
        else:
            nxt = last.argmax(dim=-1, keepdim=True)
        self.token.copy_(nxt)
        self.out.scatter_(1, self.count, nxt)
        self.count.add_(1).clamp_(max=self.max_cache_len - 1)
        self.position.add_(1).clamp_(max=self.max_cache_len - 1)

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

    def _runner(self, sample: bool) -> Any:
        """The callable that runs one step: the captured graph (captured now if needed) or the step itself."""
        if not self.use_graphs:
            return self._step_fns[sample]
        if sample not in self.graphs:
            self.graphs[sample], seconds = capture_graph(
                self._step_fns[sample], self.device, [self.token, self.position, self.count, self.out],
                tools=self.graph_tools, platform=self.platform)
            self.capture_seconds = (self.capture_seconds or 0.0) + seconds
        return self.graphs[sample].replay

    def start(self, *, sampling: bool = True) -> None:
        """Warm up before the first request: capture the greedy step's graph (and the sampled step's when
        `sampling`) if not yet captured; without graphs, run a compiled step once (its compilation)."""
        import torch

        kinds = (False, True) if sampling else (False,)
        with torch.inference_mode():
            for sample in kinds:
                if self.use_graphs:
                    self._runner(sample)
                elif self.compiled and sample not in self._warm:
                    buffers = [self.token, self.position, self.count, self.out]
                    saved = [b.clone() for b in buffers]
                    self._step_fns[sample]()
                    for buffer, value in zip(buffers, saved, strict=True):
                        buffer.copy_(value)
                self._warm.add(sample)

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
        """Prefill `input_ids` into a free slot; the request joins at the next `step()`."""
        import torch

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
        with torch.inference_mode():
            self._prefill([slot], [prompt])
        self._owner[slot] = request_id
        self._requests[request_id] = _Request(slot, max_new_tokens, frozenset(eos_ids(self.model, eos_token_id)))

    def cancel(self, request_id: Any) -> None:
        """Drop an active request; its slot is free for the next `add()`."""
        request = self._requests.pop(request_id, None)
        if request is None:
            raise FastDecodeError(f"request_id={request_id!r} is not active (finished, cancelled or never added).")
        self._owner[request.slot] = None

    def step(self) -> list[TokenEvent]:
        """One decode step over every slot; one `TokenEvent` per active request (its oldest unreported token)."""
        import torch

        if not self._requests:
            return []
        items = list(self._requests.items())
        with torch.inference_mode():
            self._runner(self.sampling.sampling(r.slot for _, r in items))()
            rows = torch.tensor([r.slot for _, r in items], device=self.device)
            cols = torch.tensor([r.reported for _, r in items], device=self.device)
            tokens = self.out[rows, cols].tolist()  # the host's one read per step
        events = []
        for (request_id, request), token in zip(items, tokens, strict=True):
            request.reported += 1
            reason = "stop" if token in request.eos else "length" if request.reported >= request.budget else None
            if reason is not None:
                del self._requests[request_id]
                self._owner[request.slot] = None
            events.append(TokenEvent(request_id, token, reason is not None, reason))
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
        active: dict[int, tuple[int, int, int]] = {}  # slot -> (request, tokens produced, of them checked for EOS)
        self.steps = self.prefills = 0
        with torch.inference_mode():
            self.sampling.fill(sampling)
            run = self._runner(sample)
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

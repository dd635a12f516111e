"""`EngineCore`: hwrun's engine loop. It composes the rooms (scheduler, model runner, KV-cache manager; the package
docstring draws them) and keeps the two ways to drive them. Why: Transformers' continuous batching ran 2,617 tokens/s
at 64 prompts on an H200 against 20,386 for a static CUDA-graph batch (docs/benchmarks/decode.md); here each request
owns a slot (a row of the step at its own position) and KV blocks for the tokens it holds (kv_cache: a pool sized
by `kv_cache_memory`; when it runs out the newest request is preempted and recomputed later), and a step, captured
per bucket, has fixed shapes. `adapters=[(name,
folder), ...]` loads LoRA adapters that `add(adapter=...)` picks per request (engine.adapters: eager model step).

- **Step-wise** (a server): `add(request_id, input_ids, *, max_new_tokens, sampling=None, eos_token_id="model",
  n=1, matchers=None)` gives each of its `n` choices a free slot (`FastDecodeError` when too few are free, the id
  is active, or prompt + `max_new_tokens` exceeds `max_cache_len`); the next `step()`s prefill the prompt once, at
  most `prefill_chunk` tokens a step (the other choices copy its K/V), and the choices join the step that ends it.
  `step() -> list[TokenEvent]` runs one decode step (a graph replay where the platform has graphs) and reads one
  token per decoding choice (its first event is its prefill token; with its `index`, and its `logprob` / `top`
  when asked); `finish_reason` "stop" (an EOS id, included), "length", "error" (its grammar, `matchers`:
  hwrun.inference.engine.grammar, rejected a token) or None; a finished choice leaves its slot at once.
  `cancel(request_id, index=None)`, `free_slots`, `active`; `start()` captures every bucket before a request.
- **Whole batches:** `generate(prompts, max_new_tokens, *, eos_token_id="model", sampling=None)` admits prompts into
  free slots and reads the host every `check_every` steps (sooner when a budget ends), retiring finished requests
  and admitting waiting ones while the others run; it refuses while requests added with `add()` are active.

Greedy requests give exactly `model.generate(do_sample=False)`'s tokens; seeded sampled requests the same tokens
whatever else is in the batch and however often they move. What no step runs is a `FastDecodeError` naming why.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from ...errors import FastDecodeError
from ..decode.paged_attention import choose_paged_attention
from ..decode.sampling import SamplingParams
from .adapters import AdapterRows, check_adapter, plan_adapters
from .grammar import constrain, first_masks
from .graphs import check_compile_allowed, decoder_graph_tools, model_platform
from .kv_cache import KVCache
from .kv_memory import KVReport, KVStats, agree_across_ranks, blocks_in, kv_budget, parse_kv_memory
from .prefill_budget import prefill_chunk_for
from .quantized import plan_quantized
from .requests import GREEDY, TokenEvent, check_choices, choices, eos_ids
from .runner import ModelRunner
from .scheduler import (
    PREFILL_TOKENS,
    Move,
    Scheduler,
    bucket_sizes,
    cache_bucket_sizes,
)
from .steps import check_decoder_args, slot_step_support
from .transfers import Transfers

logger = logging.getLogger(__name__)


class EngineCore:
    """Continuous batching of any number of prompts through `slots` cache rows of `max_cache_len` positions each (a
    prompt plus its new tokens must fit one row). `use_graphs=None` captures where the model's platform (`platform`,
    default: the one of `model.device`) has graph tools; `step` picks the fused Llama-family step or the model's
    own forward ("auto": fused where it applies); `buckets` are the row counts a step runs over (`buckets=[slots]`
    steps every slot always, one graph); `cache_buckets` the cache lengths its attention may be bounded to;
    `prefill_chunk` the prompt tokens a step prefills (default per device and model size: `prefill_chunk_for`);
    `kv_cache_memory` the bytes (or fraction of the free memory after load) of K/V blocks the requests share (default
    per device: `kv_budget`; `kv_report` says what it holds); `prefix_caching` lets a prompt share the blocks of a
    prefix an earlier prompt wrote (by token-chain hash; freed least recently used); `paged_attention` how a decode
    step reads them ("auto", "gather", "triton": `decode.paged_attention`)."""

    def __init__(self, model: Any, *, slots: int, max_cache_len: int, use_graphs: bool | None = None,
                 compile_backend: Any = None, compile_mode: str | None = None, tune: bool = False,
                 check_every: int = 16, prefill_tokens: int = PREFILL_TOKENS, step: str = "auto",
                 platform: Any = None, buckets: Sequence[int] | None = None,
                 cache_buckets: Sequence[int] | None = None, prefill_chunk: int | None = None,
                 adapters: Sequence[tuple[str, str]] | None = None, kv_cache_memory: Any = None,
                 prefix_caching: bool = True, paged_attention: str = "auto") -> None:
        step, use_graphs = plan_adapters(adapters, step, use_graphs, compile_backend)
        step, use_graphs = plan_quantized(model, step, use_graphs, compile_backend)
        self.platform = model_platform(model, platform)
        check_compile_allowed(self.platform, compile_backend)
        self.graph_tools = decoder_graph_tools(self.platform) if use_graphs is not False else None
        check_decoder_args(model, slots, max_cache_len, use_graphs, self.graph_tools, self.platform)
        buckets = bucket_sizes(slots, buckets)
        cache_buckets = cache_bucket_sizes(max_cache_len, cache_buckets)
        self.step_name, self.step_reason = slot_step_support(model, step, max_cache_len)
        if self.step_name is None:
            raise FastDecodeError(f"{self.step_reason}." if step == "fused" else f"hwrun's engine cannot run "
                                  f"{type(model).__name__}: {self.step_reason}. Use decode='generate' (Transformers' "
                                  "generate_batch).")
        if step == "auto":
            logger.info("engine step: %s", self.step_reason)
        self.prefill_chunk, self.prefill_chunk_reason = prefill_chunk_for(self.platform, prefill_chunk, model.num_parameters())
        self.model, self.device = model, model.device
        self.slots, self.max_cache_len = slots, max_cache_len
        self.check_every, self.prefill_tokens = max(1, check_every), max(1, prefill_tokens)
        self.use_graphs = self.graph_tools is not None if use_graphs is None else use_graphs
        kv_memory = parse_kv_memory(kv_cache_memory)
        self.kv_report: KVReport | None = None

        def sizer(bytes_per_token: int, block_size: int) -> int:  # once the model's K/V shape is known
            full = slots * self.kv.max_blocks * block_size * bytes_per_token
            budget, why = kv_budget(kv_memory, model.device, self.platform.is_accelerator, full)
            blocks, why = agree_across_ranks(blocks_in(budget, bytes_per_token, block_size, why), why, model)
            self.kv_report = KVReport(blocks, block_size, bytes_per_token, max_cache_len, why)
            return blocks

        # shared prompt prefixes (prefix_caching): off with LoRA adapters, whose K/V differ per adapter
        self.kv = KVCache(slots, max_cache_len, sizer=sizer, prefix_caching=prefix_caching and not adapters,
                          transfers=Transfers(self.platform, model.device))
        self.kv.attention, self.paged_attention_reason = choose_paged_attention(
            model, paged_attention, self.step_name, self.kv.block_size, self.platform)
        self.adapters = AdapterRows(model, adapters, slots) if adapters else None
        self.runner = ModelRunner(model, self.step_name, self.kv, platform=self.platform,
                                  graph_tools=self.graph_tools, use_graphs=self.use_graphs,
                                  compile=(compile_backend, compile_mode, tune), adapters=self.adapters)
        self.scheduler = Scheduler(self.kv, buckets=buckets, cache_buckets=cache_buckets,
                                   prefill_tokens=self.prefill_tokens, prefill_chunk=self.prefill_chunk)
        self.steps = 0  # decode steps run by the last generate() (for reports)
        self.prefills = 0  # prefill forwards (since construction, or since the last generate() began)
        self.moves = 0  # rows moved down to keep the active ones packed (since construction)
        self.last_rows = self.last_columns = 0  # the rows the latest step ran over, the cache positions it attended

    # ---- what the rooms hold ---------------------------------------------------------------------------------

    @property
    def buckets(self) -> tuple[int, ...]:
        """The row counts a decode step runs over."""
        return self.scheduler.buckets

    @property
    def cache_buckets(self) -> tuple[int, ...]:
        """The cache lengths a decode step may attend over."""
        return self.scheduler.cache_buckets

    @property
    def graphs(self) -> dict:
        """The captured steps by (kind, rows, columns); kinds: hwrun.inference.engine.choosing (0 greedy, 1 sampled)."""
        return self.runner.graphs

    @property
    def graph(self) -> Any:
        """The captured greedy step over every slot and position (None before capture or without graphs)."""
        return self.runner.graphs.get((0, self.slots, self.max_cache_len))

    @property
    def compiled(self) -> bool:
        """Whether the step is compiled."""
        return self.runner.compiled

    @property
    def sampling_fallback(self) -> str | None:
        """Why a compiled sampled step's filter runs eagerly, if one does."""
        return self.runner.sampling_fallback

    @property
    def capture_seconds(self) -> float | None:
        """Seconds spent capturing graphs (None before any capture)."""
        return self.runner.capture_seconds

    @property
    def free_slots(self) -> int:
        """Slots no request holds now."""
        return self.kv.free_slots

    @property
    def active(self) -> set:
        """Ids of the requests added with `add()` that have not finished or been cancelled."""
        return {r.request_id for r in self.scheduler.requests.values()}

    def kv_stats(self) -> KVStats:
        """How the KV blocks are used now: blocks held, prefix-cache tokens looked up and found, preemptions, requests
        waiting for blocks (hwrun serve's /metrics)."""
        blocks, size = self.kv.blocks, self.kv.block_size
        return KVStats(blocks.num_blocks, blocks.num_blocks - blocks.free_blocks, blocks.lookups * size,
                       blocks.hits * size, self.scheduler.preemptions, self.scheduler.waiting_for_blocks)

    def start(self, *, sampling: bool = True, processed: bool = False) -> None:
        """Warm up before the first request: capture every (rows, cache length) bucket's greedy step (and sampled
        step when `sampling`, the processed and masked steps when `processed`: penalties, bias, min-p, logprobs,
        grammar masks), or compile each without graphs, so no live stream waits for one mid-run."""
        self.runner.start(self.scheduler.buckets, self.scheduler.cache_buckets, sampling, processed)

    # ---- step-wise API ----------------------------------------------------------------------------------------

    def add(self, request_id: Any, input_ids: Sequence[int], *, max_new_tokens: int,
            sampling: SamplingParams | None = None, eos_token_id: Any = "model", n: int = 1,
            matchers: Sequence[Any] | None = None, adapter: str | None = None) -> None:
        """Give each of the `n` choices of `input_ids` the lowest free slot; the next `step()`s prefill the prompt
        once (the other choices copy it) and they join the step that ends it. Choice i > 0 of a seeded request
        samples with a seed derived from the request's and i. `matchers`: one grammar matcher per choice;
        `adapter`: a LoRA adapter the engine loaded (None: the base model)."""
        prompt = [int(t) for t in input_ids]
        if request_id in self.active:
            raise FastDecodeError(f"request_id={request_id!r} is already active; use a new id or cancel it first.")
        self.scheduler.check(prompt, max_new_tokens, f"request {request_id!r}")
        check_choices(request_id, n, matchers, self.slots)
        self.kv.check_fits(len(prompt) + max_new_tokens, n, f"request {request_id!r}")
        if self.kv.free_slots < n:
            free = f"all {self.slots} slots are busy" if not self.kv.free_slots else (
                f"{self.kv.free_slots} of {self.slots} slots free for its {n} choices")
            raise FastDecodeError(f"no free slot for request {request_id!r}: {free}; step() until one finishes, cancel "
                                  "one, or build the engine with more slots.")
        sampling = GREEDY if sampling is None else sampling
        if not isinstance(sampling, SamplingParams):
            raise FastDecodeError(f"sampling={sampling!r} must be a SamplingParams or None (greedy).")
        self.runner.choice.check(sampling)
        check_adapter(self.adapters, adapter)
        eos = frozenset(eos_ids(self.model, eos_token_id))
        for request in choices(request_id, prompt, max_new_tokens, eos, sampling, n, matchers):
            self.scheduler.admit(request)
            self.runner.set_sampling(request.slot, request.sampling, prompt, request.matcher is not None, adapter)

    def cancel(self, request_id: Any, index: int | None = None) -> None:
        """Drop an active request (every choice, or choice `index`); its slots are free for the next `add()`."""
        self.scheduler.cancel(request_id, index)
        self._move(self.scheduler.pack())

    def step(self) -> list[TokenEvent]:
        """This step's prefill chunks, then one decode step over the decoding choices' bucket of rows; one
        `TokenEvent` per decoding choice (its oldest unreported token), and one per choice whose grammar failed."""
        if not self.scheduler.requests:
            return []
        forwards = self.scheduler.prefill_plan()
        self._preempted()
        self._prefill(forwards)
        events = constrain(self.scheduler, self.runner)
        if events:  # choices a grammar failed left: pack before the shape, so every decoding row is stepped
            self._move(self.scheduler.pack())
        decoding = self.scheduler.decoding()
        if decoding:
            rows, columns = self.scheduler.shape(decoding)
            # the tokens this step reports were produced before it (its prefill's, the last step's): their copy to
            # the host is queued before the step, and the host waits for it alone while the step runs on
            slots, columns_read = [r.slot for r in decoding], [r.read for r in decoding]
            tokens_later = self.runner.read_later(slots, columns_read)
            logprobs_later = self.runner.read_logprobs_later(slots, columns_read)  # of the rows that asked
            self.runner.run(self.runner.kind(r.slot for r in decoding), rows, columns)
            tokens, logprobs = tokens_later(), logprobs_later()
            self.last_rows, self.last_columns = rows, columns
            for request, token in zip(decoding, tokens, strict=True):
                request.produced += 1
                logprob, top = logprobs.get(request.slot, (None, ()))
                _, reason = self.scheduler.finish(request, [token])
                events.append(TokenEvent(request.request_id, token, reason is not None, reason, request.index,
                                         logprob, top))
        self._move(self.scheduler.pack())
        return events

    def _prefill(self, forwards: list) -> None:
        for forward in forwards:
            self.runner.masks(first_masks(self.scheduler, forward))
            self.runner.prefill(forward)
            for chunk in forward:
                if chunk.last and chunk.resume:
                    self.runner.resume(chunk.slot, chunk.resume, self.scheduler.requests[self.kv.owner[chunk.slot]].saved)
            self.scheduler.prefilled(forward)
            self.prefills += 1

    def _preempted(self) -> None:
        """Save what the requests preempted by the last plan need to go on later: their tokens (recomputed with
        the prompt) and their choosing rows."""
        for request in self.scheduler.take_preempted():
            if request.recompute == []:
                tokens, request.saved = self.runner.preempt(request.slot, request.produced)
                request.recompute = request.prompt + tokens

    def _move(self, moves: list[Move]) -> None:
        for move in moves:
            self.runner.move_row(move.source, move.target, move.columns)
            self.moves += 1

    # ---- whole batches ------------------------------------------------------------------------------------------

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int | Sequence[int], *,
                 eos_token_id: Any = "model", sampling: SamplingParams | None = None) -> list[list[int]]:
        """New tokens for each prompt (token-id lists), in prompt order; each row ends at its first EOS
        (included) or after its `max_new_tokens` (one number, or one per prompt). Greedy unless `sampling`
        (one `SamplingParams` for every prompt) says otherwise (hwrun.inference.engine.batches)."""
        from .batches import generate

        return generate(self, prompts, max_new_tokens, eos_token_id=eos_token_id, sampling=sampling)

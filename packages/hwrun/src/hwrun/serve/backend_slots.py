"""The `slots` backend: hwrun's engine (`hwrun.inference.engine.EngineCore`) driven step by step.

Each request owns one slot per choice (a row of the static K/V cache); every `decoder.step()` decodes the active
requests at once (packed in the lowest slots, over the smallest bucket of rows that holds them), as one
graph replay where the platform has CUDA, XPU or HPU graphs. The engine admits waiting requests
into `decoder.free_slots` between steps; `decoder.cancel` frees a slot at the next step. This module
adapts the decoder's step API (`add`, `step` -> `TokenEvent`s, `cancel`, `free_slots`, `start`) to
the engine's `Backend` and maps a request's fields onto it: every sampling field of `Sampling` (penalties, bias,
min-p, logprobs run inside the step), `n` choices (the prompt prefilled once), `stop_token_ids` (with the model's
EOS unless `ignore_eos`), and `structured` output as one grammar matcher per choice (`hwrun.inference.structured`,
compiled with the tokenizer given here), and `adapter`: a LoRA adapter the engine loaded (`EngineCore(adapters=...)`,
rows of different adapters in one eager step of the model's forward); an engine without them refuses it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from .backend import START_PROGRESS, EngineEvent, EngineRequest, TokenLogprob

logger = logging.getLogger(__name__)

#: The decoder methods this backend drives (the slot decoder's step API).
STEP_API = ("add", "step", "cancel", "start", "free_slots")
#: Why this backend refuses a request naming a LoRA adapter when its engine loaded none.
ADAPTER_REFUSAL = ("this slot engine loaded no LoRA adapters (start the server with --lora NAME=PATH: the engine then "
                   "runs the model's own forward eagerly, rows of different adapters in one step)")


#: Why this backend refuses structured output when it was built without the model's tokenizer.
STRUCTURED_REFUSAL = ("the slot engine was built without the model's tokenizer, which compiling a grammar needs "
                      "(SlotsBackend(..., tokenizer=...))")


def step_api_missing(decoder_class: Any) -> list[str]:
    """The step-API members `decoder_class` lacks (empty when it has them all)."""
    return [name for name in STEP_API if not hasattr(decoder_class, name)]


def sampling_params(sampling: Any, sampling_class: Any) -> Any:
    """The engine's `SamplingParams` (`sampling_class`) of a request's `Sampling`: every field but `structured`."""
    return sampling_class(temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k,
                          seed=sampling.seed, min_p=sampling.min_p, presence_penalty=sampling.presence_penalty,
                          frequency_penalty=sampling.frequency_penalty,
                          repetition_penalty=sampling.repetition_penalty, logit_bias=tuple(sampling.logit_bias),
                          logprobs=sampling.logprobs)


class SlotsBackend:
    """Adapts a slot decoder with the step API to the engine's `Backend` interface. `tokenizer` (the model's) lets
    it compile grammars for `structured` requests (without one they are refused)."""

    name = "slots"

    def __init__(self, decoder: Any, *, sampling_class: Any, eos_token_id: Any = "model", tokenizer: Any = None,
                 structured_backend: str = "auto") -> None:
        self.decoder = decoder
        self.sampling_class = sampling_class
        self.eos_token_id = eos_token_id
        self.tokenizer = tokenizer
        self.structured_backend = structured_backend
        self._compiler: Any = None
        self._open: dict[str, set[int]] = {}  # request id -> its choices still decoding

    @property
    def refuses(self) -> dict[str, str]:
        """The request fields it refuses, and why (the front answers 400 from these)."""
        refused = {} if getattr(self.decoder, "adapters", None) is not None else {"adapter": ADAPTER_REFUSAL}
        if self.tokenizer is None:
            refused["structured"] = STRUCTURED_REFUSAL
        return refused

    @property
    def capacity(self) -> int:
        """Slots in all (the most choices one request may have)."""
        return int(self.decoder.slots)

    def start(self, progress: Callable[[str], None] | None = None) -> None:
        """Capture (or warm) every step kind of the decoder (greedy, sampled, processed, masked) before the server
        reports healthy; each bucket done is a line to `progress` (default: `START_PROGRESS`, the server's start-up
        log where the engine core set it) as well as to the log."""
        report = progress if progress is not None else START_PROGRESS.get()
        runner = getattr(self.decoder, "runner", None)
        if report is None or runner is None:
            if report is not None:
                logger.info("the %s decoder has no model runner: its warm-up is not reported bucket by bucket",
                            type(self.decoder).__name__)
            self.decoder.start(processed=True)
            return
        runner.progress = lambda warmed: report(warmed.line())
        try:
            self.decoder.start(processed=True)
        finally:
            runner.progress = None

    def free_slots(self) -> int:
        """Slots no request holds."""
        return int(self.decoder.free_slots)

    def kv_stats(self) -> list[int] | None:
        """The engine's KV use now (`KVStats.as_list`), sent with every batch; None for a decoder without blocks."""
        stats = getattr(self.decoder, "kv_stats", None)
        return None if stats is None else stats().as_list()

    def refusal(self, request: EngineRequest) -> str | None:
        """Why this backend cannot run `request`, or None."""
        if request.adapter is not None:
            loaded = getattr(self.decoder, "adapters", None)
            if loaded is None:
                return f"adapter={request.adapter!r}: {ADAPTER_REFUSAL}"
            if request.adapter not in loaded.available:
                return f"adapter={request.adapter!r} is not loaded here; the engine has {list(loaded.available)}"
        if request.n > self.capacity:
            return (f"n={request.n} choices need {request.n} slots at once; this server has {self.capacity} "
                    "(--max-concurrency)")
        if request.sampling.structured is not None and self.tokenizer is None:
            return f"structured output: {STRUCTURED_REFUSAL}"
        return None

    def _eos(self, request: EngineRequest) -> Any:
        """The request's stop ids: the model's EOS (unless `ignore_eos`) and its `stop_token_ids`."""
        if not request.stop_token_ids:
            return None if request.ignore_eos else self.eos_token_id
        model: list[int] = []
        if not request.ignore_eos and self.eos_token_id is not None:
            from ..inference.engine.requests import eos_ids

            model = eos_ids(self.decoder.model, self.eos_token_id)
        return sorted({*model, *request.stop_token_ids})

    def _matchers(self, request: EngineRequest) -> list[Any] | None:
        spec = request.sampling.structured
        if spec is None:
            return None
        if self._compiler is None:
            from ..inference.structured import structured_compiler

            self._compiler = structured_compiler(self.tokenizer, int(self.decoder.runner.choice.vocab),
                                                 backend=self.structured_backend)
        return [self._compiler.matcher(spec) for _ in range(request.n)]

    def add(self, request: EngineRequest) -> None:
        """Prefill `request` into free slots (one per choice) with its own sampling, stop ids and grammar."""
        why = self.refusal(request)
        if why is not None:
            raise ValueError(why)
        sampling = sampling_params(request.sampling, self.sampling_class)
        self.decoder.add(request.request_id, list(request.input_ids), max_new_tokens=request.max_new_tokens,
                         sampling=sampling, eos_token_id=self._eos(request), n=request.n,
                         matchers=self._matchers(request),
                         **({} if request.adapter is None else {"adapter": request.adapter}))
        self._open[request.request_id] = set(range(request.n))

    def cancel(self, request_id: str) -> None:
        """Free `request_id`'s slots from the next step on."""
        if self._open.pop(request_id, None) is not None and request_id in self.decoder.active:
            self.decoder.cancel(request_id)

    def step(self) -> list[EngineEvent]:
        """One decoder step; its `TokenEvent`s grouped per request and choice, in order."""
        import torch

        with torch.inference_mode():
            token_events = self.decoder.step()
        grouped: dict[tuple[str, int], list[Any]] = {}
        for event in token_events:
            if event.index in self._open.get(event.request_id, ()):
                grouped.setdefault((event.request_id, event.index), []).append(event)
        events = []
        for (request_id, index), group in grouped.items():
            done = next((i for i, e in enumerate(group) if e.finished), None)
            kept = group if done is None else group[: done + 1]
            tokens = tuple(int(e.token_id) for e in kept if e.token_id is not None)
            logprobs = None
            if any(e.logprob is not None for e in kept):
                logprobs = tuple(TokenLogprob(float(e.logprob), tuple(e.top)) for e in kept if e.token_id is not None)
            if done is None:
                events.append(EngineEvent(request_id, tokens, index=index, logprobs=logprobs))
                continue
            last = group[done]
            reason = last.finish_reason or "stop"
            left = self._open[request_id]
            left.discard(index)
            if not left or reason not in ("stop", "length"):
                del self._open[request_id]
                if left and request_id in self.decoder.active:
                    self.decoder.cancel(request_id)  # a failed choice ends the request
            events.append(EngineEvent(request_id, tokens, True, reason, last.error, index=index, logprobs=logprobs))
        return events

    def close(self) -> None:
        """Cancel whatever still holds a slot."""
        for request_id in list(self._open):
            self.cancel(request_id)

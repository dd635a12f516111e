"""The `slots` backend: hwrun's engine (`hwrun.inference.engine.EngineCore`) driven step by step.

Each request owns one slot (a row of the static K/V cache); every `decoder.step()` decodes the active
requests at once (packed in the lowest slots, over the smallest bucket of rows that holds them), as one
graph replay where the platform has CUDA, XPU or HPU graphs. The engine admits waiting requests
into `decoder.free_slots` between steps; `decoder.cancel` frees a slot at the next step. This module
only adapts the decoder's step API (`add`, `step` -> `TokenEvent`s, `cancel`, `free_slots`, `start`) to
the engine's `Backend`; sampling, EOS and budgets are the decoder's.
"""

from __future__ import annotations

import logging
from typing import Any

from .engine import EngineEvent, EngineRequest

logger = logging.getLogger(__name__)

#: The decoder methods this backend drives (the slot decoder's step API).
STEP_API = ("add", "step", "cancel", "start", "free_slots")


def step_api_missing(decoder_class: Any) -> list[str]:
    """The step-API members `decoder_class` lacks (empty when it has them all)."""
    return [name for name in STEP_API if not hasattr(decoder_class, name)]


class SlotsBackend:
    """Adapts a slot decoder with the step API to the engine's `Backend` interface."""

    name = "slots"

    def __init__(self, decoder: Any, *, sampling_class: Any, eos_token_id: Any = "model") -> None:
        self.decoder = decoder
        self.sampling_class = sampling_class
        self.eos_token_id = eos_token_id
        self._budgets: dict[str, int] = {}

    def start(self) -> None:
        """Capture (or warm) the decoder's step before the server reports healthy."""
        self.decoder.start()

    def free_slots(self) -> int:
        """Slots no request holds."""
        return int(self.decoder.free_slots)

    def add(self, request: EngineRequest) -> None:
        """Prefill `request` into a free slot with its own sampling."""
        s = request.sampling
        sampling = self.sampling_class(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, seed=s.seed)
        self.decoder.add(request.request_id, list(request.input_ids), max_new_tokens=request.max_new_tokens,
                         sampling=sampling, eos_token_id=None if request.ignore_eos else self.eos_token_id)
        self._budgets[request.request_id] = request.max_new_tokens

    def cancel(self, request_id: str) -> None:
        """Free `request_id`'s slot from the next step on."""
        if self._budgets.pop(request_id, None) is not None:
            self.decoder.cancel(request_id)

    def step(self) -> list[EngineEvent]:
        """One decoder step; its `TokenEvent`s grouped per request, in order."""
        import torch

        with torch.inference_mode():
            token_events = self.decoder.step()
        grouped: dict[str, list[Any]] = {}
        for event in token_events:
            if event.request_id in self._budgets:
                grouped.setdefault(event.request_id, []).append(event)
        events = []
        for request_id, group in grouped.items():
            done = next((i for i, e in enumerate(group) if e.finished), None)
            kept = group if done is None else group[: done + 1]
            tokens = tuple(int(e.token_id) for e in kept)
            if done is None:
                events.append(EngineEvent(request_id, tokens))
            else:
                del self._budgets[request_id]
                events.append(EngineEvent(request_id, tokens, True, group[done].finish_reason or "stop"))
        return events

    def close(self) -> None:
        """Cancel whatever still holds a slot."""
        for request_id in list(self._budgets):
            self.cancel(request_id)


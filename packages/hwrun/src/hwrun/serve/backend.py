"""What the engine core and its backends exchange, with no dependency on either side: a request as a backend sees
it (`EngineRequest`), its tokens back (`EngineEvent`, `TokenLogprob`), the `Backend` protocol the core drives, and
which backend serves (`EngineChoice`), and where a backend's start says its progress (`START_PROGRESS`). The front
(`hwrun.serve.engine`), the core (`hwrun.serve.core`), start-up and the backends all import these from here, so none
of them imports another to learn a type."""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Protocol

from .protocol import Sampling

#: Finish reasons an engine reports: EOS ("stop"), the token budget ("length"), or the request ended early.
FINISH_REASONS = ("stop", "length", "cancelled", "error")
#: Failed steps in a row after which the engine itself fails (a backend that fails every step is broken).
MAX_STEP_FAILURES = 3
#: What a client is told when its request fails inside the engine (the details go to the server log).
GENERIC_FAILURE = "generation failed inside the engine; the server log has the details"
#: Where a backend's start says its progress (the slot engine's warm-up, one line per bucket): set by the engine core
#: while it builds the backend (`hwrun.serve.core.serve_core` sends each line to the front, whose start-up log says
#: it), unset elsewhere (the lines are logged only). A context variable, so start-up code in between need not pass it.
START_PROGRESS: ContextVar[Callable[[str], None] | None] = ContextVar("hwrun_serve_start_progress", default=None)


@dataclass(frozen=True)
class EngineRequest:
    """One request as a backend sees it: prompt token ids, its token budget and sampling; `ignore_eos` decodes the
    whole budget (the model's EOS does not end it; `stop_token_ids` still do). Each of its `n` choices finishes on
    its own (an event with its `index` and `finished`); a "cancelled" or "error" event ends the whole request."""

    request_id: str
    input_ids: tuple[int, ...]
    max_new_tokens: int
    sampling: Sampling = field(default_factory=Sampling)
    ignore_eos: bool = False
    n: int = 1  # choices of this prompt (the prompt is prefilled once); events say which by `index`
    stop_token_ids: tuple[int, ...] = ()  # ids that end the request besides the model's EOS (included, "stop")
    adapter: str | None = None  # the LoRA adapter (a name given to `--lora`) this request runs; None: the base


@dataclass(frozen=True)
class TokenLogprob:
    """The log-probability of one chosen token under the model's distribution, and the `top` most likely tokens
    of that step as (token id, logprob) pairs, most likely first (empty unless the request asked for them)."""

    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class EngineEvent:
    """New tokens of one request; `finished` with a `finish_reason` (one of `FINISH_REASONS`) on its last event."""

    request_id: str
    token_ids: tuple[int, ...] = ()
    finished: bool = False
    finish_reason: str | None = None
    error: str | None = None
    text: str | None = None  # the tokens' new text (the front's reader fills it); None: not detokenized yet
    index: int = 0  # which of the request's `n` choices these tokens belong to
    logprobs: tuple[TokenLogprob, ...] | None = None  # one per token id when the request asked for logprobs


@dataclass(frozen=True)
class EngineChoice:
    """Which backend serves (`name`: "slots" | "transformers") and why."""

    name: str
    reason: str


class Backend(Protocol):
    """What the engine needs from a decoder. Every method is called from the engine's worker thread only."""

    name: str

    def free_slots(self) -> int:
        """Requests `add` may take now."""

    def add(self, request: EngineRequest) -> None:
        """Start decoding `request` (its prefill runs at the next step or sooner)."""

    def cancel(self, request_id: str) -> None:
        """Stop `request_id`; its slot is free from the next step; no more events for it."""

    def step(self) -> list[EngineEvent]:
        """Decode one step (or wait briefly for the backend's own loop) and return the new events."""

    def refusal(self, request: EngineRequest) -> str | None:
        """Why this backend cannot run `request` (a field it does not implement, more choices than it holds), or
        None. The core fails such a request at once instead of queueing it."""

    def close(self) -> None:
        """Stop decoding and release the model's buffers."""

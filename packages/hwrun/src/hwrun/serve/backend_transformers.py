"""The `transformers` backend: Transformers' continuous-batching manager for live requests.

`model.init_continuous_batching(...)` returns the `ContinuousBatchingManager` that `transformers serve`
runs too (transformers/cli/serving/utils.py, `CBGenerateRunner`): a paged KV cache and its own
generation thread; requests join with `add_request` and leave with `cancel_request`, and streamed
outputs carry every token so far. Per-request sampling: the manager only applies the filters its
generation config creates, so the config here sets temperature, top-k and top-p (to placeholder values)
and every request passes its own; a greedy request passes `top_k=1`, as `transformers serve` does.
A request's `seed` seeds torch's global generator when the request is added (the manager shares one
generator): reproducible for one request at a time, not under concurrency.

Mapped: `stop_token_ids` (the request's own EOS list), `n` (n requests of the same prompt; the manager's prefix
cache may share its prefill, and seeded choices are not reproducible). Refused with the field and `--engine slots`
(`REFUSED`: the manager builds temperature / top-k / top-p processors per request and nothing else): min_p,
presence / frequency / repetition penalties, logit_bias, logprobs, structured output and adapters. Never ignored.
"""

from __future__ import annotations

import logging
from typing import Any

from ..errors import EngineStartError
from .backend import EngineEvent, EngineRequest

logger = logging.getLogger(__name__)

#: Seconds `step()` waits for the manager's next output before it returns to the scheduler.
RESULT_WAIT = 0.02
#: Request fields Transformers' continuous batching cannot apply per request, and why (the slot engine can).
REFUSED = {
    "min_p": "its batching manager applies per request only temperature, top_k and top_p",
    "presence_penalty": "its batching manager applies per request only temperature, top_k and top_p",
    "frequency_penalty": "its batching manager applies per request only temperature, top_k and top_p",
    "repetition_penalty": "its batching manager applies per request only temperature, top_k and top_p",
    "logit_bias": "its batching manager applies per request only temperature, top_k and top_p",
    "logprobs": "its batching manager reports no per-token alternatives of the model's own distribution",
    "structured": "its batching manager has no per-request token mask (response_format / tool_choice)",
    "adapter": "its batching manager runs the base weights only (no per-request LoRA)",
}
#: Each refused field's off value (a request at it is served).
_OFF = {"min_p": 0.0, "presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0, "logit_bias": (),
        "logprobs": None, "structured": None}


def refused_fields(request: EngineRequest) -> list[str]:
    """The fields of `request` set to a value Transformers' continuous batching cannot apply."""
    asked = [name for name, off in _OFF.items() if getattr(request.sampling, name) != off]
    return asked + (["adapter"] if request.adapter is not None else [])


class TransformersBackend:
    """Runs requests through `model.init_continuous_batching`; at most `max_concurrency` are handed to the
    manager at once (the engine's queue holds the rest)."""

    name = "transformers"
    refuses = REFUSED  # the request fields it refuses, and why (the front may answer 400 from these)

    def __init__(self, model: Any, *, kind: str, eos_ids: list[int], max_concurrency: int,
                 max_model_len: int, pad_token_id: int | None = None, warmup: bool = False) -> None:
        from transformers import GenerationConfig

        from ..inference.batching import workload_cb_config

        self.eos = set(eos_ids)
        self.max_concurrency = max_concurrency
        self.vocab = int(model.config.get_text_config().vocab_size)
        # placeholders: they make the manager build its per-request temperature / top-k / top-p processors
        config = GenerationConfig(do_sample=True, temperature=0.7, top_k=50, top_p=0.9, max_new_tokens=16,
                                  eos_token_id=sorted(self.eos) or -1, pad_token_id=pad_token_id)
        cb = workload_cb_config(kind, [max_model_len] * max_concurrency, 0)
        cb.per_request_processors = True
        self._build = lambda: model.init_continuous_batching(generation_config=config, continuous_batching_config=cb)
        self.manager = self._build()
        missing = {"temperature", "top_k", "top_p"} - set(self.manager.logit_processor.supported_keys)
        if missing:
            raise EngineStartError(f"Transformers' continuous batching built no per-request {sorted(missing)} "
                                   "processors here; per-request sampling would be ignored. Use --engine slots.")
        # manager id -> (request id, choice index, tokens sent, the ids that end it with "stop")
        self._requests: dict[str, tuple[str, int, int, frozenset[int]]] = {}
        if warmup:  # captures the manager's graphs before the first request (hwrun's CONTINUOUS_BATCHING row)
            self.manager.warmup()
        self.manager.start()

    @property
    def capacity(self) -> int:
        """Requests (choices) handed to the manager at once."""
        return self.max_concurrency

    def free_slots(self) -> int:
        """Requests the manager may take now (its own scheduler pages them in)."""
        return self.max_concurrency - len(self._requests)

    def refusal(self, request: EngineRequest) -> str | None:
        """Why this backend cannot run `request` (a field named in `REFUSED`, or more choices than it holds)."""
        fields = refused_fields(request)
        if fields:
            return (f"{', '.join(fields)}: not served by --engine transformers ({REFUSED[fields[0]]}); start the "
                    "server with --engine slots, which applies them inside its step")
        if request.n > self.max_concurrency:
            return f"n={request.n} choices need {request.n} requests at once; this server takes {self.max_concurrency}"
        return None

    def add(self, request: EngineRequest) -> None:
        """Hand `request`'s `n` choices to the manager with their own budget, sampling and stop ids."""
        import torch

        why = self.refusal(request)
        if why is not None:
            raise ValueError(why)
        if self.manager.background_thread_status.fatal_error is not None:
            self._restart()
        sampling = request.sampling
        if sampling.seed is not None:
            torch.manual_seed(sampling.seed)
        if sampling.greedy:
            kwargs = {"temperature": 1.0, "top_k": 1, "top_p": 1.0}
        else:
            top_k = min(sampling.top_k, self.vocab) if sampling.top_k > 0 else self.vocab
            kwargs = {"temperature": float(sampling.temperature), "top_k": int(top_k), "top_p": float(sampling.top_p)}
        stops = frozenset((set() if request.ignore_eos else self.eos) | set(request.stop_token_ids))
        for index in range(request.n):
            key = request.request_id if request.n == 1 else f"{request.request_id}#{index}"
            self._requests[key] = (request.request_id, index, 0, stops)
            added = self.manager.add_request(list(request.input_ids), request_id=key,
                                             max_new_tokens=request.max_new_tokens, streaming=True,
                                             eos_token_id=sorted(stops) or -1, **kwargs)
            if added is None:
                self.cancel(request.request_id)
                raise RuntimeError("Transformers' continuous batching manager is not accepting requests (stopping)")

    def cancel(self, request_id: str) -> None:
        """Cancel every choice of `request_id` in the manager; its pages are freed by the manager's next step."""
        for key in [k for k, entry in self._requests.items() if entry[0] == request_id]:
            del self._requests[key]
            self.manager.cancel_request(key)

    def step(self) -> list[EngineEvent]:
        """The manager's outputs since the last call, as events (waits up to `RESULT_WAIT` for the first)."""
        outputs = []
        output = self.manager.get_result(timeout=RESULT_WAIT)
        while output is not None:
            outputs.append(output)
            output = self.manager.get_result(timeout=0)
        if not outputs:
            fatal = self.manager.background_thread_status.fatal_error
            if fatal is not None:  # its requests got their error outputs before; any left fail here
                failed = {entry[0] for entry in self._requests.values()}
                events = [EngineEvent(r, (), True, "error", f"the batching worker died: {fatal}") for r in failed]
                self._requests.clear()
                self._restart()
                return events
            return []
        events = []
        for output in outputs:
            entry = self._requests.get(output.request_id)
            if entry is None:  # cancelled
                continue
            request_id, index, sent, stops = entry
            tokens = list(output.generated_tokens)
            new = tuple(tokens[sent:])
            if output.error is not None:
                self.cancel(request_id)  # a failed choice ends the request
                events.append(EngineEvent(request_id, new, True, "error", str(output.error), index=index))
            elif output.is_finished():
                del self._requests[output.request_id]
                reason = "stop" if tokens and tokens[-1] in stops else "length"
                events.append(EngineEvent(request_id, new, True, reason, index=index))
            elif new:
                self._requests[output.request_id] = (request_id, index, len(tokens), stops)
                events.append(EngineEvent(request_id, new, index=index))
        return events

    def _restart(self) -> None:
        """A request made the manager's generation thread fail (it fails every request it held): start a new
        manager, so one bad request does not stop the server. Raises when the new one cannot start."""
        logger.error("Transformers' continuous batching worker died (%s); starting a new one",
                     self.manager.background_thread_status.fatal_error)
        try:
            self.manager.stop(block=True, timeout=10, hard_stop=True)
        except Exception:  # noqa: BLE001 - the old manager is dead already
            logger.exception("stopping the dead continuous batching manager failed")
        self._requests.clear()
        self.manager = self._build()
        self.manager.start()

    def close(self) -> None:
        """Stop the manager's thread (requests still in it fail there)."""
        self.manager.stop(block=True, timeout=10, hard_stop=True)

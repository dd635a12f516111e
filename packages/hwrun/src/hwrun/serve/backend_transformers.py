"""The `transformers` backend: Transformers' continuous-batching manager for live requests.

`model.init_continuous_batching(...)` returns the `ContinuousBatchingManager` that `transformers serve`
runs too (transformers/cli/serving/utils.py, `CBGenerateRunner`): a paged KV cache and its own
generation thread; requests join with `add_request` and leave with `cancel_request`, and streamed
outputs carry every token so far. Per-request sampling: the manager only applies the filters its
generation config creates, so the config here sets temperature, top-k and top-p (to placeholder values)
and every request passes its own; a greedy request passes `top_k=1`, as `transformers serve` does.
A request's `seed` seeds torch's global generator when the request is added (the manager shares one
generator): reproducible for one request at a time, not under concurrency.
"""

from __future__ import annotations

import logging
from typing import Any

from ..errors import EngineStartError
from .engine import EngineEvent, EngineRequest

logger = logging.getLogger(__name__)

#: Seconds `step()` waits for the manager's next output before it returns to the scheduler.
RESULT_WAIT = 0.02


class TransformersBackend:
    """Runs requests through `model.init_continuous_batching`; at most `max_concurrency` are handed to the
    manager at once (the engine's queue holds the rest)."""

    name = "transformers"

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
        self._requests: dict[str, tuple[int, int, bool]] = {}  # id -> (tokens sent, max_new_tokens, ignore_eos)
        if warmup:  # captures the manager's graphs before the first request (hwrun's CONTINUOUS_BATCHING row)
            self.manager.warmup()
        self.manager.start()

    def free_slots(self) -> int:
        """Requests the manager may take now (its own scheduler pages them in)."""
        return self.max_concurrency - len(self._requests)

    def add(self, request: EngineRequest) -> None:
        """Hand `request` to the manager with its own budget and sampling."""
        import torch

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
        self._requests[request.request_id] = (0, request.max_new_tokens, request.ignore_eos)
        added = self.manager.add_request(list(request.input_ids), request_id=request.request_id,
                                         max_new_tokens=request.max_new_tokens, streaming=True,
                                         eos_token_id=-1 if request.ignore_eos else sorted(self.eos) or -1,
                                         **kwargs)
        if added is None:
            del self._requests[request.request_id]
            raise RuntimeError("Transformers' continuous batching manager is not accepting requests (stopping)")

    def cancel(self, request_id: str) -> None:
        """Cancel in the manager; its pages are freed by the manager's next step."""
        if self._requests.pop(request_id, None) is not None:
            self.manager.cancel_request(request_id)

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
                events = [EngineEvent(r, (), True, "error", f"the batching worker died: {fatal}")
                          for r in self._requests]
                self._requests.clear()
                self._restart()
                return events
            return []
        events = []
        for output in outputs:
            entry = self._requests.get(output.request_id)
            if entry is None:  # cancelled
                continue
            sent, budget, ignore_eos = entry
            tokens = list(output.generated_tokens)
            new = tuple(tokens[sent:])
            if output.error is not None:
                del self._requests[output.request_id]
                events.append(EngineEvent(output.request_id, new, True, "error", str(output.error)))
            elif output.is_finished():
                del self._requests[output.request_id]
                reason = "stop" if tokens and tokens[-1] in self.eos and not ignore_eos else "length"
                events.append(EngineEvent(output.request_id, new, True, reason))
            elif new:
                self._requests[output.request_id] = (len(tokens), budget, ignore_eos)
                events.append(EngineEvent(output.request_id, new))
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

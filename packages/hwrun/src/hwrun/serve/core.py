"""The engine core: the scheduling loop over a backend, in its own process (vLLM V1's shape) or, as a seam for
tests, in a thread of the server's process.

`CoreLoop.run()` takes requests, cancels and the shutdown from the front's channel between two steps, admits
waiting requests into free slots (`backend.free_slots()`), runs `backend.step()`, and sends every event of
that step to the front as one `Batch` message with its counters (running, waiting, free slots, steps, and the
slot engine's KV use where the backend reports it: `kv_stats()`). It
never waits on the front: sends are queued by ZeroMQ. Idle, it waits for the front's next message up to
`IDLE_WAIT` seconds and sends an empty batch (a heartbeat) at least every `HEARTBEAT` seconds, so the front
tells a hung step (no message for `--stall-seconds`) from an idle engine.

The engine process's entry point, which loads the model, is `hwrun.serve.core_process.run_process`; this module
imports no other part of the server (the front imports it for its in-thread core).
"""

from __future__ import annotations

import logging
import os
import pickle
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from .backend import GENERIC_FAILURE, MAX_STEP_FAILURES, START_PROGRESS, Backend, EngineRequest
from .ipc import AddRequest, Batch, Cancel, Channel, EventTuple, Failed, Progress, Ready, Shutdown
from .protocol import Sampling

logger = logging.getLogger(__name__)

#: Seconds the idle core waits for the front's next message before it looks again.
IDLE_WAIT = 0.25
#: Longest gap, in seconds, between two messages of a working core (an empty batch fills it).
HEARTBEAT = 0.5
#: Seconds the core's last messages may take to reach the front when it exits.
CLOSE_LINGER = 2.0

__all__ = ["CoreLoop", "request_of", "serve_core", "run_thread", "GENERIC_FAILURE"]


class CoreLoop:
    """Schedules the front's requests onto `backend`; one `Batch` per turn to `channel`."""

    def __init__(self, backend: Backend, channel: Channel, *, stall_seconds: float) -> None:
        self.backend = backend
        self.channel = channel
        self.stall_seconds = stall_seconds
        self.waiting: deque[EngineRequest] = deque()
        self.running: dict[str, float] = {}  # request id -> monotonic time of its last token (or admission)
        self.open: dict[str, set[int]] = {}  # request id -> its choices still decoding
        self.steps = 0
        self._out: list[EventTuple] = []
        self._sent = time.monotonic()
        self._stop = False

    def run(self) -> None:
        """Turns until the front says `Shutdown` (then cancels what is left and returns); raises when the
        backend fails `MAX_STEP_FAILURES` steps in a row."""
        failures = 0
        while True:
            idle = not self.running and not self.waiting
            self._take(self.channel.recv_ready() if not idle else self._wait_for_front())
            if self._stop:
                self._cancel_all()
                self._flush(force=True)
                return
            self._admit()
            if not self.running:
                self._flush(force=time.monotonic() - self._sent > HEARTBEAT)
                continue
            try:
                events = self.backend.step()
            except Exception as exc:
                failures += 1
                if failures >= MAX_STEP_FAILURES:
                    self._flush(force=True)
                    raise
                logger.exception("a %s step failed: the requests it was decoding fail, the engine goes on",
                                 self.backend.name)
                self._fail_running(f"{type(exc).__name__}: {exc}")
                self._flush(force=True)
                continue
            failures = 0
            self.steps += 1
            now = time.monotonic()
            for event in events:
                if event.request_id not in self.running:  # cancelled meanwhile
                    continue
                if event.finished:
                    self._close(event.request_id, event.index, event.finish_reason)
                elif event.token_ids:
                    self.running[event.request_id] = now
                self._emit(event.request_id, event.token_ids, event.finished, event.finish_reason, event.error,
                           event.index, event.logprobs)
            self._check_stalls(now)
            self._flush(force=now - self._sent > HEARTBEAT)

    # ------------------------------------------------------------------------------------------------ inputs

    def _wait_for_front(self) -> list[Any]:
        message = self.channel.recv(IDLE_WAIT)
        return [] if message is None else [message, *self.channel.recv_ready()]

    def _take(self, messages: list[Any]) -> None:
        for message in messages:
            if isinstance(message, AddRequest):
                self.waiting.append(request_of(message))
            elif isinstance(message, Cancel):
                for request_id in message.request_ids:
                    self._cancel(request_id)
            elif isinstance(message, Shutdown):
                self._stop = True

    def _cancel(self, request_id: str) -> None:
        for index, request in enumerate(self.waiting):
            if request.request_id == request_id:
                del self.waiting[index]
                self._emit(request_id, (), True, "cancelled", None)
                return
        if self.running.pop(request_id, None) is not None:
            self.open.pop(request_id, None)
            self.backend.cancel(request_id)
            self._emit(request_id, (), True, "cancelled", None)

    def _close(self, request_id: str, index: int, reason: str | None) -> None:
        """Choice `index` of `request_id` finished: the request leaves `running` with its last choice, or at once
        when the choice was cancelled or failed (its other choices are cancelled in the backend)."""
        left = self.open.get(request_id, set())
        left.discard(index)
        if left and reason in ("stop", "length"):
            return
        del self.running[request_id]
        self.open.pop(request_id, None)
        if left:
            self.backend.cancel(request_id)

    def _cancel_all(self) -> None:
        for request_id in [r.request_id for r in self.waiting] + list(self.running):
            self._cancel(request_id)

    # ------------------------------------------------------------------------------------------- scheduling

    def _admit(self) -> None:
        """Admit waiting requests in order while the backend has a free slot for each of their choices; one it
        refuses (`backend.refusal`) or that fails to start ends with an error event."""
        free = self.backend.free_slots()
        now = time.monotonic()
        refusal = getattr(self.backend, "refusal", None)
        while self.waiting:
            request = self.waiting[0]
            why = refusal(request) if refusal is not None else None
            if why is None and request.n > free:
                return
            self.waiting.popleft()
            if why is not None:
                logger.error("the %s backend refuses request %s: %s", self.backend.name, request.request_id, why)
                self._emit(request.request_id, (), True, "error", why)
                continue
            free -= request.n
            try:
                self.backend.add(request)
            except Exception as exc:  # noqa: BLE001 - this request's failure, not the engine's
                logger.exception("the %s backend refused request %s", self.backend.name, request.request_id)
                self._emit(request.request_id, (), True, "error", f"{type(exc).__name__}: {exc}")
                continue
            self.running[request.request_id] = now
            self.open[request.request_id] = set(range(request.n))

    def _fail_running(self, error: str) -> None:
        """Fail every running request (a step raised): error events, their slots freed."""
        for request_id in list(self.running):
            del self.running[request_id]
            self.open.pop(request_id, None)
            try:
                self.backend.cancel(request_id)
            except Exception:  # noqa: BLE001 - freeing a failed request's slot is best effort
                logger.exception("cancelling failed request %s", request_id)
            self._emit(request_id, (), True, "error", error)

    def _check_stalls(self, now: float) -> None:
        """Fail running requests that got no token for `stall_seconds` (the backend lost them)."""
        for request_id in [r for r, t in self.running.items() if now - t > self.stall_seconds]:
            logger.error("request %s got no token for %.0f s (--stall-seconds): it fails", request_id,
                         self.stall_seconds)
            del self.running[request_id]
            self.open.pop(request_id, None)
            try:
                self.backend.cancel(request_id)
            except Exception:  # noqa: BLE001
                logger.exception("cancelling stalled request %s", request_id)
            self._emit(request_id, (), True, "error", f"no token for {self.stall_seconds:.0f} s (stalled)")

    # ------------------------------------------------------------------------------------------------ output

    def _emit(self, request_id: str, tokens: Any, finished: bool, reason: str | None, error: str | None,
              index: int = 0, logprobs: Any = None) -> None:
        lps = None if logprobs is None else [(float(t.logprob), [(int(i), float(v)) for i, v in t.top])
                                             for t in logprobs]
        self._out.append((request_id, [int(t) for t in tokens], bool(finished), reason, error, int(index), lps))

    def _flush(self, *, force: bool) -> None:
        """Send this turn's events as one batch (or an empty one when `force`: the heartbeat)."""
        if not self._out and not force:
            return
        events, self._out = self._out, []
        stats = getattr(self.backend, "kv_stats", None)
        self.channel.send(Batch(events, len(self.running), len(self.waiting), int(self.backend.free_slots()),
                                self.steps, None if stats is None else stats()))
        self._sent = time.monotonic()


def request_of(message: AddRequest) -> EngineRequest:
    """The `EngineRequest` an `AddRequest` message carries (`hwrun.serve.engine.add_message` made it)."""
    structured = None
    if message.structured is not None:
        from ..inference.structured import StructuredOutput

        structured = StructuredOutput(*message.structured)
    sampling = Sampling(temperature=message.temperature, top_p=message.top_p, top_k=message.top_k, seed=message.seed,
                        min_p=message.min_p, presence_penalty=message.presence_penalty,
                        frequency_penalty=message.frequency_penalty, repetition_penalty=message.repetition_penalty,
                        logit_bias=tuple((int(t), float(b)) for t, b in message.logit_bias), logprobs=message.logprobs,
                        structured=structured)
    return EngineRequest(message.request_id, tuple(message.input_ids), message.max_new_tokens, sampling,
                         message.ignore_eos, n=message.n, stop_token_ids=tuple(message.stop_token_ids),
                         adapter=message.adapter)


def serve_core(build: Callable[[], tuple[Backend, dict[str, Any], bytes]], channel: Channel,
               stall_seconds: float) -> None:
    """Build the backend (its start's progress lines, `START_PROGRESS`, go to the front as `Progress`), say `Ready`,
    run the loop until `Shutdown`; on any failure say `Failed` (the exception pickled when it can be) and return.
    Closes the backend."""
    backend: Backend | None = None
    ready = False
    try:
        said = START_PROGRESS.set(lambda text: channel.send(Progress(text)))
        try:
            backend, info, tokenizer = build()
        finally:
            START_PROGRESS.reset(said)
        # the counters come with Ready: the front knows the free slots before the first step's batch
        info = {**info, "free_slots": int(backend.free_slots())}
        channel.send(Ready(info, tokenizer, os.getpid()))
        ready = True
        CoreLoop(backend, channel, stall_seconds=stall_seconds).run()
    except BaseException as exc:  # noqa: BLE001 - reported to the front, which fails its requests with it
        if ready:
            logger.exception("the engine stopped at runtime")
        try:
            error = pickle.dumps(exc)
        except Exception:  # noqa: BLE001 - an exception that does not pickle goes as its text
            error = b""
        channel.send(Failed(f"{type(exc).__name__}: {exc}", error, ready))
    finally:
        if backend is not None:
            try:
                backend.close()
            except Exception:  # noqa: BLE001 - closing is best effort at shutdown
                logger.exception("closing the %s backend failed", getattr(backend, "name", "?"))


def run_thread(factory: Callable[[], tuple[Backend, dict[str, Any]]], addresses: tuple[str, str],
               stall_seconds: float) -> threading.Thread:
    """The core in a thread of this process (the test seam: a loader that returns any backend)."""
    def target() -> None:
        channel = Channel.connect(addresses)
        try:
            serve_core(lambda: (*factory(), b""), channel, stall_seconds)
        finally:
            channel.close(linger=CLOSE_LINGER)

    thread = threading.Thread(target=target, name="hwrun-serve-core", daemon=True)
    thread.start()
    return thread

"""The serving engine: a backend-neutral scheduler over live requests, run in one worker thread.

A `Backend` decodes; the `Engine` schedules. Between two `backend.step()` calls the worker cancels what
clients dropped, admits waiting requests into free slots (`backend.free_slots()`), and hands each
step's tokens to the asyncio loop with `loop.call_soon_threadsafe` (torch work never runs on the event
loop). Requests join and leave the running batch between steps: continuous batching of live traffic.

Backends (`choose_engine` picks one and says why):
- `slots` (`hwrun.serve.backend_slots`): hwrun's slot decoder over a static cache, one graph replay per
  step where the platform has CUDA or XPU graphs (its step API: add / step / cancel).
- `transformers` (`hwrun.serve.backend_transformers`): Transformers' continuous-batching manager
  (`model.init_continuous_batching`, the engine `transformers serve` uses), for every model and device it
  runs and hwrun's slot decoder does not.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from .protocol import Sampling

logger = logging.getLogger(__name__)

#: Finish reasons an engine reports: EOS ("stop"), the token budget ("length"), or the request ended early.
FINISH_REASONS = ("stop", "length", "cancelled", "error")
#: Seconds the idle worker sleeps before it looks again (a new request wakes it at once).
IDLE_WAIT = 0.5
#: Seconds a running request may go without a token before the engine fails it (`--stall-seconds`), and
#: seconds without a finished step, while requests run, after which `/health` answers 503.
DEFAULT_STALL_SECONDS = 120.0
#: Failed steps in a row after which the engine itself fails (a backend that fails every step is broken).
MAX_STEP_FAILURES = 3
#: What a client is told when its request fails inside the engine (the details go to the server log).
GENERIC_FAILURE = "generation failed inside the engine; the server log has the details"


@dataclass(frozen=True)
class EngineRequest:
    """One request as a backend sees it: prompt token ids, its token budget and sampling; `ignore_eos` decodes the
    whole budget (the model's EOS does not end it)."""

    request_id: str
    input_ids: tuple[int, ...]
    max_new_tokens: int
    sampling: Sampling = field(default_factory=Sampling)
    ignore_eos: bool = False


@dataclass(frozen=True)
class EngineEvent:
    """New tokens of one request; `finished` with a `finish_reason` (one of `FINISH_REASONS`) on its last event."""

    request_id: str
    token_ids: tuple[int, ...] = ()
    finished: bool = False
    finish_reason: str | None = None
    error: str | None = None


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

    def close(self) -> None:
        """Stop decoding and release the model's buffers."""


class QueueFullError(Exception):
    """The engine's running slots and waiting queue are full (the server answers 429)."""


class EngineNotReady(Exception):
    """The engine is still loading or warming, is draining, or failed (the server answers 503)."""


Sink = Callable[[EngineEvent], None]


class Engine:
    """Schedules live requests onto a backend built by `factory()` in the worker thread (it loads and warms the
    model there, so the server can answer `/health` with 503 meanwhile)."""

    def __init__(self, factory: Callable[[], Backend], *, max_concurrency: int, max_queue: int,
                 stall_seconds: float = DEFAULT_STALL_SECONDS) -> None:
        self.factory = factory
        self.stall_seconds = stall_seconds
        self.max_concurrency = max_concurrency
        self.max_queue = max_queue
        self.state = "new"  # new -> loading -> ready -> draining -> stopped | failed
        self.error: BaseException | None = None
        self.backend: Backend | None = None
        self._cond = threading.Condition()
        self._waiting: deque[tuple[EngineRequest, Sink]] = deque()
        self._running: dict[str, Sink] = {}
        self._cancels: list[str] = []
        self._stop = False
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.on_ready: Callable[[], None] | None = None
        self.on_failed: Callable[[BaseException], None] | None = None
        self.steps = 0
        self.was_ready = False  # True once it took requests: a later failure is a runtime one, not a start's
        self._progress: dict[str, float] = {}  # running request -> monotonic time of its last token (or admission)
        self._beat = time.monotonic()  # the worker's last turn (idle waits and finished steps)

    # ------------------------------------------------------------------------------------ event-loop side

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start the worker thread; events are delivered on `loop`."""
        self._loop = loop
        self.state = "loading"
        self._thread = threading.Thread(target=self._run, name="hwrun-serve-engine", daemon=True)
        self._thread.start()

    @property
    def ready(self) -> bool:
        """Whether requests are taken (warmed up, not draining or failed)."""
        return self.state == "ready"

    @property
    def stalled(self) -> bool:
        """Whether requests are waiting or running but the worker has not finished a turn for `stall_seconds`
        (a step that hangs); `/health` answers 503 then."""
        busy = bool(self._running or self._waiting)
        return self.state == "ready" and busy and time.monotonic() - self._beat > self.stall_seconds

    @property
    def queue_depth(self) -> int:
        """Requests waiting for a slot."""
        return len(self._waiting)

    @property
    def running(self) -> int:
        """Requests being decoded."""
        return len(self._running)

    def submit(self, request: EngineRequest, sink: Sink) -> None:
        """Queue `request`; `sink(event)` is called on the loop for each of its events. Raises `EngineNotReady`
        or `QueueFullError` (the caller answers 503 or 429)."""
        with self._cond:
            if self.state != "ready":
                raise EngineNotReady(self.state)
            if len(self._running) + len(self._waiting) >= self.max_concurrency + self.max_queue:
                raise QueueFullError(f"{len(self._running)} running and {len(self._waiting)} waiting")
            self._waiting.append((request, sink))
            self._cond.notify()

    def cancel(self, request_id: str) -> None:
        """Drop `request_id` (waiting or running) at the worker's next turn; safe to call twice or too late."""
        with self._cond:
            self._cancels.append(request_id)
            self._cond.notify()

    def drain(self) -> None:
        """Take no new requests; those queued or running finish (SIGTERM's first step)."""
        with self._cond:
            if self.state == "ready":
                self.state = "draining"

    def stop(self, timeout: float = 10.0) -> None:
        """Cancel whatever still runs, stop the worker and close the backend (waits up to `timeout` seconds)."""
        with self._cond:
            self._stop = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                logger.warning("the engine worker did not stop within %.0f s", timeout)

    # ---------------------------------------------------------------------------------------- worker side

    def _run(self) -> None:
        try:
            self.backend = self.factory()
        except BaseException as exc:  # noqa: BLE001 - reported to the server, which exits with it
            self._fail(exc)
            return
        with self._cond:
            if self._stop:
                self._close()
                return
            self.state = "ready"
            self.was_ready = True
            self._beat = time.monotonic()
        if self.on_ready is not None:
            self._call_on_loop(self.on_ready)
        try:
            self._loop_body()
        except BaseException as exc:  # noqa: BLE001
            logger.exception("the engine stopped at runtime")
            self._fail(exc)
            return
        self._close()

    def _loop_body(self) -> None:
        backend = self.backend
        if backend is None:
            raise RuntimeError("the engine's worker has no backend (it was closed)")
        failures = 0
        while True:
            with self._cond:
                for request_id in self._cancels:
                    self._cancel_locked(backend, request_id)
                self._cancels.clear()
                if self._stop:
                    for request_id in [r.request_id for r, _ in self._waiting] + list(self._running):
                        self._cancel_locked(backend, request_id)
                admit = []
                free = backend.free_slots()
                now = time.monotonic()
                while self._waiting and len(admit) < free:
                    request, sink = self._waiting.popleft()
                    self._running[request.request_id] = sink
                    self._progress[request.request_id] = now
                    admit.append(request)
                self._beat = now
                if not self._running:
                    if self._stop:
                        return
                    self._cond.wait(IDLE_WAIT)
                    continue
            failed = []
            for request in admit:
                try:
                    backend.add(request)
                except Exception as exc:  # noqa: BLE001 - this request's failure, not the engine's
                    logger.exception("the %s backend refused request %s", backend.name, request.request_id)
                    failed.append(EngineEvent(request.request_id, finished=True, finish_reason="error",
                                              error=f"{type(exc).__name__}: {exc}"))
            self._deliver(failed)
            try:
                events = backend.step()
            except Exception as exc:
                failures += 1
                if failures >= MAX_STEP_FAILURES:
                    raise
                logger.exception("a %s step failed: the requests it was decoding fail, the engine goes on",
                                 backend.name)
                self._fail_running(backend, f"{type(exc).__name__}: {exc}")
                continue
            failures = 0
            self._deliver(events)
            self.steps += 1
            self._check_stalls(backend)

    def _fail_running(self, backend: Backend, error: str) -> None:
        """Fail every running request (a step raised): error events to their clients, their slots freed."""
        with self._cond:
            running = list(self._running.items())
            self._running.clear()
            for request_id, _ in running:
                self._progress.pop(request_id, None)
        for request_id, sink in running:
            try:
                backend.cancel(request_id)
            except Exception:  # noqa: BLE001 - freeing a failed request's slot is best effort
                logger.exception("cancelling failed request %s", request_id)
            self._call_on_loop(sink, EngineEvent(request_id, finished=True, finish_reason="error", error=error))

    def _check_stalls(self, backend: Backend) -> None:
        """Fail running requests that got no token for `stall_seconds` (the backend lost them)."""
        now = time.monotonic()
        with self._cond:
            self._beat = now
            stalled = [r for r, t in self._progress.items() if now - t > self.stall_seconds]
            sinks = [(r, self._running.pop(r)) for r in stalled if r in self._running]
            for request_id in stalled:
                self._progress.pop(request_id, None)
        for request_id, sink in sinks:
            logger.error("request %s got no token for %.0f s (--stall-seconds): it fails", request_id,
                         self.stall_seconds)
            try:
                backend.cancel(request_id)
            except Exception:  # noqa: BLE001
                logger.exception("cancelling stalled request %s", request_id)
            self._call_on_loop(sink, EngineEvent(request_id, finished=True, finish_reason="error",
                                                 error=f"no token for {self.stall_seconds:.0f} s (stalled)"))

    def _cancel_locked(self, backend: Backend, request_id: str) -> None:
        for index, (request, sink) in enumerate(self._waiting):
            if request.request_id == request_id:
                del self._waiting[index]
                self._call_on_loop(sink, EngineEvent(request_id, finished=True, finish_reason="cancelled"))
                return
        sink = self._running.pop(request_id, None)
        self._progress.pop(request_id, None)
        if sink is not None:
            backend.cancel(request_id)
            self._call_on_loop(sink, EngineEvent(request_id, finished=True, finish_reason="cancelled"))

    def _deliver(self, events: list[EngineEvent]) -> None:
        """Hand `events` to their requests' sinks on the loop (one wake-up per step)."""
        if not events:
            return
        batch = []
        with self._cond:
            for event in events:
                sink = self._running.get(event.request_id)
                if sink is None:  # cancelled meanwhile
                    continue
                if event.finished:
                    del self._running[event.request_id]
                    self._progress.pop(event.request_id, None)
                elif event.token_ids:
                    self._progress[event.request_id] = time.monotonic()
                batch.append((sink, event))
            self._cond.notify()
        if batch:
            self._call_on_loop(_deliver_all, batch)

    def _call_on_loop(self, function: Callable[..., Any], *args: Any) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            loop.call_soon_threadsafe(function, *args)
        except RuntimeError:  # the loop closed meanwhile (server shut down)
            pass

    def _fail(self, exc: BaseException) -> None:
        with self._cond:
            self.state, self.error = "failed", exc
            pending = [sink for _, sink in self._waiting] + list(self._running.values())
            ids = [r.request_id for r, _ in self._waiting] + list(self._running)
            self._waiting.clear()
            self._running.clear()
            self._progress.clear()
        for request_id, sink in zip(ids, pending, strict=True):
            self._call_on_loop(sink, EngineEvent(request_id, finished=True, finish_reason="error",
                                                 error=f"{type(exc).__name__}: {exc}"))
        if self.on_failed is not None:
            self._call_on_loop(self.on_failed, exc)
        self._close()

    def _close(self) -> None:
        backend, self.backend = self.backend, None
        if self.state != "failed":
            self.state = "stopped"
        if backend is not None:
            try:
                backend.close()
            except Exception:  # noqa: BLE001 - closing is best effort at shutdown
                logger.exception("closing the %s backend failed", getattr(backend, "name", "?"))


def _deliver_all(batch: list[tuple[Sink, EngineEvent]]) -> None:
    for sink, event in batch:
        sink(event)


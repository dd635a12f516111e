"""The serving engine as the HTTP front sees it: `Engine` submits requests to the engine core and hands each
request's tokens, already turned into text, to its sink on the event loop.

The engine core (`hwrun.serve.core`: the scheduler loop over a `Backend`) runs in its own process
(`hwrun.serve.core_process`), started with `python -c` bootstrap code (no shell, no spawn re-import of the caller's
`__main__`), or, as a seam for tests that bring their own backend, in a thread of this process; the two sides talk
over ZeroMQ sockets (`hwrun.serve.ipc`). A reader thread of the front receives each step's batch of events,
detokenizes them incrementally (`hwrun.serve.text`: tokenizers' `DecodeStream` where the tokenizer is fast) and
wakes the event loop once per batch (`loop.call_soon_threadsafe`): neither torch nor detokenization runs on the
loop, and the engine never waits for the front. The front keeps the admission limits (a full server answers 429
at once), learns the core's counters from its batches, and watches it: a core that dies (or stops on an
error) fails every request in flight with an error event, and `/health` answers 503.

Backends (`hwrun.inference.decision.decide_serving` picks one and says why, asked at start-up through
`hwrun.serve.startup.decide_engine`):
- `slots` (`hwrun.serve.backend_slots`): hwrun's engine (`hwrun.inference.engine.EngineCore`) over KV blocks,
  one graph replay per step where the platform has CUDA, XPU or HPU graphs (its step API: add / step / cancel).
- `transformers` (`hwrun.serve.backend_transformers`): Transformers' continuous-batching manager
  (`model.init_continuous_batching`, the engine `transformers serve` uses), for every model and device it
  runs and hwrun's engine does not.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from .backend import (
    FINISH_REASONS,
    GENERIC_FAILURE,
    MAX_STEP_FAILURES,
    Backend,
    EngineChoice,
    EngineEvent,
    EngineRequest,
    TokenLogprob,
)

if TYPE_CHECKING:
    from ..model.plan import RunPlan
    from .config import ServeConfig
    from .ipc import Batch, Channel, Ready

logger = logging.getLogger(__name__)

#: The front's names, and the shared types it re-exports (they live in `hwrun.serve.backend`, which the core imports).
__all__ = ["FINISH_REASONS", "GENERIC_FAILURE", "MAX_STEP_FAILURES", "Backend", "EngineChoice", "EngineEvent",
           "EngineRequest", "TokenLogprob", "Engine", "EngineDied", "EngineNotReady", "QueueFullError", "add_message"]
#: Seconds the front's reader waits for a message before it checks that the core still lives.
POLL_SECONDS = 0.1
#: Seconds `stop()` waits for the core to exit after `Shutdown`, then after SIGTERM, before SIGKILL.
STOP_WAIT = (10.0, 5.0)
#: Seconds a running request may go without a token before the engine fails it (`--stall-seconds`), and
#: seconds without a finished step, while requests run, after which `/health` answers 503.
DEFAULT_STALL_SECONDS = 120.0


class QueueFullError(Exception):
    """The engine's running slots and waiting queue are full (the server answers 429)."""


class EngineNotReady(Exception):
    """The engine is still loading or warming, is draining, or failed (the server answers 503)."""


class EngineDied(RuntimeError):
    """The engine process exited without saying why (killed, out of memory, a crash in native code)."""


Sink = Callable[[EngineEvent], None]


class Engine:
    """The front's handle on the engine core. `process=(plan, config)` runs the core in its own process (what
    `hwrun serve` does); else `factory()` builds a backend for a core in a thread of this process (tests).
    `on_loaded(ready)` runs on the reader thread when the core is ready, before any request is taken (the server
    reads the load's facts and the tokenizer there, and sets `detokenizer`)."""

    def __init__(self, factory: Callable[[], Backend] | None = None, *, max_concurrency: int, max_queue: int,
                 stall_seconds: float = DEFAULT_STALL_SECONDS,
                 process: tuple[RunPlan, ServeConfig] | None = None) -> None:
        if (factory is None) == (process is None):
            raise ValueError("give the Engine either a backend factory (in-process core) or process=(plan, config)")
        self.factory = factory
        self.process_args = process
        self.stall_seconds = stall_seconds
        self.max_concurrency = max_concurrency
        self.max_queue = max_queue
        self.state = "new"  # new -> loading -> ready -> draining -> stopped | failed
        self.error: BaseException | None = None
        self.was_ready = False  # True once it took requests: a later failure is a runtime one, not a start's
        self.on_loaded: Callable[[Ready], None] | None = None
        self.on_ready: Callable[[], None] | None = None
        self.on_failed: Callable[[BaseException], None] | None = None
        #: Told each line of the core's start (`Progress`: the warm-up's buckets), on the reader thread, before Ready.
        self.on_progress: Callable[[str], None] | None = None
        #: Makes one request's incremental detokenizer (set by the server once the tokenizer is known; None:
        #: events go out with `text=None`, as the backend gave them).
        self.detokenizer: Callable[[], Any] | None = None
        self.core_pid: int | None = None  # the engine process, once started (None: a thread of this process)
        self.steps = 0
        self.free_slots = 0
        self.kv_stats: list[int] | None = None  # the core's KV use (`KVStats.as_list`), as its last batch said
        self._running = 0
        self._waiting = 0
        self._sinks: dict[str, Sink] = {}  # requests in flight (touched on the event loop only)
        self._open: dict[str, int] = {}  # their choices not finished yet (event loop only)
        self._detoks: dict[tuple[str, int], Any] = {}  # a detokenizer per choice (reader thread only)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._channel: Channel | None = None
        self._send_lock = threading.Lock()
        self._child: subprocess.Popen | None = None
        self._core_thread: threading.Thread | None = None
        self._reader: threading.Thread | None = None
        self._closing = False  # the reader thread ends
        self._stopping = False  # stop() asked the core to exit
        self._beat = time.monotonic()  # the core's last message

    @property
    def mode(self) -> str:
        """"process" (the core in its own process) or "thread" (in this process)."""
        return "process" if self.process_args is not None else "thread"

    # ------------------------------------------------------------------------------------ event-loop side

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start the core (process or thread) and the reader; events are delivered on `loop`."""
        from .ipc import Channel

        self._loop = loop
        self.state = "loading"
        self._channel = Channel.bind()
        try:
            if self.process_args is not None:
                self._child = _spawn_core(self._channel.addresses, *self.process_args)
                self.core_pid = self._child.pid
            else:
                from .core import run_thread  # the core imports no front module: no circle

                factory = self.factory
                assert factory is not None
                self._core_thread = run_thread(lambda: (factory(), {}), self._channel.addresses,
                                               self.stall_seconds)
        except BaseException:
            self._channel.close()
            self._channel = None
            raise
        self._reader = threading.Thread(target=self._read, name="hwrun-serve-reader", daemon=True)
        self._reader.start()

    @property
    def ready(self) -> bool:
        """Whether requests are taken (warmed up, not draining or failed)."""
        return self.state == "ready"

    @property
    def stalled(self) -> bool:
        """Whether requests are in flight but the core has sent nothing for `stall_seconds` (a step that hangs;
        a working core sends at least a heartbeat every half second); `/health` answers 503 then."""
        return (self.state == "ready" and bool(self._sinks)
                and time.monotonic() - self._beat > self.stall_seconds)

    @property
    def queue_depth(self) -> int:
        """Requests waiting for a slot (as the core last said, plus those sent since)."""
        return self._waiting

    @property
    def running(self) -> int:
        """Requests being decoded (as the core last said)."""
        return self._running

    @property
    def in_flight(self) -> int:
        """Requests submitted and not finished, as the front counts them."""
        return len(self._sinks)

    def submit(self, request: EngineRequest, sink: Sink) -> None:
        """Send `request` to the core; `sink(event)` is called on the loop for each of its events. Raises
        `EngineNotReady` or `QueueFullError` (the caller answers 503 or 429). Call it on the event loop."""

        if self.state != "ready":
            raise EngineNotReady(self.state)
        if len(self._sinks) >= self.max_concurrency + self.max_queue:
            raise QueueFullError(f"{len(self._sinks)} requests running or waiting")
        self._sinks[request.request_id] = sink
        self._open[request.request_id] = request.n
        self._send(add_message(request))

    def cancel(self, request_id: str) -> None:
        """Drop `request_id` (waiting or running) at the core's next turn; safe to call twice or too late."""
        from .ipc import Cancel

        if self.state in ("loading", "ready", "draining"):
            self._send(Cancel([request_id]))

    def drain(self) -> None:
        """Take no new requests; those queued or running finish (SIGTERM's first step)."""
        if self.state == "ready":
            self.state = "draining"

    def stop(self, timeout: float = STOP_WAIT[0]) -> None:
        """Tell the core to cancel what runs and exit; wait up to `timeout` seconds, then end the process
        (SIGTERM, then SIGKILL): no engine process outlives the server. Safe to call twice."""
        from .ipc import Shutdown

        self._stopping = True  # the core's exit from here on is the one asked for, not a death
        self._send(Shutdown())
        child, thread = self._child, self._core_thread
        if child is not None:
            _end_process(child, timeout)
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():
                logger.warning("the engine core thread did not stop within %.0f s", timeout)
        self._closing = True
        if self._reader is not None and self._reader is not threading.current_thread():
            self._reader.join(timeout)
        if self.state != "failed":
            self.state = "stopped"
        channel, self._channel = self._channel, None
        if channel is not None:
            channel.close()

    def kill_core(self) -> None:
        """SIGKILL the engine process (tests: a crash mid-stream)."""
        if self._child is not None:
            self._child.send_signal(signal.SIGKILL)

    def _send(self, message: Any) -> None:
        with self._send_lock:
            if self._channel is not None:
                self._channel.send(message)

    # ---------------------------------------------------------------------------------------- reader side

    def _read(self) -> None:
        """The reader thread: the core's messages until it stops (or the front closes)."""
        channel = self._channel
        assert channel is not None
        while not self._closing:
            try:
                message = channel.recv(POLL_SECONDS)
            except Exception:  # noqa: BLE001 - the channel closed under us (stopping)
                if self._closing:
                    return
                raise
            if message is not None:
                if not self._handle(message):
                    return
                continue
            if not self._core_alive():
                for message in channel.recv_ready():  # what it sent before it ended
                    if not self._handle(message):
                        return
                if not self._stopping and self.state in ("loading", "ready", "draining"):
                    self._fail(EngineDied(self._death_note()))
                return

    def _handle(self, message: Any) -> bool:
        """One message of the core; False once it said it failed (nothing more comes)."""
        from .ipc import Batch, Failed, Progress, Ready

        self._beat = time.monotonic()
        if isinstance(message, Batch):
            self._on_batch(message)
        elif isinstance(message, Progress):
            if self.on_progress is not None:
                self.on_progress(message.text)
        elif isinstance(message, Ready):
            self._on_ready(message)
        elif isinstance(message, Failed):
            self._fail(_exception_of(message), was_ready=message.was_ready)
            return False
        return True

    def _core_alive(self) -> bool:
        if self._child is not None:
            return self._child.poll() is None
        return self._core_thread is not None and self._core_thread.is_alive()

    def _death_note(self) -> str:
        child = self._child
        if child is None:
            return "the engine core thread ended without a word"
        code = child.poll()
        how = f"exit status {code}"
        if code is not None and code < 0:
            try:
                how = f"signal {-code} ({signal.Signals(-code).name})"
            except ValueError:
                how = f"signal {-code}"
        return f"the engine process (pid {child.pid}) died: {how}"

    def _on_ready(self, message: Ready) -> None:
        if self.process_args is not None:
            self.core_pid = message.pid
        self.free_slots = int(message.info.get("free_slots", 0))
        try:
            if self.on_loaded is not None:
                self.on_loaded(message)
        except BaseException as exc:  # noqa: BLE001 - the front cannot serve what the core loaded
            logger.exception("the engine core is up, but the server could not take its load")
            self._fail(exc)
            return
        if self.state == "loading":
            self.state = "ready"
            self.was_ready = True
        if self.on_ready is not None:
            self._call_on_loop(self.on_ready)

    def _on_batch(self, batch: Batch) -> None:
        self._running, self._waiting, self.free_slots, self.steps = (batch.running, batch.waiting,
                                                                      batch.free_slots, batch.steps)
        if batch.kv is not None:
            self.kv_stats = batch.kv
        if not batch.events:
            return
        make = self.detokenizer
        events = []
        for request_id, tokens, finished, reason, error, index, logprobs in batch.events:
            text = None
            if make is not None:
                key = (request_id, index)
                detok = self._detoks.get(key)
                if detok is None:
                    detok = self._detoks[key] = make()
                text = detok.push(tokens) if tokens else ""
                if finished:
                    del self._detoks[key]
                    if reason in ("stop", "length"):
                        text += detok.flush()
                    else:  # the whole request ends: its other choices' detokenizers go too
                        for other in [k for k in self._detoks if k[0] == request_id]:
                            del self._detoks[other]
            lps = None if logprobs is None else tuple(TokenLogprob(float(lp), tuple((int(t), float(v)) for t, v in top))
                                                      for lp, top in logprobs)
            events.append(EngineEvent(request_id, tuple(tokens), finished, reason, error, text, index, lps))
        self._call_on_loop(self._dispatch, events)

    def _dispatch(self, events: list[EngineEvent]) -> None:
        """On the loop: each event to its request's sink (one wake-up per batch). A request's sink goes once every
        choice finished ("stop" / "length"), or at once when one was cancelled or failed (the whole request ends)."""
        sinks = self._sinks
        for event in events:
            sink = sinks.get(event.request_id)
            if sink is None:
                continue
            if event.finished:
                left = self._open.get(event.request_id, 1) - 1
                if left <= 0 or event.finish_reason not in ("stop", "length"):
                    sinks.pop(event.request_id, None)
                    self._open.pop(event.request_id, None)
                else:
                    self._open[event.request_id] = left
            sink(event)

    def _fail(self, exc: BaseException, *, was_ready: bool | None = None) -> None:
        """The core failed (said so, or died): every request in flight gets an error event, then `on_failed`."""
        if self.state == "failed":
            return
        self.state, self.error = "failed", exc
        if was_ready is not None:
            self.was_ready = was_ready
        self._detoks.clear()
        text = f"{type(exc).__name__}: {exc}"
        self._call_on_loop(self._fail_all, text)
        if self.on_failed is not None:
            self._call_on_loop(self.on_failed, exc)

    def _fail_all(self, error: str) -> None:
        sinks, self._sinks, self._open = self._sinks, {}, {}
        self._running = self._waiting = 0
        for request_id, sink in sinks.items():
            sink(EngineEvent(request_id, (), True, "error", error, ""))

    def _call_on_loop(self, function: Callable[..., Any], *args: Any) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            loop.call_soon_threadsafe(function, *args)
        except RuntimeError:  # the loop closed meanwhile (server shut down)
            pass


def add_message(request: EngineRequest) -> Any:
    """`request` as the `AddRequest` message the core reads (`hwrun.serve.core.request_of` turns it back)."""
    from .ipc import AddRequest

    s = request.sampling
    structured = None if s.structured is None else (s.structured.kind, s.structured.schema)
    return AddRequest(request.request_id, list(request.input_ids), request.max_new_tokens, float(s.temperature),
                      float(s.top_p), int(s.top_k), s.seed, request.ignore_eos, float(s.min_p),
                      float(s.presence_penalty), float(s.frequency_penalty), float(s.repetition_penalty),
                      [(int(t), float(b)) for t, b in s.logit_bias], s.logprobs, structured, int(request.n),
                      [int(t) for t in request.stop_token_ids], request.adapter)


#: What the engine process runs first: the payload (sys.path, then run_process's arguments) is read from stdin.
_BOOTSTRAP = ("import pickle, sys; payload = pickle.load(sys.stdin.buffer); sys.path[:] = payload['path']; "
              "from hwrun.serve.core_process import run_process; run_process(**payload['args'])")


def _spawn_core(addresses: tuple[str, str], plan: RunPlan, config: ServeConfig) -> subprocess.Popen:
    """Start the engine process: this Python, bootstrap code, no shell; its own session (Ctrl-C reaches the
    front, which drains and then stops it); the plan and settings pickled on its stdin (the API key left out)."""
    payload = {"path": list(sys.path), "args": {
        "addresses": addresses, "plan": plan, "config": replace(config, api_key=None, api_key_env=None),
        "log_level": logging.getLogger().getEffectiveLevel(), "parent": os.getpid()}}
    child = subprocess.Popen([sys.executable, "-c", _BOOTSTRAP], stdin=subprocess.PIPE, start_new_session=True)
    assert child.stdin is not None
    try:
        child.stdin.write(pickle.dumps(payload))
        child.stdin.close()
    except BaseException:
        child.kill()
        child.wait(10)
        raise
    return child


def _end_process(child: subprocess.Popen, timeout: float) -> None:
    """Wait for `child` to exit; past `timeout` SIGTERM it, then SIGKILL it."""
    try:
        child.wait(timeout)
        return
    except subprocess.TimeoutExpired:
        logger.warning("the engine process (pid %d) did not exit within %.0f s: SIGTERM", child.pid, timeout)
    child.terminate()
    try:
        child.wait(STOP_WAIT[1])
    except subprocess.TimeoutExpired:
        logger.warning("the engine process (pid %d) ignored SIGTERM: SIGKILL", child.pid)
        child.kill()
        child.wait(STOP_WAIT[1])


def _exception_of(message: Any) -> BaseException:
    """The core's exception (unpickled) or, when it did not pickle, a RuntimeError with its text."""
    if message.error:
        try:
            exc = pickle.loads(message.error)
            if isinstance(exc, BaseException):
                return exc
        except Exception:  # noqa: BLE001 - an exception class this process cannot import
            pass
    return RuntimeError(message.text)

"""Run the app under uvicorn: bind the port first, start the engine process with the app, drain on SIGTERM, exit 0.

The listening socket is bound before anything else (a busy port is a one-line error at once); the app's
lifespan starts the engine (its core in its own process, `hwrun.serve.engine.Engine`) and stops it at the end.
Connections that do not finish their request headers within `HEADER_TIMEOUT` seconds are closed.

SIGTERM (or Ctrl-C): uvicorn stops accepting connections; the engine takes no new requests (503
`shutting_down`) and finishes the ones queued or running; `--grace-seconds` after the signal the server
ends what is still running itself (a stream with an error event, code `shutting_down`, and `data: [DONE]`;
a whole answer with a 503) and cancels it in the engine; uvicorn, whose own limit is `CUT_MARGIN` seconds
later, then finds every response finished (before, it cancelled the streams mid-chunk); the app's shutdown
stops the engine, and `serve()` returns 0. uvicorn re-raises a caught signal after its own shutdown
(`Server.capture_signals`), which for SIGTERM would end the process with -15 instead of 0: `_Server`
catches the signals without re-raising them.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any

from ..errors import EngineStartError, HwrunError, ServeConfigError
from .state import ServeState

if TYPE_CHECKING:
    from ..model.plan import RunPlan
    from .config import ServeConfig

#: Signals that start the drain.
DRAIN_SIGNALS = (signal.SIGINT, signal.SIGTERM)
#: Seconds uvicorn waits past `--grace-seconds` before it cancels responses: the server ends its requests at
#: `--grace-seconds` (an error event and `[DONE]`), and their last bytes go out within this margin.
CUT_MARGIN = 2.0


def _server_class() -> type:
    import uvicorn

    class _Server(uvicorn.Server):
        """uvicorn's server: the engine drains when a signal arrives, and the signal is not re-raised after."""

        state: ServeState

        def handle_exit(self, sig: int, frame: Any) -> None:
            self.state.engine.drain()
            schedule_cut(self.state)
            super().handle_exit(sig, frame)

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            originals = {sig: signal.signal(sig, self.handle_exit) for sig in DRAIN_SIGNALS}
            try:
                yield
            finally:
                for sig, handler in originals.items():
                    signal.signal(sig, handler)

        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets)
            if self.started and self.servers:
                host, port = self.servers[0].sockets[0].getsockname()[:2]
                self.state.port = port
                self.state.say(f"listening on http://{_url_host(host)}:{port} (GET /health is 503 until the "
                               "model is loaded and warm)")

    return _Server


def schedule_cut(state: ServeState) -> None:
    """`--grace-seconds` from now, end every request still in flight (once per server; any thread may call it)."""
    loop = state.loop
    if loop is None or loop.is_closed() or state.cut_scheduled:
        return
    state.cut_scheduled = True
    grace = float(state.config.grace_seconds)

    def cut() -> None:
        count = state.end_runs(f"the server is shutting down and this request was still running {grace:g} s after "
                               "the shutdown began (--grace-seconds): it ends here; send it again to another server.")
        if count:
            state.say(f"grace period over: {count} request(s) still running were ended (an error event and [DONE])")

    try:
        loop.call_soon_threadsafe(lambda: loop.call_later(grace, cut))
    except RuntimeError:  # the loop closed meanwhile
        pass


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def make_server(state: ServeState) -> Any:
    """A uvicorn server for `state`'s app; its lifespan starts and stops the engine."""
    import uvicorn

    from .app import build_app

    server_box: dict[str, Any] = {}

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()

        def ready() -> None:
            state.say(f"ready: {state.config.model_id} on {state.plan.device} ({state.plan.dtype}), engine "
                      f"{state.engine_name}, up to {state.config.max_concurrency} requests at once")

        def failed(exc: BaseException) -> None:
            from .engine import EngineDied

            keep = state.config.keep_alive_on_engine_death and state.engine.was_ready
            then = ("the server stays up, answering 503 (--keep-alive-on-engine-death)" if keep else
                    "the server exits")
            if isinstance(exc, EngineDied):
                state.say(f"{exc}; the requests in flight got errors; {then}")
            elif state.engine.was_ready:
                state.say(f"the engine stopped at runtime ({type(exc).__name__}; the log has the traceback); {then}")
            else:
                state.say(f"the engine failed to start: {exc}")
            if not keep:
                server_box["server"].should_exit = True

        state.engine.on_ready, state.engine.on_failed = ready, failed
        state.loop = loop
        state.engine.start(loop)
        try:
            yield
        finally:
            await asyncio.to_thread(state.engine.stop)
            state.encoder.shutdown(wait=False, cancel_futures=True)
            from .startup import restore_torch_threads

            restore_torch_threads(state.loaded)

    config = state.config
    sock = bind_socket(config.host, config.port)  # before anything loads: a busy port fails in a second
    app = build_app(state, lifespan=lifespan)
    uv_config = uvicorn.Config(app, host=config.host, port=config.port, log_level="warning", access_log=False,
                               timeout_graceful_shutdown=config.grace_seconds + CUT_MARGIN,  # type: ignore[arg-type] lifespan="on",
                               server_header=False, http=guarded_protocol(), timeout_keep_alive=KEEP_ALIVE_SECONDS)
    server = _server_class()(uv_config)
    server.state = state
    server.hwrun_socket = sock
    server_box["server"] = server
    return server


#: Seconds a connection may take to send a request's headers (slow or idle clients are closed past it).
HEADER_TIMEOUT = 10.0
#: Seconds an idle kept-alive connection stays open between two requests (uvicorn's `timeout_keep_alive`).
KEEP_ALIVE_SECONDS = 5


def bind_socket(host: str, port: int) -> socket.socket:
    """The listening socket, bound now (before the model loads); `ServeConfigError` naming the address when the
    port is taken or the host is not this machine's."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise ServeConfigError(f"--host {host} --port {port}: cannot listen there ({exc.strerror or exc}); another "
                               "process may hold the port: pass another --port (0: any free port).") from None
    sock.set_inheritable(True)
    return sock


def guarded_protocol() -> type:
    """uvicorn's HTTP protocol (httptools when installed, else h11) with a header-read timeout: a connection whose
    request headers are not complete `HEADER_TIMEOUT` seconds after it opened (or after its last request's
    answer, then new bytes) is closed, so slow or silent clients do not hold sockets open (uvicorn has no such
    timeout of its own). A body read too slowly is the app's: `hwrun.serve.app` answers 408."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as Base
    except ImportError:  # pragma: no cover - hwrun[serve] installs httptools
        from uvicorn.protocols.http.h11_impl import H11Protocol as Base

    class Guarded(Base):  # type: ignore[misc, valid-type]
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self._headers_pending():
                if self._header_timer is None:
                    self._arm()
            elif self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def connection_lost(self, exc: Exception | None) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None
            super().connection_lost(exc)

        def _headers_pending(self) -> bool:
            cycle = self.cycle
            return cycle is None or cycle.response_complete

        def _arm(self) -> None:
            self._header_timer = self.loop.call_later(HEADER_TIMEOUT, self._header_timeout)

        def _header_timeout(self) -> None:
            self._header_timer = None
            transport = self.transport
            if self._headers_pending() and transport is not None and not transport.is_closing():
                transport.close()

    return Guarded


def serve(config: ServeConfig, plan: RunPlan, **state_options: Any) -> int:
    """Serve `plan`'s model until SIGTERM or Ctrl-C; 0 after a clean drain. A model that cannot start raises
    its error (an `HwrunError`, else `EngineStartError`) once the server has closed."""
    state = ServeState(config, plan, **state_options)
    if not config.loopback and config.api_key is None:
        state.say(f"warning: listening on {config.host} without an API key: anyone who can reach this port can "
                  "use the model (set --api-key-env)")
    server = make_server(state)
    server.run(sockets=[server.hwrun_socket])
    error = state.engine.error
    if error is not None:
        if isinstance(error, HwrunError):
            raise error
        raise EngineStartError(f"the engine failed: {type(error).__name__}: {error}") from error
    state.say("stopped")
    return 0


class ServerThread:
    """`hwrun serve` in a background thread of this process (for `hwrun chat --local` and tests):
    `start()` returns once the engine is ready (or raises), `stop()` drains and joins."""

    def __init__(self, config: ServeConfig, plan: RunPlan, **state_options: Any) -> None:
        self.state = ServeState(config, plan, **state_options)
        self.server = make_server(self.state)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.server.hwrun_socket]},
                                       name="hwrun-serve", daemon=True)

    @property
    def url(self) -> str:
        """The base URL (`http://host:port`) once listening."""
        return f"http://{_url_host(self.state.config.host)}:{self.state.port}"

    def start(self, timeout: float = 300.0) -> ServerThread:
        """Start and wait until the engine is ready; `EngineStartError` if it fails or times out."""
        import time

        self.thread.start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.state.engine.error is not None:
                self.stop()
                raise EngineStartError(f"the engine failed: {self.state.engine.error}") from self.state.engine.error
            if self.state.engine.ready and self.state.port:
                return self
            if not self.thread.is_alive():
                raise EngineStartError("the server thread ended before it was ready (port in use?)")
            time.sleep(0.02)
        self.stop()
        raise EngineStartError(f"the server was not ready within {timeout:.0f} s")

    def drain(self) -> None:
        """What SIGTERM does: stop accepting, finish in-flight requests, then stop."""
        self.server.handle_exit(signal.SIGTERM, None)

    def stop(self, timeout: float = 60.0) -> None:
        """Drain and wait for the server thread to end."""
        self.drain()
        self.thread.join(timeout)

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

"""The Starlette app of `hwrun serve`: OpenAI routes, bearer-key check, errors as OpenAI error objects.

Routes: `POST /v1/completions`, `POST /v1/chat/completions`, `GET /v1/models` (+ `/v1/models/{id}`),
`GET /health` (503 until the engine is warm, and while it drains), `GET /metrics` (Prometheus text).
A body that fails validation is a 400 with `{"error": {"message", "type", "param", "code"}}`; a full
queue a 429 with `Retry-After`; an unexpected failure a 500 whose message points to the server log
(the traceback stays there). A client that disconnects cancels its request in the engine.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..errors import RequestError
from .config import MAX_BODY_BYTES
from .engine import GENERIC_FAILURE, EngineEvent, EngineNotReady, EngineRequest, QueueFullError
from .metrics import CONTENT_TYPE
from .protocol import (
    ParsedRequest,
    chunk_body,
    error_body,
    new_id,
    parse_json,
    parse_request,
    response_body,
    sse,
    usage_chunk,
)
from .state import ServeState
from .text import TextStream

logger = logging.getLogger(__name__)

ENDPOINTS = {"completion": "completions", "chat": "chat_completions"}
#: The `endpoint` label of `/metrics` per path: a fixed set, so no client can add series or inject labels.
ENDPOINT_LABELS = {"/v1/completions": "completions", "/v1/chat/completions": "chat_completions",
                   "/v1/models": "models", "/health": "health", "/metrics": "metrics"}
#: No tokenizer gives fewer than one token per this many characters: a longer prompt cannot fit the context.
CHARS_PER_TOKEN_CAP = 64
#: Paths that need the bearer key when the server has one (`/health` stays open for probes).
PROTECTED = ("/v1/", "/metrics")
#: Seconds a client is told to wait (`Retry-After`) when the queue is full, or while the model loads.
RETRY_FULL, RETRY_LOADING = 1, 5


def build_app(state: ServeState, *, lifespan: Callable[[Starlette], Any] | None = None) -> Starlette:
    """The ASGI app over `state` (its engine is started by `lifespan`, see `hwrun.serve.server`)."""
    routes = [
        Route("/v1/completions", _completions, methods=["POST"]),
        Route("/v1/chat/completions", _chat, methods=["POST"]),
        Route("/v1/models", _models, methods=["GET"]),
        Route("/v1/models/{model_id:path}", _model, methods=["GET"]),
        Route("/health", _health, methods=["GET"]),
        Route("/metrics", _metrics, methods=["GET"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={
        HTTPException: _http_error, RequestError: _request_error, Exception: _internal_error})
    app.state.hwrun = state
    app.add_middleware(BearerAuth, state=state)
    return app


class BearerAuth:
    """Checks `Authorization: Bearer <key>` in constant time (`hmac.compare_digest`) on the protected paths."""

    def __init__(self, app: Any, state: ServeState) -> None:
        self.app = app
        self.state = state
        self.key = state.config.api_key.encode() if state.config.api_key else None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        """Answer 401 when the key is missing or wrong; pass everything else on."""
        if self.key is None or scope["type"] != "http" or not scope["path"].startswith(PROTECTED):
            return await self.app(scope, receive, send)
        scheme, _, token = Headers(scope=scope).get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), self.key):
            return await self.app(scope, receive, send)
        self.state.metrics.count_request(endpoint_label(scope["path"]), "unauthorized")
        body = error_body("missing or wrong API key: send the key as `Authorization: Bearer <key>` (the value of "
                          f"${self.state.config.api_key_env} on the server).", param=None, code="invalid_api_key")
        await JSONResponse(body, status_code=401, headers={"WWW-Authenticate": "Bearer"})(scope, receive, send)


def endpoint_label(path: str) -> str:
    """`path`'s `endpoint` label in `/metrics`: one of `ENDPOINT_LABELS`' values, else "other"."""
    if path.startswith("/v1/models/"):
        return "models"
    return ENDPOINT_LABELS.get(path.rstrip("/") or "/", "other")


# ------------------------------------------------------------------------------------------- errors


def error_response(exc: RequestError) -> JSONResponse:
    """The OpenAI error object for `exc`, with `Retry-After` on 429 and 503."""
    headers = {}
    if exc.status == 429:
        headers["Retry-After"] = str(RETRY_FULL)
    elif exc.status == 503:
        headers["Retry-After"] = str(RETRY_LOADING)
    return JSONResponse(error_body(exc.message, error_type=exc.type, param=exc.param, code=exc.code),
                        status_code=exc.status, headers=headers)


async def _request_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestError)
    return error_response(exc)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    message = {404: f"no route {request.url.path}; the API is under /v1 (GET /v1/models)",
               405: f"{request.method} is not allowed on {request.url.path}"}.get(exc.status_code, str(exc.detail))
    return JSONResponse(error_body(message, code=code), status_code=exc.status_code, headers=exc.headers)


async def _internal_error(request: Request, exc: Exception) -> Response:
    logger.error("request %s %s failed", request.method, request.url.path, exc_info=exc)
    return JSONResponse(error_body(f"internal error ({type(exc).__name__}); the server log has the details.",
                                   error_type="server_error", code="internal_error"), status_code=500)


def _not_ready(state: ServeState) -> RequestError:
    engine = state.engine
    if engine.state in ("draining", "stopped"):
        return RequestError("the server is shutting down and takes no new requests.", status=503,
                            error_type="server_error", code="shutting_down")
    if engine.state == "failed":
        return RequestError("the engine failed; the server log has the details.", status=503,
                            error_type="server_error", code="engine_failed")
    return RequestError("the model is still loading or warming up; retry after Retry-After seconds "
                        "(GET /health turns 200 when ready).", status=503, error_type="server_error",
                        code="not_ready")


# ----------------------------------------------------------------------------------------- handlers


async def _health(request: Request) -> Response:
    state: ServeState = request.app.state.hwrun
    engine = state.engine
    healthy = engine.ready and not engine.stalled
    status = "ok" if healthy else ("stalled" if engine.ready else engine.state)
    body = {"status": status, "engine": state.engine_name}
    if engine.state == "failed":
        body["error"] = "the engine failed; the server log has the details"  # never the exception's own text
    elif status == "stalled":
        body["error"] = f"no decode step finished for over {engine.stall_seconds:.0f} s while requests run"
    return JSONResponse(body, status_code=200 if healthy else 503)


async def _metrics(request: Request) -> Response:
    state: ServeState = request.app.state.hwrun
    return Response(state.metrics.render(), media_type=CONTENT_TYPE)


async def _models(request: Request) -> Response:
    state: ServeState = request.app.state.hwrun
    return JSONResponse({"object": "list", "data": [state.model_card()]})


async def _model(request: Request) -> Response:
    state: ServeState = request.app.state.hwrun
    model_id = request.path_params["model_id"]
    if model_id != state.config.model_id:
        raise RequestError(f"model {model_id!r} is not served here; this server serves {state.config.model_id!r}.",
                           status=404, param="model", code="model_not_found")
    return JSONResponse(state.model_card())


async def _completions(request: Request) -> Response:
    return await _generate(request, "completion")


async def _chat(request: Request) -> Response:
    return await _generate(request, "chat")


async def _read_body(request: Request) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise RequestError(f"the request body has {declared} bytes; at most {MAX_BODY_BYTES} are taken.",
                           status=413, code="body_too_large")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise RequestError(f"the request body exceeds {MAX_BODY_BYTES} bytes.", status=413,
                               code="body_too_large")
        chunks.append(chunk)
    return b"".join(chunks)


def encode(state: ServeState, parsed: ParsedRequest) -> list[int]:
    """Prompt token ids: the prompt as `hwrun.generate` tokenizes it, or the messages through the chat template."""
    tokenizer = state.tokenizer
    limit = state.max_model_len
    if parsed.prompt is not None:
        if len(parsed.prompt) > CHARS_PER_TOKEN_CAP * limit:
            raise RequestError(f"the prompt has {len(parsed.prompt)} characters, far more than {limit} tokens "
                               "fit; shorten it.", param="prompt", code="context_length_exceeded")
        return list(tokenizer(parsed.prompt, add_special_tokens=True)["input_ids"])
    if not getattr(tokenizer, "chat_template", None):
        raise RequestError(f"model {state.config.model_id!r} has no chat template (tokenizer_config.json's "
                           "chat_template or chat_template.jinja), so /v1/chat/completions cannot build its prompt; "
                           "use /v1/completions with plain text, or serve a chat model.", param="messages",
                           code="chat_template_missing")
    chars = sum(len(m["content"]) for m in parsed.messages or ())
    if chars > CHARS_PER_TOKEN_CAP * limit:  # checked before the template renders and the tokenizer runs
        raise RequestError(f"the messages have {chars} characters of content, far more than {limit} tokens fit; "
                           "shorten them.", param="messages", code="context_length_exceeded")
    try:
        text = tokenizer.apply_chat_template([dict(m) for m in parsed.messages or ()], add_generation_prompt=True,
                                             tokenize=False)
    except Exception as exc:  # noqa: BLE001 - the template's own rule (e.g. roles must alternate)
        raise RequestError(f"the model's chat template refused these messages: {exc}", param="messages",
                           code="chat_template_error") from None
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def token_budget(parsed: ParsedRequest, prompt_tokens: int, limit: int) -> int:
    """`max_tokens` checked against the context (`limit` tokens, prompt and answer); the rest of it when unset."""
    where = "prompt" if parsed.kind == "completion" else "messages"
    if prompt_tokens == 0:
        raise RequestError("the prompt has no tokens; send some text.", param=where, code="invalid_value")
    if prompt_tokens >= limit:
        raise RequestError(f"the prompt has {prompt_tokens} tokens; this server takes at most {limit} tokens, prompt "
                           "and answer together (--max-model-len). Shorten the prompt.", param=where,
                           code="context_length_exceeded")
    room = limit - prompt_tokens
    if parsed.max_tokens is None:
        return room
    if parsed.max_tokens > room:
        raise RequestError(f"max_tokens={parsed.max_tokens} does not fit: the prompt has {prompt_tokens} tokens and "
                           f"the context {limit}, so at most {room} new tokens. Lower max_tokens.", param="max_tokens",
                           code="context_length_exceeded")
    return parsed.max_tokens


async def _generate(request: Request, kind: str) -> Response:
    state: ServeState = request.app.state.hwrun
    endpoint = ENDPOINTS[kind]
    arrived = time.perf_counter()
    try:
        if not state.engine.ready:
            raise _not_ready(state)
        parsed = parse_request(parse_json(await _read_body(request)), kind, state.config.model_id)
        # in the server's one tokenizer thread: a long prompt does not stall the event loop
        ids = await asyncio.get_running_loop().run_in_executor(state.encoder, encode, state, parsed)
        budget = token_budget(parsed, len(ids), state.max_model_len)
        run = Run(state, kind, parsed, len(ids), arrived)
        try:
            state.engine.submit(EngineRequest(run.rid, tuple(ids), budget, parsed.sampling), run.events.put_nowait)
        except QueueFullError as exc:
            raise RequestError(f"the server is at capacity ({exc}; --max-concurrency {state.config.max_concurrency}, "
                               f"--max-queue {state.config.max_queue}); retry after Retry-After seconds.",
                               status=429, error_type="rate_limit_exceeded", code="queue_full") from None
        except EngineNotReady:
            raise _not_ready(state) from None
    except RequestError as exc:
        state.metrics.count_request(endpoint, _outcome(exc.status))
        return error_response(exc)
    state.metrics.prompt_tokens += len(ids)
    if parsed.stream:
        return StreamingResponse(run.stream(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    return await run.whole(request)


def _outcome(status: int) -> str:
    return {400: "invalid", 401: "unauthorized", 404: "invalid", 413: "invalid", 429: "rate_limited",
            503: "unavailable"}.get(status, "error")


class Run:
    """One admitted request: its engine events in, text pieces out, timings into the metrics."""

    def __init__(self, state: ServeState, kind: str, parsed: ParsedRequest, prompt_tokens: int,
                 arrived: float) -> None:
        self.state, self.kind, self.parsed = state, kind, parsed
        self.rid = new_id(kind)
        self.created = int(time.time())
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = 0
        self.arrived = arrived
        self.last: float | None = None
        self.events: asyncio.Queue[EngineEvent] = asyncio.Queue()
        self.text = TextStream(state.tokenizer, parsed.stop)
        self.finish_reason: str | None = None
        self.outcome: str | None = None  # the engine's finish reason (one of FINISH_REASONS) once finished
        self.error: str | None = None
        self.done = False

    async def pieces(self) -> AsyncIterator[str]:
        """Text pieces as the tokens arrive; sets `finish_reason` (or `error`) at the end."""
        metrics = self.state.metrics
        # the engine fails a request without tokens after `stall_seconds`; this bound holds if its worker hangs
        wait = 2 * self.state.engine.stall_seconds
        while not self.done:
            try:
                event = await asyncio.wait_for(self.events.get(), wait)
            except TimeoutError:
                logger.error("request %s got no engine event for %.0f s (the engine is stuck): it fails",
                             self.rid, wait)
                self.state.engine.cancel(self.rid)
                self.outcome, self.error = "error", f"{GENERIC_FAILURE} (request {self.rid})."
                self._finish(None)
                return
            now = time.perf_counter()
            if event.token_ids:
                count = len(event.token_ids)
                if self.last is None:
                    metrics.ttft.observe(now - self.arrived)
                else:
                    metrics.itl.observe((now - self.last) / count, count)
                self.last = now
                self.completion_tokens += count
                metrics.generation_tokens += count
                piece = self.text.push(event.token_ids)
                if piece:
                    yield piece
                if self.text.stopped:  # a stop string: the request ends here, the engine stops it
                    self.state.engine.cancel(self.rid)
                    self._finish("stop")
                    return
            if event.finished:
                self.outcome = event.finish_reason
                if event.finish_reason in ("stop", "length"):
                    tail = self.text.finish()
                    if tail:
                        yield tail
                    self._finish(event.finish_reason)
                elif event.finish_reason == "cancelled":
                    self.error = "the request was cancelled by the server (shutting down)."
                    self._finish(None)
                else:  # the details stay in the log; the client gets a generic message and the request id
                    logger.error("request %s failed in the engine: %s", self.rid, event.error or "(no detail)")
                    self.error = f"{GENERIC_FAILURE} (request {self.rid})."
                    self._finish(None)
                return

    def _finish(self, reason: str | None) -> None:
        self.finish_reason, self.done = reason, True
        self.state.metrics.duration.observe(time.perf_counter() - self.arrived)
        self.state.metrics.count_request(ENDPOINTS[self.kind], "ok" if self.error is None else "error")

    def abandon(self) -> None:
        """The client left (or the server gave up): cancel in the engine and count it. Idempotent: nothing
        happens once the request finished or was abandoned."""
        if not self.done:
            self.done = True
            self.state.engine.cancel(self.rid)
            self.state.metrics.count_request(ENDPOINTS[self.kind], "cancelled")

    async def stream(self) -> AsyncIterator[bytes]:
        """The SSE stream: a role chunk (chat), text chunks, the finish chunk, usage if asked, `[DONE]`."""
        model = self.state.config.model_id
        try:
            if self.kind == "chat":
                yield sse(chunk_body("chat", self.rid, model, self.created, role=True, text=""))
            async for piece in self.pieces():
                yield sse(chunk_body(self.kind, self.rid, model, self.created, text=piece))
            if self.error is not None:
                yield sse(error_body(self.error, error_type="server_error", code="generation_failed"))
            else:
                yield sse(chunk_body(self.kind, self.rid, model, self.created, finish_reason=self.finish_reason))
                if self.parsed.include_usage:
                    yield sse(usage_chunk(self.kind, self.rid, model, self.created, self.prompt_tokens,
                                          self.completion_tokens))
            yield sse("[DONE]")
        finally:
            self.abandon()

    async def whole(self, request: Request) -> Response:
        """The whole answer as one JSON body; a client that disconnects first cancels the request."""
        async def collect() -> str:
            return "".join([piece async for piece in self.pieces()])

        collecting = asyncio.ensure_future(collect())
        watching = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait({collecting, watching}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watching.cancel()
            if not collecting.done():
                collecting.cancel()
            self.abandon()  # always (a no-op once finished): a collect() that raised leaves no request behind
        if not collecting.done() or collecting.cancelled():
            return Response(status_code=499)  # nobody reads it: the client is gone
        text = collecting.result()
        if self.error is not None:
            return JSONResponse(error_body(self.error, error_type="server_error", code="generation_failed"),
                                status_code=503 if self.outcome == "cancelled" else 500)
        return JSONResponse(response_body(self.kind, self.rid, self.state.config.model_id, text, self.finish_reason,
                                          self.prompt_tokens, self.completion_tokens, self.created))


async def _disconnected(request: Request) -> None:
    """Returns when the client disconnects (the body was read before, so only `http.disconnect` arrives)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return

"""The Starlette app of `hwrun serve`: OpenAI routes, bearer-key check, errors as OpenAI error objects.

Routes: `POST /v1/completions`, `POST /v1/chat/completions`, `POST /v1/responses` (OpenAI's Responses API:
`hwrun.serve.responses`), `GET /v1/models` (+ `/v1/models/{id}`; the base model and each `--lora` adapter),
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
from collections.abc import Callable
from typing import Any

from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..errors import RequestError
from .config import MAX_BODY_BYTES
from .engine import EngineNotReady, EngineRequest, QueueFullError
from .metrics import CONTENT_TYPE
from .protocol import engine_refusal, error_body, parse_json, parse_request
from .request import ENDPOINTS, Run, encode, token_budget
from .responses import parse_responses, responses_stream, responses_whole
from .state import ServeState

logger = logging.getLogger(__name__)

#: The `endpoint` label of `/metrics` per path: a fixed set, so no client can add series or inject labels.
ENDPOINT_LABELS = {"/v1/completions": "completions", "/v1/chat/completions": "chat_completions",
                   "/v1/responses": "responses", "/v1/models": "models", "/health": "health", "/metrics": "metrics"}
#: Paths that need the bearer key when the server has one (`/health` stays open for probes).
PROTECTED = ("/v1/", "/metrics")
#: Seconds a request's whole body may take to arrive (a slower one is a 408; the headers' limit is the server's).
BODY_TIMEOUT = 30.0
#: Seconds a client is told to wait (`Retry-After`) when the queue is full, or while the model loads.
RETRY_FULL, RETRY_LOADING = 1, 5


def build_app(state: ServeState, *, lifespan: Callable[[Starlette], Any] | None = None) -> Starlette:
    """The ASGI app over `state` (its engine is started by `lifespan`, see `hwrun.serve.server`)."""
    routes = [
        Route("/v1/completions", _completions, methods=["POST"]),
        Route("/v1/chat/completions", _chat, methods=["POST"]),
        Route("/v1/responses", _responses, methods=["POST"]),
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
    return JSONResponse({"object": "list", "data": [state.model_card(), *state.adapter_cards()]})


async def _model(request: Request) -> Response:
    state: ServeState = request.app.state.hwrun
    model_id = request.path_params["model_id"]
    card = state.card(model_id)
    if card is None:
        served = ", ".join(repr(m) for m in (state.config.model_id, *state.served.adapters))
        raise RequestError(f"model {model_id!r} is not served here; this server serves {served}.",
                           status=404, param="model", code="model_not_found")
    return JSONResponse(card)


async def _completions(request: Request) -> Response:
    return await _generate(request, "completion")


async def _chat(request: Request) -> Response:
    return await _generate(request, "chat")


async def _responses(request: Request) -> Response:
    return await _generate(request, "responses")


async def _read_body(request: Request) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise RequestError(f"the request body has {declared} bytes; at most {MAX_BODY_BYTES} are taken.",
                           status=413, code="body_too_large")
    chunks, size = [], 0
    try:
        async with asyncio.timeout(BODY_TIMEOUT):
            async for chunk in request.stream():
                size += len(chunk)
                if size > MAX_BODY_BYTES:
                    raise RequestError(f"the request body exceeds {MAX_BODY_BYTES} bytes.", status=413,
                                       code="body_too_large")
                chunks.append(chunk)
    except TimeoutError:
        raise RequestError(f"the request body did not arrive within {BODY_TIMEOUT:.0f} s ({size} bytes came); send "
                           "it whole.", status=408, code="request_timeout") from None
    return b"".join(chunks)


async def _generate(request: Request, kind: str) -> Response:
    state: ServeState = request.app.state.hwrun
    endpoint = ENDPOINTS[kind]
    arrived = time.perf_counter()
    meta = None
    try:
        if not state.engine.ready:
            raise _not_ready(state)
        body = parse_json(await _read_body(request))
        if kind == "responses":
            parsed, meta = parse_responses(body, state.served)
        else:
            parsed = parse_request(body, kind, state.served)
        if parsed.n > state.config.max_concurrency:
            raise RequestError(f"`n`={parsed.n}: each choice is decoded in a slot of its own, and this server has "
                               f"{state.config.max_concurrency} (--max-concurrency); ask for fewer choices.",
                               param="n", code="invalid_value")
        engine_refusal(parsed, state.refuses, state.engine_name)
        # in the server's one tokenizer thread: a long prompt does not stall the event loop
        ids = await asyncio.get_running_loop().run_in_executor(state.encoder, encode, state, parsed)
        budget = token_budget(parsed, len(ids), state.max_model_len)
        run = Run(state, kind, parsed, len(ids), arrived)
        try:
            state.engine.submit(EngineRequest(run.rid, tuple(ids), budget, parsed.sampling, parsed.ignore_eos,
                                              n=parsed.n, stop_token_ids=parsed.stop_token_ids,
                                              adapter=parsed.adapter), run.deliver)
        except QueueFullError as exc:
            raise RequestError(f"the server is at capacity ({exc}; --max-concurrency {state.config.max_concurrency}, "
                               f"--max-queue {state.config.max_queue}); retry after Retry-After seconds.",
                               status=429, error_type="rate_limit_exceeded", code="queue_full") from None
        except EngineNotReady:
            raise _not_ready(state) from None
        state.runs.add(run)
    except RequestError as exc:
        state.metrics.count_request(endpoint, _outcome(exc.status))
        return error_response(exc)
    state.metrics.prompt_tokens += len(ids)
    if parsed.stream:
        stream = responses_stream(run, meta) if meta is not None else run.stream()
        return StreamingResponse(stream, media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    if meta is not None:
        return await responses_whole(run, meta, request)
    return await run.whole(request)


def _outcome(status: int) -> str:
    return {400: "invalid", 401: "unauthorized", 404: "invalid", 408: "invalid", 413: "invalid", 429: "rate_limited",
            503: "unavailable"}.get(status, "error")

"""One admitted request of `hwrun serve`: its prompt encoded and budgeted, its engine events turned into text,
a whole JSON answer or an SSE stream, and its timings into the metrics (used by `hwrun.serve.app`)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..errors import RequestError
from .engine import GENERIC_FAILURE, EngineEvent
from .protocol import (
    ParsedRequest,
    chunk_body,
    error_body,
    new_id,
    response_body,
    sse,
    text_chunk_encoder,
    usage_chunk,
)
from .state import ServeState
from .text import TextStream

logger = logging.getLogger(__name__)

#: The `endpoint` label of each request kind in `/metrics`.
ENDPOINTS = {"completion": "completions", "chat": "chat_completions"}
#: No tokenizer gives fewer than one token per this many characters: a longer prompt cannot fit the context.
CHARS_PER_TOKEN_CAP = 64


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
        self._inbox: list[EngineEvent] = []  # events delivered, not yet read by `pieces()`
        self._waiter: asyncio.Future[None] | None = None  # set while `pieces()` waits for an event
        self.text = TextStream(state.tokenizer, parsed.stop)
        self.finish_reason: str | None = None
        self.outcome: str | None = None  # the engine's finish reason (one of FINISH_REASONS) once finished
        self.error: str | None = None
        self.done = False

    def deliver(self, event: EngineEvent) -> None:
        """The engine's sink for this request (called on the event loop): keep `event` and wake `pieces()`."""
        self._inbox.append(event)
        if self._waiter is not None:
            _wake(self._waiter)

    async def _take(self, wait: float) -> list[EngineEvent] | None:
        """Every event that arrived since the last call, waiting up to `wait` seconds for one; None when none came.
        One timer per wait (not a task per event, as `asyncio.wait_for` makes on Python 3.11)."""
        if not self._inbox:
            loop = asyncio.get_running_loop()
            waiter = self._waiter = loop.create_future()
            timer = loop.call_later(wait, _wake, waiter)
            try:
                await waiter
            finally:
                timer.cancel()
                self._waiter = None
            if not self._inbox:
                return None
        events = list(self._inbox)
        self._inbox.clear()
        return events

    async def pieces(self) -> AsyncIterator[str]:
        """Text pieces as the tokens arrive; sets `finish_reason` (or `error`) at the end. The text of every event
        that arrived while the consumer was busy (a loaded server) goes out as one piece: the same text and token
        counts, fewer chunks."""
        metrics = self.state.metrics
        # the engine fails a request without tokens after `stall_seconds`; this bound holds if its worker hangs
        wait = 2 * self.state.engine.stall_seconds
        while not self.done:
            events = await self._take(wait)
            if events is None:
                logger.error("request %s got no engine event for %.0f s (the engine is stuck): it fails",
                             self.rid, wait)
                self.state.engine.cancel(self.rid)
                self.outcome, self.error = "error", f"{GENERIC_FAILURE} (request {self.rid})."
                self._finish(None)
                return
            now = time.perf_counter()
            out: list[str] = []
            end: EngineEvent | None = None
            stopped = False
            for event in events:
                # the server's reader detokenized the event (`text`); one made without it is detokenized here
                detokenized = event.text is not None
                if event.token_ids:
                    count = len(event.token_ids)
                    if self.last is None:
                        metrics.ttft.observe(now - self.arrived)
                    else:
                        metrics.itl.observe((now - self.last) / count, count)
                    self.last = now
                    self.completion_tokens += count
                    metrics.generation_tokens += count
                    piece = self.text.push_text(event.text) if detokenized else self.text.push(event.token_ids)
                    if piece:
                        out.append(piece)
                    if self.text.stopped:  # a stop string: the request ends here, the engine stops it
                        stopped = True
                        break
                elif detokenized and event.text:  # the held end of the text, flushed on the finishing event
                    piece = self.text.push_text(event.text)
                    if piece:
                        out.append(piece)
                    if self.text.stopped:
                        stopped = True
                        break
                if event.finished:
                    end = event
                    if event.finish_reason in ("stop", "length"):
                        tail = self.text.finish_text() if detokenized else self.text.finish()
                        if tail:
                            out.append(tail)
                    break
            if out:
                yield "".join(out)
            if stopped:
                self.state.engine.cancel(self.rid)
                self._finish("stop")
                return
            if end is not None:
                self.outcome = end.finish_reason
                if end.finish_reason in ("stop", "length"):
                    self._finish(end.finish_reason)
                elif end.finish_reason == "cancelled":
                    self.error = "the request was cancelled by the server (shutting down)."
                    self._finish(None)
                else:  # the details stay in the log; the client gets a generic message and the request id
                    logger.error("request %s failed in the engine: %s", self.rid, end.error or "(no detail)")
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
            encode_text = text_chunk_encoder(self.kind, self.rid, model, self.created)
            async for piece in self.pieces():
                yield encode_text(piece)
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


def _wake(waiter: asyncio.Future[None]) -> None:
    """Ends a `Run._take` wait (an event arrived, or its time ran out)."""
    if not waiter.done():
        waiter.set_result(None)


async def _disconnected(request: Request) -> None:
    """Returns when the client disconnects (the body was read before, so only `http.disconnect` arrives)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return

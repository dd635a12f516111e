"""One admitted request of `hwrun serve`: its prompt encoded and budgeted, its engine events turned into each
choice's text, tool calls and logprobs, a whole JSON answer or an SSE stream, and its timings into the metrics
(used by `hwrun.serve.app`; the Responses API writes its own shapes from the same `Run`: `hwrun.serve.responses`)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..errors import RequestError
from .engine import GENERIC_FAILURE, EngineEvent
from .protocol import (
    ParsedRequest,
    TokenInfo,
    chat_choice,
    chat_logprobs,
    chunk_body,
    completion_choice,
    completion_logprobs,
    error_body,
    new_id,
    response_body,
    sse,
    text_chunk_encoder,
    usage_chunk,
)
from .state import ServeState
from .text import TextStream
from .tools.parsers import CallDelta, NamedParser, ToolParser, make_parser

logger = logging.getLogger(__name__)

#: The `endpoint` label of each request kind in `/metrics`.
ENDPOINTS = {"completion": "completions", "chat": "chat_completions", "responses": "responses"}
#: An engine error that starts with this is a refusal written for the client (`Backend.refusal`): its text is
#: passed on (a 400 for a whole answer), not hidden behind the generic failure message.
REFUSED_PREFIX = "refused: "
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
    chars = sum(_message_chars(m) for m in parsed.messages or ())
    if chars > CHARS_PER_TOKEN_CAP * limit:  # checked before the template renders and the tokenizer runs
        raise RequestError(f"the messages have {chars} characters of content, far more than {limit} tokens fit; "
                           "shorten them.", param="messages", code="context_length_exceeded")
    options: dict[str, Any] = dict(parsed.chat_template_kwargs)
    if parsed.tools.tools and parsed.tools.choice != "none":
        support = state.tool_support
        # a constrained choice (required, a named function) needs no parser, only a template that shows the tools
        if support is None or not support.renders or (support.parser is None and not parsed.tools.constrained):
            why = support.why if support is not None else "the model is not loaded yet"
            raise RequestError(f"`tools` cannot be served by this model: {why}. hwrun serve reads tool calls "
                               "in the format of the model's chat template (--tool-parser hermes, llama3_json or "
                               "mistral names it when the template does not).", param="tools",
                               code="tools_unsupported")
        options["tools"] = [tool.as_template() for tool in parsed.tools.tools]
    elif parsed.tools.tools and state.tool_support is not None and state.tool_support.renders:
        options["tools"] = [tool.as_template() for tool in parsed.tools.tools]  # `none`: shown, not called (vLLM)
    try:
        text = tokenizer.apply_chat_template([dict(m) for m in parsed.messages or ()], add_generation_prompt=True,
                                             tokenize=False, **options)
    except Exception as exc:  # noqa: BLE001 - the template's own rule (e.g. roles must alternate)
        raise RequestError(f"the model's chat template refused these messages: {exc}", param="messages",
                           code="chat_template_error") from None
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _message_chars(message: dict[str, Any]) -> int:
    calls = message.get("tool_calls") or ()
    return len(message.get("content") or "") + sum(len(str(c.get("function", ""))) for c in calls)


#: The request field that holds the input, and the one that holds the token budget, per request kind.
INPUT_FIELD = {"completion": "prompt", "chat": "messages", "responses": "input"}
BUDGET_FIELD = {"completion": "max_tokens", "chat": "max_tokens", "responses": "max_output_tokens"}


def token_budget(parsed: ParsedRequest, prompt_tokens: int, limit: int) -> int:
    """`max_tokens` checked against the context (`limit` tokens, prompt and answer); the rest of it when unset."""
    where, budget = INPUT_FIELD.get(parsed.kind, "messages"), BUDGET_FIELD.get(parsed.kind, "max_tokens")
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
        raise RequestError(f"{budget}={parsed.max_tokens} does not fit: the prompt has {prompt_tokens} tokens and "
                           f"the context {limit}, so at most {room} new tokens. Lower {budget}.", param=budget,
                           code="context_length_exceeded")
    return parsed.max_tokens


@dataclass
class Update:
    """What one choice adds at one turn: content text, tool-call pieces, the logprobs of its new tokens, and its
    finish reason when it ended."""

    index: int
    text: str = ""
    calls: list[CallDelta] = field(default_factory=list)
    logprobs: list[TokenInfo] = field(default_factory=list)
    finish_reason: str | None = None


class Choice:
    """One of a request's `n` choices: its text (stop strings cut), its tool-call parser, its logprobs."""

    def __init__(self, index: int, run: Run) -> None:
        self.index = index
        self.text = TextStream(run.state.tokenizer, run.parsed.stop, drop_ids=getattr(run.state, "drop_ids", None))
        self.parser = run.new_parser()
        self.tokens = 0
        self.done = False
        self.finish_reason: str | None = None
        self.logprobs: list[TokenInfo] = []
        self.offset = len(run.parsed.prompt or "") if run.parsed.echo else 0  # text_offset of the next token
        self.content = ""  # content sent (or collected) so far

    def feed(self, piece: str, update: Update) -> None:
        """Send `piece` of the answer through the parser (if any) into `update`."""
        if not piece:
            return
        if self.parser is None:
            update.text += piece
            self.content += piece
        else:
            content, calls = self.parser.push(piece)
            update.text += content
            update.calls += calls

    def end(self, reason: str, update: Update) -> None:
        """The choice ended with `reason` ("stop" or "length"); a turn with tool calls ends with "tool_calls"."""
        if self.parser is not None:
            content, calls = self.parser.finish()
            update.text += content
            update.calls += calls
            if self.parser.calls and reason == "stop":
                reason = "tool_calls"
        self.done, self.finish_reason = True, reason
        update.finish_reason = reason


class Run:
    """One admitted request: its engine events in, each choice's updates out, timings into the metrics."""

    def __init__(self, state: ServeState, kind: str, parsed: ParsedRequest, prompt_tokens: int,
                 arrived: float) -> None:
        self.state, self.kind, self.parsed = state, kind, parsed
        self.rid = new_id(kind)
        self.created = int(time.time())
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = 0
        self.arrived = arrived
        self.last: float | None = None
        self._inbox: list[EngineEvent] = []  # events delivered, not yet read by `updates()`
        self._waiter: asyncio.Future[None] | None = None  # set while `updates()` waits for an event
        self.choices = [Choice(i, self) for i in range(parsed.n)]
        self.text = self.choices[0].text  # choice 0's text stream (n=1: the answer)
        self.finish_reason: str | None = None  # choice 0's
        self.outcome: str | None = None  # the engine's finish reason (one of FINISH_REASONS) once finished
        self.error: str | None = None
        self.error_code = "generation_failed"
        self.cut: str | None = None  # why the server ended the request (shutdown past --grace-seconds)
        self.done = False

    def new_parser(self) -> ToolParser | None:
        """A tool-call parser for one choice: the constrained shape for `required` / a named function, else the
        server's format (None when the request has no tools or `tool_choice` is none)."""
        tools = self.parsed.tools
        if not tools.active:
            return None
        if tools.choice == "function":
            return NamedParser(tools.function or "", max_calls=tools.max_calls)
        if tools.choice == "required":
            return make_parser("required", max_calls=tools.max_calls)
        support = self.state.tool_support
        assert support is not None and support.parser is not None  # `encode` refused the request otherwise
        return make_parser(support.parser, max_calls=tools.max_calls)

    def deliver(self, event: EngineEvent) -> None:
        """The engine's sink for this request (called on the event loop): keep `event` and wake `updates()`."""
        self._inbox.append(event)
        if self._waiter is not None:
            _wake(self._waiter)

    def end_now(self, why: str) -> None:
        """End the request from the server's side (shutdown past `--grace-seconds`): its stream gets an error
        event and `[DONE]`, a whole answer a 503."""
        if not self.done and self.cut is None:
            self.cut = why
            self.deliver(EngineEvent(self.rid, (), True, "cancelled", why, ""))

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

    def _token_infos(self, event: EngineEvent) -> list[TokenInfo]:
        if self.parsed.sampling.logprobs is None or not event.logprobs:
            return []
        texts = self.state.token_texts
        out = []
        for token, lp in zip(event.token_ids, event.logprobs, strict=False):
            text, data = texts(token)
            top = tuple((*texts(tid), float(value)) for tid, value in lp.top)
            out.append(TokenInfo(text, data, float(lp.logprob), top))
        return out

    async def updates(self) -> AsyncIterator[list[Update]]:
        """Each turn's updates (one per choice that changed) as the tokens arrive; sets `error` at the end when
        the request failed. The events that arrived while the consumer was busy (a loaded server) go out as one
        update per choice: the same text and token counts, fewer chunks."""
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
                self._finish()
                return
            now = time.perf_counter()
            updates: dict[int, Update] = {}
            failed: EngineEvent | None = None
            for event in events:
                if event.finished and event.finish_reason not in ("stop", "length"):
                    failed = event
                    break
                if not 0 <= event.index < len(self.choices):
                    logger.error("request %s: the engine sent choice %d of %d; ignored", self.rid, event.index,
                                 len(self.choices))
                    continue
                choice = self.choices[event.index]
                if choice.done:
                    continue
                update = updates.setdefault(choice.index, Update(choice.index))
                detokenized = event.text is not None
                if event.token_ids:
                    count = len(event.token_ids)
                    if self.last is None:
                        metrics.ttft.observe(now - self.arrived)
                    else:
                        metrics.itl.observe((now - self.last) / count, count)
                    self.last = now
                    choice.tokens += count
                    self.completion_tokens += count
                    metrics.generation_tokens += count
                    infos = self._token_infos(event)
                    update.logprobs += infos
                    choice.logprobs += infos
                    choice.feed(choice.text.push_text(event.text or "") if detokenized else
                                choice.text.push(event.token_ids), update)
                elif detokenized and event.text:  # the held end of the text, flushed on the finishing event
                    choice.feed(choice.text.push_text(event.text), update)
                if choice.text.stopped:  # a stop string: this choice ends here
                    choice.end("stop", update)
                elif event.finished:
                    choice.feed(choice.text.finish_text() if detokenized else choice.text.finish(), update)
                    choice.end(event.finish_reason or "stop", update)
            if updates:
                yield [updates[i] for i in sorted(updates)]
            if failed is not None:
                self.outcome = failed.finish_reason
                if self.cut is not None:
                    self.state.engine.cancel(self.rid)
                    self.error, self.error_code = self.cut, "shutting_down"
                elif failed.finish_reason == "cancelled":
                    self.error = "the request was cancelled by the server (shutting down)."
                elif (failed.error or "").startswith(REFUSED_PREFIX):  # the backend cannot run it: say why
                    self.error = f"this server's engine cannot run the request: {failed.error[len(REFUSED_PREFIX):]}"
                    self.error_code = "unsupported_by_engine"
                else:  # the details stay in the log; the client gets a generic message and the request id
                    logger.error("request %s failed in the engine: %s", self.rid, failed.error or "(no detail)")
                    self.error = f"{GENERIC_FAILURE} (request {self.rid})."
                self._finish()
                return
            if all(c.done for c in self.choices):
                self.outcome = "stop"
                if any(c.text.stopped for c in self.choices):
                    self.state.engine.cancel(self.rid)  # the engine may still decode a choice a stop string ended
                self._finish()
                return

    def _forget(self) -> None:
        runs = getattr(self.state, "runs", None)  # (a state made by hand in a test may keep none)
        if runs is not None:
            runs.discard(self)

    def _finish(self) -> None:
        self.finish_reason, self.done = self.choices[0].finish_reason, True
        self._forget()
        self.state.metrics.duration.observe(time.perf_counter() - self.arrived)
        self.state.metrics.count_request(ENDPOINTS[self.kind], "ok" if self.error is None else "error")

    def abandon(self) -> None:
        """The client left (or the server gave up): cancel in the engine and count it. Idempotent: nothing
        happens once the request finished or was abandoned."""
        self._forget()
        if not self.done:
            self.done = True
            self.state.engine.cancel(self.rid)
            self.state.metrics.count_request(ENDPOINTS[self.kind], "cancelled")

    async def pieces(self) -> AsyncIterator[str]:
        """Choice 0's content as it arrives (what `hwrun chat`-like callers of one choice read)."""
        async for updates in self.updates():
            text = "".join(u.text for u in updates if u.index == 0)
            if text:
                yield text

    # ------------------------------------------------------------------------------------ OpenAI's shapes

    def _logprobs_body(self, choice: Choice, tokens: list[TokenInfo]) -> dict[str, Any] | None:
        if self.parsed.sampling.logprobs is None:
            return None
        if self.kind == "chat":
            return chat_logprobs(tokens)
        body = completion_logprobs(tokens, choice.offset, self.parsed.sampling.logprobs)
        choice.offset += sum(len(t.token) for t in tokens)
        return body

    def _error_event(self) -> bytes:
        return sse(error_body(self.error or "", error_type="server_error", code=self.error_code))

    async def stream(self) -> AsyncIterator[bytes]:
        """The SSE stream: a role chunk per choice (chat), content / tool-call / logprobs chunks, a finish chunk
        per choice, usage if asked, `[DONE]`; an error event and `[DONE]` when the request fails."""
        model = self.parsed.model
        kind = self.kind
        try:
            if kind == "chat":
                for choice in self.choices:
                    yield sse(chunk_body(kind, self.rid, model, self.created, role=True, text="",
                                         index=choice.index))
            if self.parsed.echo:
                for choice in self.choices:
                    yield sse(chunk_body(kind, self.rid, model, self.created, text=self.parsed.prompt,
                                         index=choice.index))
            encoders = [text_chunk_encoder(kind, self.rid, model, self.created, c.index) for c in self.choices]
            async for updates in self.updates():
                for update in updates:
                    choice = self.choices[update.index]
                    if update.calls or update.logprobs:
                        yield sse(chunk_body(kind, self.rid, model, self.created,
                                             text=update.text if update.text or kind != "chat" else None,
                                             index=update.index, tool_calls=[c.as_openai() for c in update.calls],
                                             logprobs=self._logprobs_body(choice, update.logprobs)))
                    elif update.text:
                        yield encoders[update.index](update.text)
                    if update.finish_reason is not None:
                        yield sse(chunk_body(kind, self.rid, model, self.created, index=update.index,
                                             finish_reason=update.finish_reason))
            if self.error is not None:
                yield self._error_event()
            elif self.parsed.include_usage:
                yield sse(usage_chunk(kind, self.rid, model, self.created, self.prompt_tokens,
                                      self.completion_tokens))
            yield sse("[DONE]")
        finally:
            self.abandon()

    async def collect(self, request: Request) -> bool:
        """Run to the end for a whole answer; False when the client disconnected first (the request is cancelled
        then)."""
        async def consume() -> None:
            async for _ in self.updates():
                pass

        collecting = asyncio.ensure_future(consume())
        watching = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait({collecting, watching}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watching.cancel()
            if not collecting.done():
                collecting.cancel()
            self.abandon()  # always (a no-op once finished): a consume() that raised leaves no request behind
        if not collecting.done() or collecting.cancelled():
            return False
        collecting.result()
        return True

    def error_response(self) -> Response:
        """The failed request's answer: 503 when the server ended it, else 500."""
        if self.error_code == "unsupported_by_engine":
            return JSONResponse(error_body(self.error or "", code=self.error_code), status_code=400)
        return JSONResponse(error_body(self.error or "", error_type="server_error", code=self.error_code),
                            status_code=503 if self.outcome == "cancelled" else 500)

    async def whole(self, request: Request) -> Response:
        """The whole answer as one JSON body; a client that disconnects first cancels the request."""
        if not await self.collect(request):
            return Response(status_code=499)  # nobody reads it: the client is gone
        if self.error is not None:
            return self.error_response()
        choices = []
        for choice in self.choices:
            logprobs = None
            if self.parsed.sampling.logprobs is not None:
                choice.offset = len(self.parsed.prompt or "") if self.parsed.echo else 0
                logprobs = self._logprobs_body(choice, choice.logprobs)
            if self.kind == "chat":
                parser = choice.parser
                content = parser.whole_content if parser is not None else choice.content
                calls = [c.as_openai() for c in parser.tool_calls] if parser is not None else None
                reason = choice.finish_reason
                if parser is not None and not parser.tool_calls and reason == "tool_calls":
                    reason = "stop"  # the calls it started proved invalid: their text is the content
                choices.append(chat_choice(choice.index, content, reason, tool_calls=calls, logprobs=logprobs))
            else:
                text = (self.parsed.prompt or "") + choice.content if self.parsed.echo else choice.content
                choices.append(completion_choice(choice.index, text, choice.finish_reason, logprobs))
        return JSONResponse(response_body(self.kind, self.rid, self.parsed.model, "", None, self.prompt_tokens,
                                          self.completion_tokens, self.created, choices=choices))


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

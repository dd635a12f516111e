"""A small client of hwrun serve's OpenAI API on the standard library alone (what `hwrun chat` speaks).

`ApiClient(base_url, api_key).stream(path, body)` posts with `"stream": true` and yields the text of each
Server-Sent Event chunk; closing the generator closes the connection, which cancels the request on the
server. Every wait is bounded: `connect_timeout` seconds to connect, `read_timeout` seconds without a byte
from the server (issue 42.6). Server errors, timeouts and malformed streams (lines that are not Server-Sent
Events, data that is not JSON, an error event mid-stream, a stream that ends before `data: [DONE]`) become
`ChatClientError` naming the URL, what came, and the option or check that fixes it.
"""

from __future__ import annotations

import http.client
import json
import socket
import urllib.parse
from collections.abc import Iterator
from typing import Any

from ..errors import ChatClientError

#: Seconds to open the connection (`hwrun chat --connect-timeout`).
CONNECT_TIMEOUT_S = 10.0
#: Seconds without a byte from the server (`hwrun chat --read-timeout`): the server's own --stall-seconds
#: default, after which hwrun serve fails a request that gets no token.
READ_TIMEOUT_S = 120.0
#: The longest line or error body read from the server: past it the stream is refused, not buffered on.
MAX_LINE_BYTES = 1 << 20
#: Server-Sent Event fields other than `data` (ignored, as the SSE specification says).
_OTHER_FIELDS = ("event", "id", "retry")


class ApiClient:
    """Talks to `base_url` (`http://host:port`, with or without `/v1`); `api_key` is sent as a bearer token."""

    def __init__(self, base_url: str, api_key: str | None = None, *, connect_timeout: float = CONNECT_TIMEOUT_S,
                 read_timeout: float = READ_TIMEOUT_S) -> None:
        url = urllib.parse.urlsplit(base_url if "://" in base_url else f"http://{base_url}")
        try:
            port_ok = url.port is None or 0 < url.port < 65536
        except ValueError:
            port_ok = False
        if url.scheme not in ("http", "https") or not url.hostname or not port_ok:
            raise ChatClientError(f"--base-url {base_url!r} is not an http(s) URL; pass e.g. http://127.0.0.1:8000.")
        for option, value in (("--connect-timeout", connect_timeout), ("--read-timeout", read_timeout)):
            if not (isinstance(value, (int, float)) and 0 < value <= 86400):  # NaN fails both comparisons
                raise ChatClientError(f"{option} {value!r} must be a number of seconds above 0 and at most 86400.")
        self.url = url
        self.where = url.geturl()
        self.prefix = url.path.rstrip("/").removesuffix("/v1")
        self.api_key = api_key
        self.connect_timeout, self.read_timeout = float(connect_timeout), float(read_timeout)

    def _connect(self) -> http.client.HTTPConnection:
        """An open connection: `connect_timeout` for the connect, then `read_timeout` for every read."""
        cls = http.client.HTTPSConnection if self.url.scheme == "https" else http.client.HTTPConnection
        connection = cls(self.url.hostname, self.url.port, timeout=self.connect_timeout)
        try:
            connection.connect()
        except TimeoutError:
            connection.close()
            raise ChatClientError(
                f"no connection to {self.where} within {self.connect_timeout:g} s; is the server up and reachable "
                "there? (--connect-timeout sets the wait)") from None
        except OSError as exc:
            connection.close()
            raise ChatClientError(f"cannot reach {self.where} ({exc}); is `hwrun serve` running there?") from None
        connection.sock.settimeout(self.read_timeout)
        return connection

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[Any, Any]:
        connection = self._connect()
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        try:
            connection.request(method, self.prefix + path, body=json.dumps(body) if body is not None else None,
                               headers=headers)
            response = connection.getresponse()
            if response.status >= 400:
                payload = response.read(MAX_LINE_BYTES)
                connection.close()
                raise _error(response.status, payload)
        except (OSError, http.client.HTTPException) as exc:
            connection.close()
            if isinstance(exc, ChatClientError):
                raise
            raise self._failure(exc, f"{method} {path} sent no answer") from None
        return connection, response

    def _failure(self, exc: BaseException, what: str) -> ChatClientError:
        """A read that timed out or a connection the server dropped, said with the URL and the fix."""
        if isinstance(exc, (TimeoutError, socket.timeout)):
            return ChatClientError(f"{self.where}: {what} within {self.read_timeout:g} s; the server is stuck or "
                                   "overloaded (--read-timeout sets the wait)")
        return ChatClientError(f"{self.where}: the connection broke ({type(exc).__name__}: {exc or 'closed'}); "
                               "is the server still running?")

    def get(self, path: str) -> Any:
        """GET `path` and parse its JSON."""
        connection, response = self._request("GET", path)
        try:
            payload = response.read(MAX_LINE_BYTES + 1)
        except (OSError, http.client.HTTPException) as exc:
            raise self._failure(exc, f"GET {path} sent no whole answer") from None
        finally:
            connection.close()
        try:
            if len(payload) > MAX_LINE_BYTES:
                raise ValueError(f"over {MAX_LINE_BYTES:,} bytes")
            return json.loads(payload)
        except ValueError as exc:
            raise ChatClientError(f"{self.where}: GET {path} answered {_show(payload)}, not JSON ({exc}); is it an "
                                  "OpenAI-compatible server such as `hwrun serve`?") from None

    def models(self) -> list[str]:
        """The ids `GET /v1/models` lists (at least one, else `ChatClientError`)."""
        listed = self.get("/v1/models")
        data = listed.get("data") if isinstance(listed, dict) else None
        ids = [entry["id"] for entry in data if isinstance(entry, dict) and isinstance(entry.get("id"), str)] \
            if isinstance(data, list) else []
        if not ids:
            raise ChatClientError(f"{self.where}: GET /v1/models lists no model ({_show(json.dumps(listed).encode())}"
                                  "); pass the model's id with --served-model.")
        return ids

    def stream(self, path: str, body: dict[str, Any]) -> Iterator[str]:
        """POST `body` with streaming on; yields each chunk's text (chat `delta.content` or completion `text`).

        Ends at `data: [DONE]`; anything else the SSE stream holds past a comment or an event/id/retry field is a
        `ChatClientError` naming the line."""
        connection, response = self._request("POST", path, {**body, "stream": True})
        try:
            kind = response.getheader("Content-Type", "") or "(none)"
            if not kind.split(";")[0].strip().lower() == "text/event-stream":
                raise ChatClientError(
                    f"{self.where}: POST {path} answered Content-Type {kind}, not a stream (text/event-stream): "
                    f"{_show(response.read(200))}; is it an OpenAI-compatible server such as `hwrun serve`?")
            for number, data in self._events(response, path):
                if data == "[DONE]":
                    return
                yield from _texts(self.where, number, data)
        finally:
            connection.close()

    def _events(self, response: Any, path: str) -> Iterator[tuple[int, str]]:
        """(line number, data) of each Server-Sent Event, until `[DONE]` or a clear error."""
        data: list[str] = []
        number, start = 0, 0
        while True:
            try:
                raw = response.readline(MAX_LINE_BYTES + 1)
            except (OSError, http.client.HTTPException) as exc:
                raise self._failure(exc, f"POST {path} sent nothing more after line {number}") from None
            if not raw:
                if data == ["[DONE]"]:  # the last event without its blank line: still the end
                    yield start, "[DONE]"
                raise ChatClientError(
                    f"{self.where}: the stream of POST {path} ended after line {number} without `data: [DONE]`; the "
                    "answer may be cut short (the server stopped or the connection was dropped on the way)")
            number += 1
            if len(raw) > MAX_LINE_BYTES:
                raise ChatClientError(f"{self.where}: line {number} of the stream is over {MAX_LINE_BYTES:,} bytes; "
                                      "refused rather than buffered")
            try:
                line = raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError:
                raise ChatClientError(f"{self.where}: line {number} of the stream is not UTF-8 text: "
                                      f"{_show(raw)}") from None
            if not line:
                if data:
                    yield start, "\n".join(data)
                data = []
                continue
            field, _, value = line.partition(":")
            if field == "data":
                start = start if data else number
                data.append(value.removeprefix(" "))
            elif line.startswith(":") or field in _OTHER_FIELDS:
                continue  # a comment (keep-alive) or a field chat has no use for
            else:
                raise ChatClientError(
                    f"{self.where}: line {number} of the stream is not a Server-Sent Event (`data: ...`): "
                    f"{_show(raw)}; is it an OpenAI-compatible server such as `hwrun serve`?")


def _texts(where: str, number: int, data: str) -> Iterator[str]:
    """The text pieces of one chunk (line `number`), or a `ChatClientError` for an error event or a bad chunk."""
    try:
        chunk = json.loads(data)
    except ValueError as exc:
        raise ChatClientError(f"{where}: the event at line {number} is not JSON ({exc}): "
                              f"{_show(data.encode())}") from None
    if not isinstance(chunk, dict):
        raise ChatClientError(f"{where}: the event at line {number} is {type(chunk).__name__}, not a JSON object: "
                              f"{_show(data.encode())}")
    if "error" in chunk:
        error = chunk["error"]
        message = error.get("message") if isinstance(error, dict) else error
        code = error.get("code") if isinstance(error, dict) else None
        raise ChatClientError(f"the server stopped the answer: {message}" + (f" ({code})" if code else ""),
                              code=code if isinstance(code, str) else None)
    choices = chunk.get("choices", [])
    if not isinstance(choices, list):
        raise ChatClientError(f"{where}: the event at line {number} has `choices` {_show(json.dumps(choices).encode())}"
                              ", not a list")
    for choice in choices:
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta")
        text = delta.get("content") if isinstance(delta, dict) else choice.get("text")
        if text is not None and not isinstance(text, str):
            raise ChatClientError(f"{where}: the event at line {number} carries text {_show(json.dumps(text).encode())}"
                                  ", not a string")
        if text:
            yield text


def _show(payload: bytes) -> str:
    """The first 120 characters of what the server sent, quoted, for an error message."""
    text = payload.decode("utf-8", "replace").strip()
    return repr(text[:120] + ("..." if len(text) > 120 else "")) if text else "(nothing)"


def _error(status: int, payload: bytes) -> ChatClientError:
    try:
        error = json.loads(payload)["error"]
        return ChatClientError(f"HTTP {status}: {error.get('message')}", status=status, code=error.get("code"))
    except (ValueError, KeyError, TypeError, AttributeError):
        text = payload.decode("utf-8", "replace")[:200] or "(no body)"
        return ChatClientError(f"HTTP {status}: {text}", status=status)

"""A small client of hwrun serve's OpenAI API on the standard library alone (what `hwrun chat` speaks).

`ApiClient(base_url, api_key).stream(path, body)` posts with `"stream": true` and yields the text of each
Server-Sent Event chunk; closing the generator closes the connection, which cancels the request on the
server. Server errors become `ChatClientError` with the server's message.
"""

from __future__ import annotations

import http.client
import json
import urllib.parse
from collections.abc import Iterator
from typing import Any

from ..errors import ChatClientError


class ApiClient:
    """Talks to `base_url` (`http://host:port`, with or without `/v1`); `api_key` is sent as a bearer token."""

    def __init__(self, base_url: str, api_key: str | None = None, timeout: float = 600.0) -> None:
        url = urllib.parse.urlsplit(base_url if "://" in base_url else f"http://{base_url}")
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ChatClientError(f"--base-url {base_url!r} is not an http(s) URL; pass e.g. http://127.0.0.1:8000.")
        self.url = url
        self.prefix = url.path.rstrip("/").removesuffix("/v1")
        self.api_key = api_key
        self.timeout = timeout

    def _connection(self) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self.url.scheme == "https" else http.client.HTTPConnection
        return cls(self.url.hostname, self.url.port, timeout=self.timeout)

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[Any, Any]:
        connection = self._connection()
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        try:
            connection.request(method, self.prefix + path, body=json.dumps(body) if body is not None else None,
                               headers=headers)
            response = connection.getresponse()
        except OSError as exc:
            connection.close()
            raise ChatClientError(f"cannot reach {self.url.geturl()} ({exc}); is `hwrun serve` running there?") from None
        if response.status >= 400:
            payload = response.read()
            connection.close()
            raise _error(response.status, payload)
        return connection, response

    def get(self, path: str) -> Any:
        """GET `path` and parse its JSON."""
        connection, response = self._request("GET", path)
        try:
            return json.loads(response.read())
        finally:
            connection.close()

    def models(self) -> list[str]:
        """The ids `GET /v1/models` lists."""
        return [entry["id"] for entry in self.get("/v1/models").get("data", [])]

    def stream(self, path: str, body: dict[str, Any]) -> Iterator[str]:
        """POST `body` with streaming on; yields each chunk's text (chat `delta.content` or completion `text`)."""
        connection, response = self._request("POST", path, {**body, "stream": True})
        try:
            for raw in response:
                line = raw.decode("utf-8").strip()
                if not line.startswith("data:"):
                    continue
                data = line[len("data:"):].strip()
                if data == "[DONE]":
                    return
                chunk = json.loads(data)
                if "error" in chunk:
                    raise ChatClientError(f"the server stopped the answer: {chunk['error'].get('message')}")
                for choice in chunk.get("choices", []):
                    text = choice.get("delta", {}).get("content") if "delta" in choice else choice.get("text")
                    if text:
                        yield text
        finally:
            connection.close()


def _error(status: int, payload: bytes) -> ChatClientError:
    try:
        error = json.loads(payload)["error"]
        return ChatClientError(f"HTTP {status}: {error.get('message')}", status=status, code=error.get("code"))
    except (ValueError, KeyError, TypeError, AttributeError):
        text = payload.decode("utf-8", "replace")[:200] or "(no body)"
        return ChatClientError(f"HTTP {status}: {text}", status=status)

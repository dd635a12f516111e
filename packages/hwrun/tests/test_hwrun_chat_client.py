"""`hwrun chat`'s client against servers that misbehave (issue 42.6): tiny loopback servers (a socket that never
accepts or never answers, `http.server` handlers sending canned streams), no model. Every wait is bounded: the
client's own timeouts here are short, and each call runs under a watchdog so that a hang fails the test."""

from __future__ import annotations

import http.server
import json
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from hwrun.errors import ChatClientError
from hwrun.serve import client as client_module
from hwrun.serve.client import ApiClient

WATCHDOG_S = 60  # a call that has not returned by then is a hang: the test fails instead of waiting on


def _bounded(call: Callable[[], object]) -> object:
    """`call()` in a thread: its result or exception, or a failed test if it outlives WATCHDOG_S."""
    outcome: dict[str, object] = {}

    def target():
        try:
            outcome["value"] = call()
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            outcome["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(WATCHDOG_S)
    if thread.is_alive():
        pytest.fail(f"the client call did not return within {WATCHDOG_S} s")
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return outcome.get("value")


def _chunk(text: str) -> bytes:
    return b"data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": text}}]}).encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"
ERROR_EVENT = b'data: {"error": {"message": "the engine failed; see the server log", "code": "generation_failed"}}\n\n'


@contextmanager
def _server(body: bytes | Callable, content_type: str = "text/event-stream", status: int = 200,
            models: bytes = b'{"object": "list", "data": [{"id": "m", "object": "model"}]}') -> Iterator[str]:
    """An HTTP/1.0 server on a free loopback port: any GET answers `models`; any POST answers `status` with
    `body` (bytes, or a function writing to the socket file) and closes the connection."""
    release = threading.Event()

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(models)))
            self.end_headers()
            self.wfile.write(models)

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.end_headers()
            if callable(body):
                body(self.wfile, release)
            else:
                self.wfile.write(body)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        release.set()
        server.shutdown()
        server.server_close()
        thread.join(10)


def _stream(url: str, **timeouts) -> str:
    client = ApiClient(url, **({"read_timeout": 10.0} | timeouts))
    return "".join(_bounded(lambda: list(client.stream("/v1/chat/completions", {"messages": []}))))  # type: ignore[arg-type]


@contextmanager
def _silent_listener(backlog_full: bool = False) -> Iterator[str]:
    """A port that accepts connections in the kernel but whose program never answers (`backlog_full`: one that
    has filled its accept queue, so a new connection is never completed)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    filler = None
    if backlog_full:  # Linux keeps backlog+1 connections waiting; past them the SYN goes unanswered
        filler = socket.create_connection(listener.getsockname(), timeout=5)
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        if filler is not None:
            filler.close()
        listener.close()


# -------------------------------------------------------------------------------- a server that never answers


def test_a_server_that_never_answers_is_a_read_timeout_naming_the_url_and_the_option():
    with _silent_listener() as url:
        client = ApiClient(url, read_timeout=0.5)
        with pytest.raises(ChatClientError) as info:
            _bounded(client.models)
    message = str(info.value)
    assert url in message and "within 0.5 s" in message and "--read-timeout" in message


def test_a_connection_that_is_never_completed_is_a_connect_timeout_naming_the_url_and_the_option():
    with _silent_listener(backlog_full=True) as url:
        client = ApiClient(url, connect_timeout=0.5)
        with pytest.raises(ChatClientError) as info:
            _bounded(client.models)
    message = str(info.value)
    assert f"no connection to {url}" in message and "--connect-timeout" in message


def _stall_after_one_chunk(wfile, release):
    wfile.write(_chunk("Good"))
    wfile.flush()
    release.wait(WATCHDOG_S)  # says nothing more until the test ends


def test_a_stream_that_stalls_mid_answer_is_a_read_timeout_not_a_hang():
    with _server(_stall_after_one_chunk) as url, pytest.raises(ChatClientError) as info:
        _stream(url, read_timeout=0.5)
    message = str(info.value)
    assert url in message and "sent nothing more after line 2" in message and "--read-timeout" in message


@pytest.mark.parametrize("argv", [["--read-timeout", "0"], ["--read-timeout", "nan"], ["--connect-timeout", "-1"],
                                  ["--connect-timeout", "inf"]])
def test_hwrun_chat_refuses_a_bad_timeout_in_one_line(argv, capsys):
    from hwrun.cli import main

    assert main.main(["chat", "--base-url", "http://127.0.0.1:1", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"{argv[0]} " in err and "above 0 and at most 86400" in err


def test_hwrun_chat_against_a_silent_server_exits_2_in_one_line_naming_the_url(capsys):
    from hwrun.cli import main

    with _silent_listener() as url:
        assert _bounded(lambda: main.main(["chat", "--base-url", url, "--read-timeout", "0.5"])) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("hwrun: error: ") and "\n" not in err and url in err and "--read-timeout" in err


# ---------------------------------------------------------------------------------------- malformed streams


def _cut_mid_chunk(wfile, release):
    wfile.write(_chunk("Good") + b'data: {"choices": [{"delta": {"con')


MALFORMED = [
    pytest.param(b"<html>busy</html>", "text/html", "not a stream (text/event-stream)", id="not-a-stream"),
    pytest.param(b"hello there\n\n", "text/event-stream", "line 1 of the stream is not a Server-Sent Event",
                 id="not-data-lines"),
    pytest.param(_chunk("Good") + b"data: {not json\n\n" + DONE, "text/event-stream", "event at line 3 is not JSON",
                 id="invalid-json"),
    pytest.param(b"data: [1, 2]\n\n" + DONE, "text/event-stream", "is list, not a JSON object", id="not-an-object"),
    pytest.param(_chunk("Good") + ERROR_EVENT + DONE, "text/event-stream",
                 "the server stopped the answer: the engine failed; see the server log (generation_failed)",
                 id="error-event-mid-stream"),
    pytest.param(b'data: {"error": "overloaded"}\n\n' + DONE, "text/event-stream",
                 "the server stopped the answer: overloaded", id="error-event-as-a-string"),
    pytest.param(_chunk("Good") + _chunk(" day"), "text/event-stream", "ended after line 4 without `data: [DONE]`",
                 id="no-done"),
    pytest.param(_cut_mid_chunk, "text/event-stream", "without `data: [DONE]`", id="cut-mid-event"),
    pytest.param(b"data: \xff\xfe\n\n" + DONE, "text/event-stream", "line 1 of the stream is not UTF-8",
                 id="not-utf-8"),
    pytest.param(b'data: {"choices": [{"text": 5}]}\n\n' + DONE, "text/event-stream", "carries text '5', not a string",
                 id="text-not-a-string"),
    pytest.param(b'data: {"choices": {"text": "x"}}\n\n' + DONE, "text/event-stream", "not a list",
                 id="choices-not-a-list"),
]


@pytest.mark.parametrize(("body", "content_type", "words"), MALFORMED)
def test_a_malformed_stream_is_a_clear_error_naming_what_came(body, content_type, words):
    with _server(body, content_type) as url, pytest.raises(ChatClientError) as info:
        _stream(url)
    assert words in str(info.value)


def test_a_line_past_the_bound_is_refused_not_buffered(monkeypatch):
    monkeypatch.setattr(client_module, "MAX_LINE_BYTES", 1000)
    with _server(b"data: " + b"x" * 5000 + b"\n\n" + DONE) as url, pytest.raises(ChatClientError, match="over 1,000"):
        _stream(url)


@pytest.mark.parametrize(("body", "want"), [
    pytest.param(_chunk("Good") + _chunk(" day") + DONE, "Good day", id="plain"),
    pytest.param(b": keep-alive\n\nevent: message\nid: 7\nretry: 100\n" + _chunk("Good") + DONE, "Good",
                 id="comments-and-other-fields-ignored"),
    pytest.param(b"data:" + json.dumps({"choices": [{"text": "Good"}]}).encode() + b"\r\n\r\n" + b"data: [DONE]",
                 "Good", id="crlf-no-space-and-done-without-its-blank-line"),
    pytest.param(b'data: {"choices":\ndata: [{"text": "Good"}]}\n\n' + DONE, "Good", id="one-event-on-two-data-lines"),
])
def test_well_formed_streams_are_read_whole(body, want):
    with _server(body) as url:
        assert _stream(url) == want


def test_an_error_event_mid_answer_is_shown_and_the_conversation_goes_on():
    from hwrun.cli.chat import Conversation
    from hwrun.cli.main import build_parser

    with _server(_chunk("Good") + ERROR_EVENT + DONE) as url:
        args = build_parser().parse_args(["chat", "--base-url", url, "--read-timeout", "10"])
        out: list[str] = []
        conversation = Conversation(ApiClient(url, read_timeout=10), args, out.append)
        inputs = iter(["hi", "/exit"])
        assert _bounded(lambda: conversation.run(lambda prompt: next(inputs))) == 0
    text = "".join(out)
    assert "Good[error: the server stopped the answer: the engine failed; see the server log (generation_failed)]\n" \
        in text


@pytest.mark.parametrize(("listed", "words"), [({"data": []}, "lists no model"), ([1], "lists no model")])
def test_a_server_listing_no_model_asks_for_served_model(listed, words, monkeypatch):
    client = ApiClient("http://127.0.0.1:1")
    monkeypatch.setattr(client, "get", lambda path: listed)
    with pytest.raises(ChatClientError, match=f"{words}.*--served-model"):
        client.models()


def test_a_models_answer_that_is_not_json_is_a_clear_error():
    with _server(DONE, models=b"<html>welcome</html>") as url:
        with pytest.raises(ChatClientError) as info:
            _bounded(ApiClient(url, read_timeout=10).models)
    assert "GET /v1/models answered '<html>welcome</html>', not JSON" in str(info.value)

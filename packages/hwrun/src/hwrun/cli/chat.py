"""`hwrun chat`: talk to a model at the terminal, token by token, through hwrun serve's OpenAI API.

`hwrun chat` talks to a running `hwrun serve` (`--base-url`, key from `--api-key-env`); `hwrun chat --local
[MODEL]` starts the same server inside this process on a free loopback port first. A model without a
chat template is continued as plain text through /v1/completions (said once). Commands: /reset, /exit.
Ctrl-C stops the answer being streamed (the server cancels it); Ctrl-D or /exit leaves. Every wait is bounded
(`--connect-timeout`, `--read-timeout`); a server that stalls, drops the stream or sends what is not an OpenAI
stream is an error naming the URL and the option (issue 42.6). Importing this module imports neither torch,
starlette nor uvicorn.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from ..serve.client import CONNECT_TIMEOUT_S, READ_TIMEOUT_S  # the standard library only
from .main import _add_plan_options, _plan_from

PROMPT = ">>> "


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the `chat` subcommand on `hwrun`'s subparsers (called by hwrun.cli)."""
    p = subparsers.add_parser(
        "chat", help="chat with a model at the terminal through hwrun serve's API (or --local, in-process)",
        description="An interactive client of hwrun serve: type a message, the answer streams back. "
                    "Commands: /reset (forget the conversation), /exit. Ctrl-C stops an answer, Ctrl-D exits.")
    p.add_argument("model", nargs="?", default=None,
                   help="with --local: local folder or Hub id to load (default: the shipped tiny model)")
    p.add_argument("--base-url", default="http://127.0.0.1:8000", help="the server (default http://127.0.0.1:8000)")
    p.add_argument("--api-key-env", default=None, metavar="VAR", help="environment variable holding the API key")
    p.add_argument("--served-model", default=None, metavar="ID",
                   help="model id to ask for (default: the first GET /v1/models lists)")
    p.add_argument("--local", action="store_true",
                   help="load MODEL in this process (a server on a free 127.0.0.1 port) instead of --base-url")
    _add_plan_options(p)
    p.add_argument("--system", default=None, help="a system message opening the conversation")
    p.add_argument("--max-tokens", type=int, default=256, help="new tokens per answer at most (default 256)")
    p.add_argument("--temperature", type=float, default=0.7, help="sampling temperature (0: greedy; default 0.7)")
    p.add_argument("--connect-timeout", type=float, default=CONNECT_TIMEOUT_S, metavar="SECONDS",
                   help=f"seconds to connect to the server before giving up (default {CONNECT_TIMEOUT_S:g})")
    p.add_argument("--read-timeout", type=float, default=READ_TIMEOUT_S, metavar="SECONDS",
                   help=f"seconds without a byte from the server before giving up on an answer (default "
                        f"{READ_TIMEOUT_S:g}, hwrun serve's --stall-seconds; raise it for long queues)")
    p.set_defaults(func=run_chat)
    return p


def run_chat(args: argparse.Namespace, *, read: Callable[[str], str] = input,
             write: Callable[[str], None] | None = None) -> int:
    """Carry out `hwrun chat` for parsed `args` (`read`/`write` replace the terminal in tests)."""
    from ..errors import ServeConfigError
    from ..serve.client import ApiClient
    from ..serve.config import read_api_key

    write = write or _write
    if args.max_tokens <= 0:
        raise ServeConfigError(f"--max-tokens {args.max_tokens} must be a positive integer.")
    if not 0 <= args.temperature <= 2:
        raise ServeConfigError(f"--temperature {args.temperature} must be between 0 and 2 (0: greedy).")
    timeouts = {"connect_timeout": args.connect_timeout, "read_timeout": args.read_timeout}
    ApiClient("http://127.0.0.1", **timeouts)  # refuses a bad timeout before a --local model loads
    key = read_api_key(args.api_key_env)
    local = None
    if args.local:
        local = _start_local(args)
        client = ApiClient(local.url, **timeouts)
    else:
        if args.model is not None:
            raise ServeConfigError(f"MODEL {args.model!r} is only for --local (loaded in this process); to talk "
                                   "to a server, pass --base-url and, if needed, --served-model.")
        client = ApiClient(args.base_url, key, **timeouts)
    try:
        return Conversation(client, args, write).run(read)
    finally:
        if local is not None:
            local.stop()


def _start_local(args: argparse.Namespace) -> Any:
    from ..serve.config import DEFAULT_MODEL_ID, ServeConfig
    from ..serve.server import ServerThread

    plan = _plan_from(args, args.model)
    config = ServeConfig(port=0, max_concurrency=1, max_queue=0, grace_seconds=5,
                         model_id=args.model or DEFAULT_MODEL_ID)
    return ServerThread(config, plan, say=lambda line: None).start()


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


class Conversation:
    """The read-answer loop: keeps the messages, streams each answer, falls back to completions."""

    def __init__(self, client: Any, args: argparse.Namespace, write: Callable[[str], None]) -> None:
        self.client, self.args, self.write = client, args, write
        self.model = args.served_model or (client.models() or [None])[0]
        self.opening = [{"role": "system", "content": args.system}] if args.system else []
        self.messages = list(self.opening)
        self.plain = False  # True once the model turned out to have no chat template

    def run(self, read: Callable[[str], str]) -> int:
        """Until /exit or end of input; returns 0."""
        self.write(f"chatting with {self.model} (/reset, /exit; Ctrl-C stops an answer)\n")
        while True:
            try:
                line = read(PROMPT)
            except EOFError:
                self.write("\n")
                return 0
            text = line.strip()
            if text in ("/exit", "/quit"):
                return 0
            if text == "/reset":
                self.messages = list(self.opening)
                self.write("(conversation cleared)\n")
                continue
            if text:
                self.answer(text)

    def answer(self, text: str) -> str:
        """Stream the answer to `text` and keep both in the conversation."""
        from ..errors import ChatClientError

        options = {"model": self.model, "max_tokens": self.args.max_tokens, "temperature": self.args.temperature}
        pieces: list[str] = []
        try:
            for piece in self._stream(text, options):
                pieces.append(piece)
                self.write(piece)
        except KeyboardInterrupt:
            self.write(" [stopped]")
        except ChatClientError as exc:
            self.write(f"[error: {exc}]")
        self.write("\n")
        reply = "".join(pieces)
        if not self.plain:
            self.messages += [{"role": "user", "content": text}, {"role": "assistant", "content": reply}]
        return reply

    def _stream(self, text: str, options: dict[str, Any]):
        from ..errors import ChatClientError

        if not self.plain:
            try:
                yield from self.client.stream("/v1/chat/completions",
                                              {**options, "messages": [*self.messages, {"role": "user", "content": text}]})
                return
            except ChatClientError as exc:
                if exc.code != "chat_template_missing":
                    raise
                self.plain = True
                self.write("(this model has no chat template: each message is continued as plain text)\n")
        yield from self.client.stream("/v1/completions", {**options, "prompt": text})

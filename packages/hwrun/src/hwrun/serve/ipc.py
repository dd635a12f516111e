"""What the HTTP front and the engine core say to each other, and the sockets that carry it.

Two ZeroMQ sockets over Unix-domain sockets (`ipc://` in a private temporary folder): the front PUSHes
requests, cancels and the shutdown to the core; the core PUSHes its messages back: `Progress` lines while it
starts (the slot engine's warm-up, bucket by bucket), `Ready` once the model is loaded and warm, one `Batch` per engine step (every event of that step, and its counters), `Failed` when it
stops on an error. Messages are msgspec structs encoded as MessagePack arrays (vLLM V1's engine core and
client do the same). A PUSH socket queues in ZeroMQ's own I/O thread with no high-water mark, so the core's
`send` returns at once whatever the front is doing: the engine never waits on the HTTP side. Chosen over
`multiprocessing.Pipe` with pickle by measurement (`tools/bench/serve_ipc.py`, docs/benchmarks/serve_ipc.json;
hwrun's README, Serve).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

import msgspec
import zmq

#: Seconds the front's send waits for the core to be connected (a PUSH socket without a peer holds messages).
CONNECT_WAIT = 1.0
#: One token's logprobs: (its logprob, [(token id, logprob) of the most likely, most likely first]).
LogprobTuple = tuple[float, list[tuple[int, float]]]
#: One event of a step: (request id, new token ids, finished, finish reason or None, error text or None, the
#: choice's index, one LogprobTuple per token id or None when the request asked for none).
EventTuple = tuple[str, list[int], bool, str | None, str | None, int, list[LogprobTuple] | None]


class AddRequest(msgspec.Struct, array_like=True, tag="add"):
    """A request for the core's waiting queue: its prompt, budget and every sampling field of
    `hwrun.serve.protocol.Sampling` (`structured`: (kind, schema JSON or None) or None), its `n` choices, extra stop
    ids and LoRA adapter."""

    request_id: str
    input_ids: list[int]
    max_new_tokens: int
    temperature: float
    top_p: float
    top_k: int
    seed: int | None
    ignore_eos: bool
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: list[tuple[int, float]] = []
    logprobs: int | None = None
    structured: tuple[str, str | None] | None = None
    n: int = 1
    stop_token_ids: list[int] = []
    adapter: str | None = None


class Cancel(msgspec.Struct, array_like=True, tag="cancel"):
    """Drop these requests (waiting or running) at the core's next turn."""

    request_ids: list[str]


class Shutdown(msgspec.Struct, array_like=True, tag="shutdown"):
    """Cancel whatever runs, close the backend and exit."""


class Progress(msgspec.Struct, array_like=True, tag="progress"):
    """One line of the core's start (e.g. `warm-up: bucket 3/6 (...)`), said in the server's start-up log."""

    text: str


class Ready(msgspec.Struct, array_like=True, tag="ready"):
    """The model is loaded and warm. `info`: the load's facts (engine and why, context, EOS ids, threads,
    seconds); `tokenizer`: the tokenizer the core loaded, pickled (the front tokenizes and detokenizes with it),
    or empty when the core runs in a thread of the front's process (it is shared then)."""

    info: dict[str, Any]
    tokenizer: bytes
    pid: int


class Batch(msgspec.Struct, array_like=True, tag="batch"):
    """One engine turn: its events (possibly none: a heartbeat) and the core's counters after it; `kv`: the slot
    engine's KV use (`hwrun.inference.engine.kv_memory.KVStats.as_list`: six ints), None for a backend without
    blocks."""

    events: list[EventTuple]
    running: int
    waiting: int
    free_slots: int
    steps: int
    kv: list[int] | None = None


class Failed(msgspec.Struct, array_like=True, tag="failed"):
    """The core stopped on an error: `text` for the log, `error` the exception pickled (empty if it cannot be),
    `was_ready` whether it had served (a runtime failure, not a start's)."""

    text: str
    error: bytes
    was_ready: bool


ToCore = AddRequest | Cancel | Shutdown
FromCore = Progress | Ready | Batch | Failed


class Channel:
    """One side's two sockets: `send(message)` to the other side, `recv(timeout)` from it (None on timeout).

    The front binds (`Channel.bind()`), the core connects (`Channel.connect(addresses, side="core")`). A socket
    is used from one thread at a time (ZeroMQ's rule): the front guards its sending socket with a lock."""

    def __init__(self, context: zmq.Context, out: zmq.Socket, inp: zmq.Socket, folder: str | None,
                 addresses: tuple[str, str], decode_as: Any) -> None:
        self.context, self.out, self.inp, self.folder, self.addresses = context, out, inp, folder, addresses
        self._encode = msgspec.msgpack.Encoder().encode
        self._decode = msgspec.msgpack.Decoder(decode_as).decode
        self.poller = zmq.Poller()
        self.poller.register(inp, zmq.POLLIN)

    @classmethod
    def bind(cls) -> Channel:
        """The front's side: two `ipc://` sockets in a new folder only this user can enter."""
        folder = tempfile.mkdtemp(prefix="hwrun-serve-")
        os.chmod(folder, 0o700)
        to_core, from_core = f"ipc://{folder}/to-core", f"ipc://{folder}/from-core"
        context = zmq.Context()
        out = _socket(context, zmq.PUSH)
        out.setsockopt(zmq.SNDTIMEO, int(CONNECT_WAIT * 1000))
        out.bind(to_core)
        inp = _socket(context, zmq.PULL)
        inp.bind(from_core)
        return cls(context, out, inp, folder, (to_core, from_core), FromCore)

    @classmethod
    def connect(cls, addresses: tuple[str, str]) -> Channel:
        """The core's side of the front's `addresses` (to-core, from-core)."""
        context = zmq.Context()
        inp = _socket(context, zmq.PULL)
        inp.connect(addresses[0])
        out = _socket(context, zmq.PUSH)
        out.connect(addresses[1])
        return cls(context, out, inp, None, addresses, ToCore)

    def send(self, message: Any) -> bool:
        """Queue `message` for the other side. With a peer connected it returns at once (no high-water mark); the
        front's socket, while the core has not connected yet (or is gone), waits up to `CONNECT_WAIT` seconds, then
        drops the message and returns False. The core's (connecting) socket always queues."""
        try:
            self.out.send(self._encode(message), copy=True)
        except zmq.Again:
            return False
        return True

    def recv(self, timeout: float | None) -> Any | None:
        """The next message, waiting up to `timeout` seconds (None: forever; 0: not at all); None if none came."""
        if timeout is not None and not self.poller.poll(int(timeout * 1000)):
            return None
        return self._decode(self.inp.recv())

    def recv_ready(self) -> list[Any]:
        """Every message already waiting (without blocking)."""
        out = []
        while True:
            try:
                data = self.inp.recv(zmq.NOBLOCK)
            except zmq.Again:
                return out
            out.append(self._decode(data))

    def close(self, linger: float = 0.0) -> None:
        """Close both sockets and the context and remove the folder; messages not yet sent go out for up to
        `linger` seconds (the core's last batch and its `Failed`), then are dropped."""
        self.out.close(linger=int(linger * 1000))
        self.inp.close(linger=0)
        self.context.term()
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)


def _socket(context: zmq.Context, kind: int) -> zmq.Socket:
    socket = context.socket(kind)
    socket.setsockopt(zmq.SNDHWM, 0)  # no limit: a send never blocks (the engine never waits on the front)
    socket.setsockopt(zmq.RCVHWM, 0)
    socket.setsockopt(zmq.LINGER, 0)
    return socket

"""IPC for `hwrun serve`'s engine process: which transport carries a step's token batch fastest on this machine.

    uv run --with pyzmq --with msgspec python tools/bench/serve_ipc.py --out docs/benchmarks/serve_ipc.json

Candidates (each between this process and a spawned child, as `hwrun serve`'s front and engine core are):
- `zmq+msgspec`: pyzmq PUSH/PULL sockets over `ipc://` (a Unix socket), messages encoded with msgspec's
  MessagePack encoder into arrays (what vLLM V1's engine core and its client use);
- `pipe+pickle`: `multiprocessing.Pipe` (`Connection.send` / `recv`, which pickle);
- `zmq+pickle` and `pipe+msgspec`: the two crossings, to tell the transport's share from the encoding's.

A batch is one engine step's events at `--streams` concurrent requests: per request its id (a 28-character
string like `cmpl-...`), its new token ids (one) and finished/finish-reason fields, plus the step's counters.
Round trip: the front sends an add-request message, the child answers with one batch; `--rounds` times, p50/p99.
Throughput: the child pushes `--messages` batches as fast as it can, the front receives and decodes each one
(objects as the front would use them); batches/s and events/s. Unread: the child sends 200 batches while the front
reads nothing for 0.5 s; `unread_sends_s` is how long the child's sends took (the engine must never wait on the front).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import pickle
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_record import stamp  # noqa: E402

CANDIDATES = ("zmq+msgspec", "pipe+pickle", "zmq+pickle", "pipe+msgspec")
#: The engine must not wait on the front: the child sends this many batches while the front reads nothing for
#: `UNREAD_PAUSE` seconds; `unread_sends_s` is how long the child's sends took (a blocking transport: the pause).
UNREAD_BATCHES, UNREAD_PAUSE = 200, 0.5
#: Round trips before the timed ones.
WARMUP = 50


def make_batch(streams: int, step: int) -> list:
    """One step's events as the engine core sends them: [[rid, [tokens], finished, reason], ...] and counters."""
    events = [[f"cmpl-{i:023d}", [1000 + step % 3000], False, None] for i in range(streams)]
    return ["batch", events, {"running": streams, "waiting": 0, "steps": step, "generation_tokens": step * streams}]


def _codec(name: str):
    if name.endswith("msgspec"):
        import msgspec

        return msgspec.msgpack.Encoder().encode, msgspec.msgpack.Decoder().decode
    return (lambda obj: pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)), pickle.loads


def child(name: str, address: str | None, conn, streams: int, rounds: int, messages: int) -> None:
    encode, decode = _codec(name)
    if name.startswith("zmq"):
        import zmq

        ctx = zmq.Context()
        out = ctx.socket(zmq.PUSH)
        out.connect(address + "-out")
        inp = ctx.socket(zmq.PULL)
        inp.connect(address + "-in")
        send, recv = out.send, inp.recv
    else:
        send, recv = conn.send_bytes, conn.recv_bytes
    batch = make_batch(streams, 1)
    for _ in range(rounds + WARMUP):
        decode(recv())
        send(encode(batch))
    decode(recv())  # the go for the throughput phase
    for step in range(messages):
        send(encode(make_batch(streams, step)))
    decode(recv())  # the go for the unread phase: the front reads nothing for UNREAD_PAUSE seconds
    start = time.perf_counter()
    for step in range(UNREAD_BATCHES):
        send(encode(make_batch(streams, step)))
    send(encode(["sent", time.perf_counter() - start]))
    decode(recv())


def measure(name: str, streams: int, rounds: int, messages: int) -> dict:
    encode, decode = _codec(name)
    ctx = mp.get_context("spawn")
    address = None
    parent_conn = child_conn = None
    folder = tempfile.mkdtemp(prefix="hwrun-ipc-")
    if name.startswith("zmq"):
        import zmq

        zctx = zmq.Context()
        address = f"ipc://{folder}/bench"
        inp = zctx.socket(zmq.PULL)
        inp.bind(address + "-out")
        out = zctx.socket(zmq.PUSH)
        out.bind(address + "-in")
        send, recv = out.send, inp.recv
    else:
        parent_conn, child_conn = ctx.Pipe(duplex=True)
        send, recv = parent_conn.send_bytes, parent_conn.recv_bytes
    process = ctx.Process(target=child, args=(name, address, child_conn, streams, rounds, messages), daemon=True)
    process.start()
    request = ["add", "cmpl-" + "0" * 23, list(range(40)), 64, [0.0, 1.0, 0, None], False]
    times = []
    for _ in range(rounds + WARMUP):
        start = time.perf_counter()
        send(encode(request))
        decode(recv())
        times.append(time.perf_counter() - start)
    times = sorted(times[WARMUP:])
    size = len(encode(make_batch(streams, 1)))
    send(encode(["go"]))
    start = time.perf_counter()
    events = 0
    for _ in range(messages):
        message = decode(recv())
        events += len(message[1])
    elapsed = time.perf_counter() - start
    send(encode(["unread"]))
    time.sleep(UNREAD_PAUSE)
    for _ in range(UNREAD_BATCHES):
        decode(recv())
    blocked = decode(recv())[1]
    send(encode(["stop"]))
    process.join(30)
    return {"candidate": name, "streams": streams, "batch_bytes": size,
            "round_trip_us_p50": round(1e6 * statistics.median(times), 1),
            "round_trip_us_p99": round(1e6 * times[int(0.99 * (len(times) - 1))], 1),
            "batches_per_s": round(messages / elapsed), "events_per_s": round(events / elapsed),
            "unread_sends_s": round(blocked, 4)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", default="1,16,64")
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--messages", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    rows = []
    for repeat in range(args.repeats):
        for streams in [int(s) for s in args.streams.split(",")]:
            for name in CANDIDATES:
                row = measure(name, streams, args.rounds, args.messages)
                row["repeat"] = repeat
                rows.append(row)
                print(json.dumps(row), flush=True)
    import msgspec
    import zmq

    report = {"what": "hwrun serve engine-core IPC: one step's token batch, front <-> spawned child",
              "host": {"cpus": os.cpu_count(), "python": sys.version.split()[0], "machine": platform.machine(),
                       "pyzmq": zmq.__version__, "libzmq": zmq.zmq_version(), "msgspec": msgspec.__version__},
              "settings": {"rounds": args.rounds, "messages": args.messages, "repeats": args.repeats},
              "rows": rows}
    if args.out is not None:
        stamp(report, libraries=("zmq", "msgspec"), accelerator=False)  # host IPC only: no device in it
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

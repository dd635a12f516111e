"""Soak `hwrun serve`: many streams for minutes, clients leaving at random points, memory and open files flat.

Starts the real `hwrun serve` (its HTTP front and its engine-core process, the shipped tiny model, CPU) on a free
loopback port and keeps `--streams` clients busy. Each client, seeded, picks per request: a stream read to its
end, a stream it closes after a random number of chunks (none included), a whole answer, or a whole answer it
leaves before it comes. After a warm-up the load pauses until the server is idle and both processes' RSS and
open file descriptors are read (the baseline); after the soak the same again (the final reading). It fails when
a request hangs (no byte for --request-timeout s), fails or is refused, when the server's own count of requests
differs from the clients', when a request is left running or queued, when either process's RSS grew past the
bound or it holds more descriptors than at the baseline, or when SIGTERM does not end both processes with exit 0.

Run: python tools/soak_serve.py                     (10 minutes, 64 streams; the figures in docs/reliability.md)
     python tools/soak_serve.py --minutes 1 --streams 16 --json soak.json
CI runs a bounded version: packages/hwrun/tests/test_hwrun_serve_soak.py.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

#: RSS growth allowed per process between the idle baseline and the idle end: CPython's allocator keeps freed
#: arenas and torch its caches, so a flat process still moves by a few MiB; a leak of a few KiB per request
#: over the thousands of requests of a soak passes it.
RSS_BOUND_MIB = 16
#: Open descriptors allowed above the baseline (none: an idle server holds no request's socket or pipe).
FD_SLACK = 0
PROMPTS = ("The king said", "Once upon a time", "In the beginning the castle", "The queen asked the knight why",
           "A long road ran north from the village, and along it")
ACTIONS = ("stream", "stream_cut", "whole", "whole_cut")
WEIGHTS = (3, 4, 2, 1)


@dataclass
class Reading:
    """RSS (MiB) and open descriptors of the HTTP front and the engine core at one moment."""

    front_rss_mib: float
    core_rss_mib: float
    front_fds: int
    core_fds: int


@dataclass
class SoakReport:
    """What a soak measured, and the problems it found (empty: it passed)."""

    streams: int
    seconds: float
    warmup_seconds: float
    seed: int
    requests: dict[str, int] = field(default_factory=dict)  # the clients' outcomes
    server: dict[str, int] = field(default_factory=dict)  # the server's hwrun_requests_total by outcome
    baseline: Reading | None = None
    final: Reading | None = None
    peak: Reading | None = None
    exit_code: int | None = None
    problems: list[str] = field(default_factory=list)
    started_utc: str = ""
    cores: int = 0  # the cores this process may use
    load_average: tuple[float, float] = (0.0, 0.0)  # the 1-minute load average at the start and at the end

    def summary(self) -> str:
        """A few lines for the terminal."""
        total = sum(self.requests.values())
        lines = [f"soak ({self.started_utc}, {self.cores} cores, load {self.load_average[0]} -> "
                 f"{self.load_average[1]}): {self.streams} streams, {self.seconds:.0f} s after a "
                 f"{self.warmup_seconds:.0f} s warm-up, seed {self.seed}: {total} requests {self.requests}; server "
                 f"counted {self.server}"]
        for name, reading in (("baseline", self.baseline), ("final", self.final), ("peak", self.peak)):
            if reading:
                lines.append(f"  {name:8} front {reading.front_rss_mib:.1f} MiB, {reading.front_fds} fds; core "
                             f"{reading.core_rss_mib:.1f} MiB, {reading.core_fds} fds")
        lines.append(f"  SIGTERM: exit {self.exit_code}")
        lines += [f"  PROBLEM: {problem}" for problem in self.problems] or ["  passed"]
        return "\n".join(lines)


def _read(pid: int) -> tuple[float, int]:
    status = Path(f"/proc/{pid}/status").read_text()
    rss_kib = int(re.search(r"^VmRSS:\s+(\d+) kB", status, re.M).group(1))
    return rss_kib / 1024, len(os.listdir(f"/proc/{pid}/fd"))


def reading(front: int, core: int) -> Reading:
    """Both processes' RSS and descriptor counts now."""
    (front_rss, front_fds), (core_rss, core_fds) = _read(front), _read(core)
    return Reading(round(front_rss, 1), round(core_rss, 1), front_fds, core_fds)


class Server:
    """`hwrun serve` in a child process; `port`, `pid` (the front) and `core` (the engine process) once ready."""

    def __init__(self, *options: str, start_timeout: float = 300) -> None:
        command = [sys.executable, "-c", "import sys; from hwrun.cli.main import main; sys.exit(main())", "serve",
                   "--port", "0", *options]
        self.lines: list[str] = []
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.reader = threading.Thread(target=lambda: self.lines.extend(iter(self.process.stderr.readline, "")),
                                       daemon=True)
        self.reader.start()
        deadline = time.monotonic() + start_timeout
        while not any("ready:" in line for line in self.lines):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError("hwrun serve did not get ready:\n" + "".join(self.lines[-20:]))
            time.sleep(0.1)
        text = "".join(self.lines)
        self.port = int(re.search(r"listening on http://127\.0\.0\.1:(\d+)", text).group(1))
        self.core = int(re.search(r"engine core: its own process \(pid (\d+)\)", text).group(1))
        self.pid = self.process.pid
        self.model = json.loads(self.get("/v1/models"))["data"][0]["id"]

    def get(self, path: str) -> str:
        """The body of GET `path`."""
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            connection.request("GET", path)
            return connection.getresponse().read().decode()
        finally:
            connection.close()

    def metrics(self) -> dict[str, float]:
        """The server's /metrics as `name{labels}` -> value."""
        return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in self.get("/metrics").splitlines()
                if line and not line.startswith("#")}

    def wait_idle(self, timeout: float = 60) -> bool:
        """Until nothing runs or waits in the engine (True), or `timeout` seconds (False)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            values = self.metrics()
            if values.get("hwrun_running_requests") == 0 and values.get("hwrun_queue_depth") == 0:
                return True
            time.sleep(0.2)
        return False

    def stop(self, timeout: float = 60) -> int | None:
        """SIGTERM, then the exit code (None: still running after `timeout` s, then killed)."""
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def kill(self) -> None:
        """SIGKILL the front and the engine core (their ids only)."""
        for pid in (getattr(self, "core", None), self.process.pid):
            if pid:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self.process.wait(30)


def _one_request(port: int, model: str, rng: random.Random, timeout: float) -> str:
    """One request of a random kind; its outcome: finished, cancelled (the client left), refused, failed, hang."""
    action = rng.choices(ACTIONS, WEIGHTS)[0]
    stream = action.startswith("stream")
    body = {"model": model, "prompt": rng.choice(PROMPTS), "max_tokens": rng.randint(4, 48), "stream": stream,
            "temperature": rng.choice((0, 0.8)), "ignore_eos": True}
    cut_after = rng.randint(0, body["max_tokens"]) if action == "stream_cut" else None
    leave_after = rng.uniform(0, 0.3) if action == "whole_cut" else None
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request("POST", "/v1/completions", body=json.dumps(body),
                           headers={"Content-Type": "application/json"})
        if leave_after is not None:
            time.sleep(leave_after)
            return "cancelled"
        response = connection.getresponse()
        if response.status in (429, 503):
            return "refused"
        if response.status != 200:
            return "failed"
        if cut_after == 0:
            return "cancelled"  # left as soon as the stream started, before any token
        if not stream:
            answer = json.loads(response.read())
            return "finished" if answer["choices"][0]["finish_reason"] in ("length", "stop") else "failed"
        chunks = 0
        for raw in response:
            line = raw.strip()
            if line == b"data: [DONE]":
                return "finished"
            if line.startswith(b"data: "):
                if b'"error"' in line:
                    return "failed"
                chunks += 1
                if cut_after is not None and chunks >= cut_after:
                    return "cancelled"
        return "failed"  # the stream ended without [DONE]
    except TimeoutError:
        return "hang"
    except (OSError, http.client.HTTPException, ValueError):
        return "failed"
    finally:
        connection.close()


def _load(server: Server, streams: int, seconds: float, seed: int, timeout: float, outcomes: dict[str, int],
          lock: threading.Lock, peak: list[Reading]) -> None:
    """`streams` clients for `seconds`; every request's outcome counted into `outcomes`; readings into `peak`."""
    stop = threading.Event()

    def client(index: int) -> None:
        rng = random.Random(seed * 100_003 + index)
        while not stop.is_set():
            outcome = _one_request(server.port, server.model, rng, timeout)
            with lock:
                outcomes[outcome] = outcomes.get(outcome, 0) + 1

    threads = [threading.Thread(target=client, args=(index,), daemon=True) for index in range(streams)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        peak.append(reading(server.pid, server.core))
        time.sleep(min(2.0, max(0.0, deadline - time.monotonic())))
    stop.set()
    for thread in threads:
        thread.join(timeout + 30)  # every request is bounded by `timeout`: a thread still alive is a hang
    alive = sum(thread.is_alive() for thread in threads)
    if alive:
        with lock:
            outcomes["hang"] = outcomes.get("hang", 0) + alive


def soak(seconds: float, streams: int = 64, *, warmup_seconds: float = 30, seed: int = 0,
         request_timeout: float = 60, rss_bound_mib: float = RSS_BOUND_MIB, fd_slack: int = FD_SLACK) -> SoakReport:
    """Run the soak and return its report (`report.problems` empty: it passed)."""
    report = SoakReport(streams, seconds, warmup_seconds, seed, started_utc=time.strftime("%Y-%m-%d %H:%M UTC",
                                                                                         time.gmtime()),
                        cores=len(os.sched_getaffinity(0)))
    load_at_start = os.getloadavg()[0]
    server = Server("--max-concurrency", str(min(streams, 16)), "--max-queue", str(streams), "--grace-seconds", "10")
    lock, peaks = threading.Lock(), []
    try:
        warm: dict[str, int] = {}
        _load(server, streams, warmup_seconds, seed + 1, request_timeout, warm, lock, [])
        if not server.wait_idle():
            report.problems.append("requests still running or queued 60 s after the warm-up's clients stopped")
        time.sleep(1.0)  # the last closed connections' sockets leave the front
        report.baseline = reading(server.pid, server.core)
        before = _server_counts(server)
        _load(server, streams, seconds, seed, request_timeout, report.requests, lock, peaks)
        if not server.wait_idle():
            report.problems.append("requests still running or queued 60 s after the clients stopped")
        report.final = _settled(server, report.baseline)
        report.server = {key: count - before.get(key, 0) for key, count in _server_counts(server).items()
                         if count - before.get(key, 0)}
    finally:
        report.exit_code = server.stop()
        core_left = Path(f"/proc/{server.core}").exists() and "\nState:\tZ" not in _status(server.core)
        if core_left:
            report.problems.append(f"the engine process {server.core} is still running after the server stopped")
            server.kill()
    report.peak = Reading(*(max(getattr(r, name) for r in peaks) for name in Reading.__dataclass_fields__)) \
        if peaks else None
    report.load_average = (round(load_at_start, 1), round(os.getloadavg()[0], 1))
    _judge(report, rss_bound_mib, fd_slack)
    return report


def _settled(server: Server, baseline: Reading, timeout: float = 10) -> Reading:
    """The idle reading once the sockets of the last connections have closed (a leaked descriptor stays past
    `timeout` seconds; one the front is still closing does not)."""
    deadline = time.monotonic() + timeout
    while True:
        now = reading(server.pid, server.core)
        if (now.front_fds <= baseline.front_fds and now.core_fds <= baseline.core_fds) or time.monotonic() > deadline:
            return now
        time.sleep(0.5)


def _status(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return "\nState:\tZ"


def _server_counts(server: Server) -> dict[str, int]:
    counts: dict[str, int] = {}
    for key, value in server.metrics().items():
        match = re.fullmatch(r'hwrun_requests_total\{endpoint="completions",outcome="([^"]+)"\}', key)
        if match:
            counts[match.group(1)] = int(value)
    return counts


def _judge(report: SoakReport, rss_bound_mib: float, fd_slack: int) -> None:
    """Add a problem for each way the soak failed."""
    bad = {key: count for key, count in report.requests.items() if key not in ("finished", "cancelled")}
    if bad:
        report.problems.append(f"requests neither finished nor cancelled by their client: {bad}")
    if not report.requests.get("finished") or not report.requests.get("cancelled"):
        report.problems.append(f"the load did not both finish and cancel requests: {report.requests}")
    if sum(report.server.values()) != sum(report.requests.values()):
        report.problems.append(f"the server counted {sum(report.server.values())} requests {report.server}, the "
                               f"clients sent {sum(report.requests.values())}")
    if set(report.server) - {"ok", "cancelled"}:
        report.problems.append(f"the server answered requests otherwise than ok or cancelled: {report.server}")
    if report.baseline and report.final:
        for side in ("front", "core"):
            grew = getattr(report.final, f"{side}_rss_mib") - getattr(report.baseline, f"{side}_rss_mib")
            if grew > rss_bound_mib:
                report.problems.append(f"the {side}'s RSS grew {grew:.1f} MiB between the idle baseline and the idle "
                                       f"end (bound {rss_bound_mib} MiB)")
            extra = getattr(report.final, f"{side}_fds") - getattr(report.baseline, f"{side}_fds")
            if extra > fd_slack:
                report.problems.append(f"the {side} holds {extra} more open descriptors idle at the end than at the "
                                       f"baseline ({getattr(report.baseline, f'{side}_fds')})")
    if report.exit_code != 0:
        report.problems.append(f"SIGTERM ended the server with exit {report.exit_code}, not 0")


def main(argv: list[str] | None = None) -> int:
    """Run the soak from the command line; exit 1 when it found a problem."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="soak length after the warm-up (default 10)")
    parser.add_argument("--streams", type=int, default=64, help="concurrent clients (default 64)")
    parser.add_argument("--warmup-seconds", type=float, default=60.0, help="load before the baseline (default 60)")
    parser.add_argument("--seed", type=int, default=0, help="seeds each client's choices (default 0)")
    parser.add_argument("--request-timeout", type=float, default=60.0,
                        help="seconds without a byte before a request counts as a hang (default 60)")
    parser.add_argument("--rss-bound-mib", type=float, default=RSS_BOUND_MIB,
                        help=f"RSS growth allowed per process (default {RSS_BOUND_MIB})")
    parser.add_argument("--json", default=None, metavar="FILE", help="also write the report as JSON")
    args = parser.parse_args(argv)
    if args.minutes <= 0 or args.streams < 1 or args.warmup_seconds < 0:
        parser.error("--minutes must be above 0, --streams at least 1, --warmup-seconds at least 0")
    report = soak(args.minutes * 60, args.streams, warmup_seconds=args.warmup_seconds, seed=args.seed,
                  request_timeout=args.request_timeout, rss_bound_mib=args.rss_bound_mib)
    print(report.summary())
    if args.json:
        Path(args.json).write_text(json.dumps(asdict(report), indent=2) + "\n")
    return 1 if report.problems else 0


if __name__ == "__main__":
    sys.exit(main())

"""`/metrics`: counters, gauges and histograms in Prometheus' text exposition format (version 0.0.4), by hand.

Updated only on the server's event loop (one thread), so no locks. Names follow Prometheus' conventions
(`_total` counters, `_seconds` histograms with cumulative `le` buckets, `_sum` and `_count`).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence

#: Time-to-first-token buckets (seconds): a warm GPU answers in milliseconds, a loaded CPU in seconds.
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
#: Inter-token latency buckets (seconds).
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.1, 0.25, 0.5, 1.0, 2.5)
#: Whole-request duration buckets (seconds).
DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Histogram:
    """A cumulative histogram over fixed `buckets` (upper bounds, seconds)."""

    def __init__(self, buckets: Sequence[float]) -> None:
        self.buckets = tuple(buckets)
        self.counts = [0] * (len(self.buckets) + 1)  # the last one is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float, times: int = 1) -> None:
        """Record `value` `times` times."""
        self.counts[bisect.bisect_left(self.buckets, value)] += times
        self.sum += value * times
        self.count += times

    def lines(self, name: str) -> list[str]:
        """Its `_bucket`, `_sum` and `_count` samples."""
        out, running = [], 0
        for bound, count in zip((*self.buckets, float("inf")), self.counts, strict=True):
            running += count
            out.append(f'{name}_bucket{{le="{_bound(bound)}"}} {running}')
        out += [f"{name}_sum {self.sum:.6f}", f"{name}_count {self.count}"]
        return out


class Metrics:
    """What `/metrics` reports. `queue_depth`, `running`, `steps` and `kv_stats` are read from the engine when
    rendered (the engine core sends them with every token batch and heartbeat)."""

    def __init__(self, queue_depth: Callable[[], int] = lambda: 0, running: Callable[[], int] = lambda: 0,
                 steps: Callable[[], int] = lambda: 0,
                 kv_stats: Callable[[], Sequence[int] | None] = lambda: None) -> None:
        self.requests: dict[tuple[str, str], int] = {}  # (endpoint, outcome) -> count
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.duration = Histogram(DURATION_BUCKETS)
        self.queue_depth = queue_depth
        self.running = running
        self.steps = steps
        self.kv_stats = kv_stats  # the slot engine's KV use (`KVStats.as_list`) as the core last sent it, or None
        self.info: dict[str, str] = {}
        self.kv: dict | None = None  # the slot engine's KV blocks (`KVReport.as_dict`), set at start-up

    def count_request(self, endpoint: str, outcome: str) -> None:
        """One finished request of `endpoint` ("completions", "chat") by `outcome` (a status class or reason)."""
        key = (endpoint, outcome)
        self.requests[key] = self.requests.get(key, 0) + 1

    def render(self) -> str:
        """The text exposition of every metric."""
        lines = ["# HELP hwrun_requests_total Requests answered, by endpoint and outcome.",
                 "# TYPE hwrun_requests_total counter"]
        lines += [f'hwrun_requests_total{{endpoint="{_escape(e)}",outcome="{_escape(o)}"}} {n}'
                  for (e, o), n in sorted(self.requests.items())]
        lines += ["# HELP hwrun_prompt_tokens_total Prompt tokens of admitted requests.",
                  "# TYPE hwrun_prompt_tokens_total counter", f"hwrun_prompt_tokens_total {self.prompt_tokens}",
                  "# HELP hwrun_generation_tokens_total Tokens generated (sent or not).",
                  "# TYPE hwrun_generation_tokens_total counter",
                  f"hwrun_generation_tokens_total {self.generation_tokens}",
                  "# HELP hwrun_queue_depth Requests waiting for a decode slot.", "# TYPE hwrun_queue_depth gauge",
                  f"hwrun_queue_depth {self.queue_depth()}",
                  "# HELP hwrun_running_requests Requests being decoded.", "# TYPE hwrun_running_requests gauge",
                  f"hwrun_running_requests {self.running()}",
                  "# HELP hwrun_engine_steps_total Decode steps the engine core ran (sent with its token batches).",
                  "# TYPE hwrun_engine_steps_total counter", f"hwrun_engine_steps_total {self.steps()}"]
        for name, hist, text in (
                ("hwrun_time_to_first_token_seconds", self.ttft, "Request arrival to its first token."),
                ("hwrun_inter_token_latency_seconds", self.itl, "Time between a request's consecutive tokens."),
                ("hwrun_request_duration_seconds", self.duration, "Request arrival to its last token.")):
            lines += [f"# HELP {name} {text}", f"# TYPE {name} histogram", *hist.lines(name)]
        lines += kv_lines(self.kv) + kv_use_lines(self.kv_stats())
        if self.info:
            labels = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(self.info.items()))
            lines += ["# HELP hwrun_engine_info The serving engine and device (value 1).",
                      "# TYPE hwrun_engine_info gauge", f"hwrun_engine_info{{{labels}}} 1"]
        return "\n".join(lines) + "\n"


#: The KV gauges: (name, key of `KVReport.as_dict`, help).
KV_GAUGES = (("hwrun_kv_cache_blocks", "blocks", "KV blocks of the slot engine's pool."),
             ("hwrun_kv_cache_block_tokens", "block_size", "Positions one KV block holds."),
             ("hwrun_kv_cache_tokens", "tokens", "Positions the KV pool holds, shared by every request."),
             ("hwrun_kv_cache_bytes", "bytes", "Device bytes of the KV pool."),
             ("hwrun_kv_cache_bytes_per_token", "bytes_per_token", "KV bytes one position costs across the layers."),
             ("hwrun_kv_cache_max_length_requests", "max_length_requests",
              "Requests of the max model length the KV pool holds at once."))


def kv_lines(kv: dict | None) -> list[str]:
    """The KV pool's gauges (none for an engine without blocks)."""
    if not kv:
        return []
    lines = []
    for name, key, text in KV_GAUGES:
        lines += [f"# HELP {name} {text}", f"# TYPE {name} gauge", f"{name} {int(kv[key])}"]
    return lines


#: The KV-use metrics: (name, type, help), in `KVStats` field order after `blocks` (vLLM's names in the help).
KV_USE = (("hwrun_kv_cache_used_blocks", "gauge", "KV blocks requests hold now."),
          ("hwrun_prefix_cache_queries_total", "counter",
           "Prompt tokens looked up in the prefix cache (full blocks; vLLM: prefix_cache_queries)."),
          ("hwrun_prefix_cache_hits_total", "counter",
           "Prompt tokens found in the prefix cache, not prefilled again (vLLM: prefix_cache_hits)."),
          ("hwrun_preemptions_total", "counter",
           "Requests preempted for KV blocks, recomputed later (vLLM: num_preemptions)."),
          ("hwrun_requests_waiting_for_blocks", "gauge", "Admitted requests whose prefill waits for free KV blocks."))


def kv_use_lines(stats: Sequence[int] | None) -> list[str]:
    """The KV-use gauges and counters of a `KVStats.as_list` (none for an engine without blocks)."""
    if not stats:
        return []
    blocks, *values = stats
    lines = ["# HELP hwrun_kv_cache_usage_ratio Fraction of the KV blocks requests hold now (vLLM: kv_cache_usage_perc).",
             "# TYPE hwrun_kv_cache_usage_ratio gauge",
             f"hwrun_kv_cache_usage_ratio {values[0] / blocks if blocks else 0.0:.6f}"]
    for (name, kind, text), value in zip(KV_USE, values, strict=True):
        lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}", f"{name} {int(value)}"]
    return lines


def _bound(value: float) -> str:
    return "+Inf" if value == float("inf") else repr(float(value))


def _escape(value: str) -> str:
    """A label value in Prometheus' text format: backslash, double quote and newline escaped."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')

"""The CLI's streamer: prints text as Transformers' `TextStreamer` does and times the first token apart from
the rest, so a one-time set-up on the first call (kernel loading, cuBLAS/oneDNN handles, compilation) is not
reported as a slow decode rate."""

from __future__ import annotations

import time
from typing import Any


def timed_text_streamer(tokenizer: Any) -> Any:
    """A `TextStreamer` (skip prompt and special tokens) that records when the prompt and the first and last
    new tokens arrived; `summary(n)` words it."""
    from transformers import TextStreamer

    class TimedTextStreamer(TextStreamer):
        def __init__(self) -> None:
            super().__init__(tokenizer, skip_prompt=True, skip_special_tokens=True)
            self.started = time.perf_counter()
            self.first: float | None = None
            self.last: float | None = None

        def put(self, value: Any) -> None:
            if not self.next_tokens_are_prompt:  # the first put is the prompt itself
                now = time.perf_counter()
                self.first = now if self.first is None else self.first
                self.last = now
            super().put(value)

        def first_token_seconds(self) -> float | None:
            """Seconds from the streamer's creation to the first new token (None before it)."""
            return None if self.first is None else self.first - self.started

        def summary(self, new_tokens: int) -> str:
            """'first token after X s, then Y tokens/s' (the decode rate without the first call's set-up)."""
            if self.first is None or self.last is None:
                return "no token streamed"
            rest = self.last - self.first
            rate = f", then {(new_tokens - 1) / rest:.1f} tokens/s" if new_tokens > 1 and rest > 0 else ""
            return f"first token after {self.first - self.started:.2f}s{rate}"

    return TimedTextStreamer()

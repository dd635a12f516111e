"""A one-line progress display on stderr for long sweeps (no dependency beyond the stdlib)."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """`[hwdist bench] 12/28 all_reduce 1 MiB  4.1 s` rewritten in place; silent when disabled."""

    def __init__(self, total: int, *, enabled: bool | None = None, stream: TextIO | None = None,
                 label: str = "hwdist bench") -> None:
        self.total = total
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.label = label
        self.done = 0
        self.start = time.perf_counter()

    def step(self, what: str) -> None:
        """Count one finished item and redraw."""
        self.done += 1
        if self.enabled:
            elapsed = time.perf_counter() - self.start
            width = 20
            filled = int(width * self.done / max(self.total, 1))
            bar = "#" * filled + "." * (width - filled)
            self.stream.write(f"\r[{self.label}] [{bar}] {self.done}/{self.total} {what:<28} {elapsed:6.1f} s")
            self.stream.flush()

    def close(self) -> None:
        """End the line."""
        if self.enabled and self.done:
            self.stream.write("\n")
            self.stream.flush()

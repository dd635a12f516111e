"""`hwrun generate --timings`: where a command's wall time went (start-up and imports, plan, load, generate),
so a slow start can be read phase by phase (issue 29: the first text within seconds of the command)."""

from __future__ import annotations

import os
import time


def seconds_since_process_start() -> float | None:
    """Seconds since this process started (Linux: /proc, 10 ms resolution), else None."""
    try:
        with open("/proc/self/stat", encoding="ascii") as stat, open("/proc/uptime", encoding="ascii") as uptime:
            fields = stat.read().rsplit(")", 1)[1].split()  # the command name may hold spaces
            started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: start time in clock ticks after boot
            return max(0.0, float(uptime.read().split()[0]) - started)
    except (OSError, ValueError, IndexError):
        return None


class PhaseClock:
    """Wall time per phase: `mark(name)` closes the phase that ran since the previous mark (or the clock's start)."""

    def __init__(self) -> None:
        self.before = seconds_since_process_start()  # interpreter start, imports, argument parsing
        self.start = self.last = time.perf_counter()
        self.phases: dict[str, float] = {}

    def mark(self, name: str) -> None:
        """Record `name` as the phase that just ended."""
        now = time.perf_counter()
        self.phases[name] = self.phases.get(name, 0.0) + now - self.last
        self.last = now

    def as_dict(self) -> dict[str, float | None]:
        """{"start-up": s or None, phase: s, ..., "total": s} (total includes start-up when it is known)."""
        total = self.last - self.start + (self.before or 0.0)
        return {"start-up": self.before, **self.phases, "total": total}

    def summary(self, first_token: float | None = None, warmup: float | None = None) -> str:
        """'timings: start-up 2.10s (interpreter and imports), plan 0.41s, ..., total 16.20s'; `warmup`: the seconds
        of the generate phase spent capturing (and compiling) hwrun's step graphs, said beside it."""
        parts = []
        if self.before is not None:
            parts.append(f"start-up {self.before:.2f}s (interpreter and imports)")
        for name, seconds in self.phases.items():
            notes = []
            if name == "generate" and first_token is not None:
                notes.append(f"first token after {first_token:.2f}s")
            if name == "generate" and warmup:
                notes.append(f"graph capture and compile {warmup:.2f}s")
            extra = f" ({'; '.join(notes)})" if notes else ""
            parts.append(f"{name} {seconds:.2f}s{extra}")
        parts.append(f"total {self.as_dict()['total']:.2f}s")
        return "timings: " + ", ".join(parts)

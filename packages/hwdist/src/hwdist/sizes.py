"""Message sizes for `hwdist bench`: `8B..1G` (powers of two), `1K,4M`, binary units."""

from __future__ import annotations

import re

from .errors import BenchError

_UNITS = {"": 1, "B": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_SIZE = re.compile(r"^\s*(\d+)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """`"8B"` -> 8, `"1K"` / `"1KiB"` -> 1024, `"1G"` -> 2**30 (binary units, as nccl-tests)."""
    match = _SIZE.match(str(text))
    if not match:
        raise BenchError(f"size {text!r} is not a size; write bytes with an optional unit: 8B, 64K, 16M, 1G.")
    value = int(match.group(1)) * _UNITS[match.group(2).upper()]
    if value <= 0:
        raise BenchError(f"size {text!r} must be at least one byte.")
    return value


def parse_sizes(text: str, factor: int = 2) -> list[int]:
    """`"8B..1G"` -> 8, 16, ..., 2**30 (each `factor` times the last); `"1K,4M"` -> a list."""
    if factor < 2:
        raise BenchError(f"step factor {factor} must be >= 2.")
    text = str(text).strip()
    if ".." in text:
        low_text, _, high_text = text.partition("..")
        low, high = parse_size(low_text), parse_size(high_text)
        if high < low:
            raise BenchError(f"size range {text!r} runs backwards; write it small..large, e.g. 8B..1G.")
        sizes = [low]
        while sizes[-1] * factor <= high:
            sizes.append(sizes[-1] * factor)
        return sizes
    sizes = [parse_size(part) for part in text.split(",") if part.strip()]
    if not sizes:
        raise BenchError(f"--sizes {text!r} lists no size; e.g. 8B..1G or 1K,1M.")
    return sizes


def format_size(size: int) -> str:
    """8 -> `8 B`, 1536 -> `1.5 KiB`, 2**30 -> `1 GiB`."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{size / scale:g} {unit}"
    return f"{size} B"

"""How hwrun asks about devices: platforms from hwenv, per-kind tables, and the tables' index.

hwrun never compares a device kind with a string. Facts of a device (its torch device type,
graph API, Triton, memory and bf16 reading) come from its `hwenv.Platform`; hwrun's own
decisions per device (does continuous batching run there, bitsandbytes, FSDP, ...) are tables
keyed by `Platform.kind`, each next to the code that decides, each listed in `platform_tables()`
so one test checks that every registered kind has a row in every table (a new kind, ROCm or a
plug-in, cannot be forgotten silently). A kind with no row (a plug-in hwrun does not know yet)
gets the table's conservative default and the reason says so.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import hwenv

T = TypeVar("T")

#: The platform that is the host itself (no accelerator): where hwrun's tests and CPU runs go.
HOST_KIND = "cpu"

#: Every per-kind table in hwrun, as "module:NAME" (read by `platform_tables()`).
TABLES = (
    "hwrun.model.plan:BF16_FACTS",
    "hwrun.model.plan:DEVICE_MAP_FACTS",
    "hwrun.model.plan:PLAN_ENV",
    "hwrun.inference.batching:CONTINUOUS_BATCHING",
    "hwrun.model.quantization:BITSANDBYTES",
    "hwrun.training.arguments:FSDP_SUPPORT",
    "hwrun.training.arguments:FUSED_ADAMW",
    "hwrun.training.arguments:NON_BLOCKING_COPIES",
    "hwrun.training.run:TRAIN_COMPILE_DEFAULT",
    "hwrun.training.kernel_policy:LIGER_DEVICES",
)


def platform_tables() -> dict[str, Mapping[str, Any]]:
    """Every per-kind table hwrun decides with: {"module:NAME": {kind: row}}."""
    tables = {}
    for path in TABLES:
        module, _, name = path.partition(":")
        tables[path] = getattr(importlib.import_module(module), name)
    return tables


def missing_rows() -> dict[str, tuple[str, ...]]:
    """{table: kinds with no row} over every table and every registered kind (empty when complete)."""
    registered = kinds()
    missing = {path: tuple(k for k in registered if k not in table) for path, table in platform_tables().items()}
    return {path: absent for path, absent in missing.items() if absent}


def row(table: Mapping[str, T], kind: str, default: T) -> T:
    """`table[kind]`, or `default` for a kind the table has no row for (a plug-in hwrun does not know)."""
    return table.get(kind, default)


def platform(kind: str) -> hwenv.Platform:
    """The `hwenv.Platform` of `kind`."""
    import hwenv

    return hwenv.get_platform(kind)


def kinds() -> tuple[str, ...]:
    """Every registered device kind (built-ins and plug-ins), in detection order."""
    from hwenv.platforms import kinds as registered

    return registered()


_KIND_OF_DEVICE_TYPE: dict[str, str] = {}  # filled on first use (never at import): device type -> kind here


def kind_of_device_type(device_type: str, hint: str | None = None) -> str:
    """The platform kind of a torch device type in this process (`"cuda"` is NVIDIA's or AMD's).

    `hint` (a plan's kind) wins when its platform has that device type. Otherwise the only
    registered platform with the device type; where several share it (cuda and rocm), the one
    `hwenv.detect()` finds here (remembered for the process), else the first in detection order.
    """
    import hwenv
    from hwenv.platforms import platforms

    if hint is not None and hwenv.get_platform(hint).device_type == device_type:
        return hint
    candidates = [p.kind for p in platforms() if p.device_type == device_type]
    if len(candidates) == 1:
        return candidates[0]
    if not candidates:  # a device type no platform claims ("meta"): tables give it their default row
        return device_type
    if device_type not in _KIND_OF_DEVICE_TYPE:
        try:
            detected = hwenv.detect().kind
        except hwenv.HwenvError:
            detected = ""
        named = [kind for kind in candidates if kind == device_type]  # the kind named after the type (cuda)
        _KIND_OF_DEVICE_TYPE[device_type] = detected if detected in candidates else (named or candidates)[0]
    return _KIND_OF_DEVICE_TYPE[device_type]


def host_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one, else the machine's count)."""
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def torch_threads_for(is_accelerator: bool, cores: int, environ: Mapping[str, str] | None = None,
                      given: int | None = None, *, beside: str = "the server's own threads",
                      option: str = "--torch-threads") -> tuple[int | None, str]:
    """(torch intra-op threads to set, or None to leave torch's own, and why): the one rule `hwrun serve` and
    `hwrun generate` (and `hwrun plan`'s `torch threads` row) use.

    torch's OpenMP threads spinning on every core starve every other thread of the process and of the host: a
    server's event loop and scheduler, the streamer printing tokens, and on a shared machine the other work
    (measured on a loaded 2-core CPU with the tiny model: serve ~80 ms per token and a 1.2 s first token with 2
    threads, ~5 ms and ~10 ms with 1; `hwrun generate` 16.8 tokens/s with 2 threads, 264.5 with 1). So on the
    host one core is left free (`beside` names what it is for); on an accelerator one torch thread does the
    host-side work of a step (what `transformers serve` sets); `OMP_NUM_THREADS` or `given` (`option`) win."""
    import os

    environ = os.environ if environ is None else environ
    if given is not None:
        return given, f"given ({option})"
    if environ.get("OMP_NUM_THREADS"):
        return None, f"OMP_NUM_THREADS={environ['OMP_NUM_THREADS']} is set: torch's own setting is kept"
    if is_accelerator:
        return 1, "accelerator: one torch thread prepares each step on the host (as transformers serve does)"
    threads = max(1, cores - 1)
    return threads, f"host with {cores} cores: {threads} for torch, one left to {beside}"

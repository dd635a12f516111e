"""Host <-> device transfers on the engine's hot path without waiting on the device.

A blocking host-to-device copy (`torch.tensor(values, device=...)`, `device_tensor[i] = host_tensor`) makes torch
wait for the whole stream first (its `copy_` synchronizes after a pageable copy), so the host stalls until every
step already queued has run. Here: host buffers are pinned where the platform allows it (page-locked memory the
device reads by DMA), copies to and from them are `non_blocking`, and the host waits for a copy only when it needs
the values, on an event recorded right after that copy (`wait`), not on a whole-device synchronize. Where the
platform is not an accelerator (CPU) or has no events, copies are plain and there is nothing to wait for.

Pinning a buffer the host rewrites is safe only once the device has read the previous contents: the caching host
allocator tracks this for temporaries (`to_device`), and owners of persistent buffers keep an event per copy
(`record`) and `settle` it before they write again.
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)


class Transfers:
    """Copies between the host and `device` for `platform` (an `hwenv.Platform`): `pinned` when page-locked host
    memory works here, `event_class` (the platform's device module's `Event`) when the device runs asynchronously."""

    def __init__(self, platform: Any, device: Any) -> None:
        self.device = device
        self.pinned, self.event_class = _probe(platform)
        self.waits = 0  # waits for the device on an event (the engine's one read per step): counted for tests
        self._reads: dict[Any, Any] = {}  # (dtype, trailing shape) -> the host buffer `read_later` copies into

    def host(self, shape: tuple[int, ...], dtype: Any) -> Any:
        """A zeroed host buffer (pinned where supported)."""
        import torch

        return torch.zeros(shape, dtype=dtype, pin_memory=self.pinned)

    def to_device(self, values: Any, dtype: Any = None) -> Any:
        """`values` (a list, or a host tensor) on the device, queued behind the work already queued, without a
        stream synchronize where host memory is pinned."""
        import torch

        host = values if isinstance(values, torch.Tensor) else torch.tensor(values, dtype=dtype or torch.long)
        if self.pinned:
            host = host.pin_memory()
        return host.to(self.device, non_blocking=self.pinned)

    def copy(self, target: Any, source: Any) -> None:
        """`target.copy_(source)` without waiting (one side pinned host memory, or both on one device)."""
        target.copy_(source, non_blocking=self.pinned)

    def record(self) -> Any:
        """An event after the work queued so far (None where the device is the host or has no events)."""
        if self.event_class is None:
            return None
        event = self.event_class()
        event.record()
        return event

    def wait(self, event: Any) -> None:
        """Wait until `event` has passed (the copies before it have landed); nothing for None."""
        if event is not None:
            event.synchronize()
            self.waits += 1

    def read_later(self, source: Any, rows: list[int], columns: list[int]) -> Any:
        """Queue the copy of `source[rows[i], columns[i]]` (each i) to the host behind the work already queued; the
        returned function waits for that copy alone (its event) and gives the values as a list. Call it before the
        next `read_later` (they share one host buffer)."""
        import torch

        index = self.to_device([rows, columns])
        picked = source[index[0], index[1]]
        key = (source.dtype, tuple(picked.shape[1:]))  # one host buffer per kind of value read
        buffer = self._reads.get(key)
        if buffer is None or buffer.shape[0] < len(rows):
            buffer = self._reads[key] = self.host((max(len(rows), source.shape[0]), *key[1]), source.dtype)
        host = buffer[:len(rows)]
        with torch.inference_mode():
            host.copy_(picked, non_blocking=self.pinned)
        event = self.record()

        def values() -> list[Any]:
            self.wait(event)
            return host.tolist()

        return values

    @staticmethod
    def settle(event: Any) -> None:
        """Before rewriting a pinned buffer a copy read: wait for that copy only if it has not landed yet."""
        if event is not None and not event.query():
            event.synchronize()


def _probe(platform: Any) -> tuple[bool, Any]:
    """(pinned memory works, the device module's Event class or None): asked of the platform, then tried once. A
    platform with a lazy mode (Gaudi) keeps blocking copies: there a host read is what runs the queued graph, and
    non-blocking copies under it are not verified."""
    if platform is None or not platform.is_accelerator:
        return False, None
    import torch
    from hwenv.platforms import runtime

    try:
        torch.empty(1, pin_memory=True)
        pinned = platform.lazy_mode_variable is None
    except Exception as error:  # noqa: BLE001 - no page-locked memory here (no driver, a CPU-only torch)
        logger.info("%s: no pinned host memory (%s): host copies are plain", platform.kind, error)
        pinned = False
    event_class = None
    try:
        module = runtime.device_module(platform)
        event_class = getattr(module, "Event", None) if module is not None else None
        if event_class is not None:
            probe = event_class()
            probe.record()
            probe.synchronize()
    except Exception as error:  # noqa: BLE001 - no events that run here (a fake device, a CPU-only torch)
        logger.info("%s: no device events (%s): the engine reads its tokens with plain copies", platform.kind, error)
        event_class = None
    if event_class is None:
        pinned = False  # without an event the host could not tell when a non-blocking copy has landed
    return pinned, event_class

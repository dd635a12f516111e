"""Compatibility names over the platform registry: the kinds, their order, names and variables.

New code asks `hwenv.get_platform(kind)` instead; these stay for callers of earlier releases.
Computed on first access from the registry, so plug-in kinds appear in them.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    from .platforms import platforms

    every = platforms()
    if name == "DETECTION_ORDER":
        return tuple(p.kind for p in every)
    if name == "KINDS":
        return frozenset(p.kind for p in every)
    if name == "VISIBLE_DEVICES_VARIABLE":
        return {p.kind: p.visible_devices_variable for p in every}
    if name == "KIND_NAMES":
        return {p.kind: p.display_name for p in every}
    raise AttributeError(f"module 'hwenv.kinds' has no attribute {name!r}")

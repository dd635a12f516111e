"""Installed versions of the libraries that matter, read without importing them, and the gates on them.

Versions come from package metadata (`importlib.metadata`), so reading them is fast and
never imports torch. `importlib.metadata` itself (about 20 ms: email, zipfile, csv) is imported
on the first version asked for, not when hwenv is imported (issue 29: `hwenv --help`, `hwdist --help`).
Tests override versions with `hwenv.testing.override_versions`.
"""

from __future__ import annotations

import re

#: Distributions whose versions decide what works (LIBRARIES.md, FACTS.md G3/G5).
TRACKED_DISTRIBUTIONS: tuple[str, ...] = (
    "torch",
    "transformers",
    "accelerate",
    "kernels",
    "peft",
    "bitsandbytes",
    "habana-torch-plugin",
)

#: Accelerate below this does not see Gaudi: `transformers.is_torch_hpu_available()` is False (G3, G5).
GAUDI_MIN_ACCELERATE = (1, 5, 0)
#: torch with SDPA handling grouped-query attention natively on XPU (X6).
XPU_GQA_MIN_TORCH = (2, 8)
#: torch whose release XPU wheels have the built-in XCCL backend: 2.8 (in the 2.7 source, but the 2.7
#: wheels were built without it; intel/torch-xpu-ops #1318, pytorch #141741; INTEL.md).
XCCL_MIN_TORCH = (2, 8)

_overrides: dict[str, str | None] = {}


def parse_version(text: str | None) -> tuple[int, ...] | None:
    """`"2.8.0+cu128"` -> `(2, 8, 0)`; `None` or an unreadable string -> `None`."""
    if not text:
        return None
    match = re.match(r"\s*v?(\d+(?:\.\d+)*)", text)
    if not match:
        return None
    return tuple(int(part) for part in match.group(1).split("."))


def installed_version(distribution: str) -> str | None:
    """The installed version string of `distribution`, or None when it is not installed."""
    if distribution in _overrides:
        return _overrides[distribution]
    # imported here, not at module import: it costs more than the rest of hwenv's start-up
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def at_least(version: str | None, minimum: tuple[int, ...]) -> bool:
    """True when `version` is known and not older than `minimum`."""
    parsed = parse_version(version)
    if parsed is None:
        return False
    width = max(len(parsed), len(minimum))
    return parsed + (0,) * (width - len(parsed)) >= minimum + (0,) * (width - len(minimum))


def library_versions() -> dict[str, str | None]:
    """Versions of every tracked distribution (None for the ones not installed)."""
    return {name: installed_version(name) for name in TRACKED_DISTRIBUTIONS}


def accelerate_sees_gaudi(accelerate_version: str | None = None) -> bool:
    """Whether Accelerate lets Transformers use a Gaudi (G3, G5): True when it is new enough, or not installed.

    `transformers.is_torch_hpu_available()` returns False only when accelerate is installed and
    older than 1.5.0; without accelerate the gate is skipped (transformers 5.22
    `utils/import_utils.py`, INTEL.md S4). `accelerate_version` defaults to the installed one.
    """
    if accelerate_version is None:
        accelerate_version = installed_version("accelerate")
        if accelerate_version is None:
            return True
    return at_least(accelerate_version, GAUDI_MIN_ACCELERATE)


def format_version(version: tuple[int, ...]) -> str:
    """`(1, 5, 0)` -> `"1.5.0"`."""
    return ".".join(str(part) for part in version)

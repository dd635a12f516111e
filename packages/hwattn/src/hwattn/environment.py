"""What the software on this machine allows: `kernels` usable, FlashAttention packages, torch version.

`resolve_attention` decides from an `Accelerator` (which device) and an `AttentionEnvironment`
(which software); both can describe another machine, so plans and tables are reproducible.
"""

from __future__ import annotations

from dataclasses import dataclass

from hwenv import at_least, installed_version

from .names import FLASH_DISTRIBUTION

#: flash-attn below this is rejected by Transformers (`_flash_attn_can_dispatch`).
FLASH_ATTN_2_MIN = (2, 3, 3)


@dataclass(frozen=True)
class AttentionEnvironment:
    """The installed software that attention decisions depend on."""

    kernels_available: bool
    flash_packages: frozenset[str] = frozenset()
    torch_version: str | None = None

    def has_flash_package(self, name: str) -> bool:
        """Whether the original package for `flash_attention_N` is installed."""
        return name in self.flash_packages


def kernels_available() -> bool:
    """Transformers' own check: `kernels` installed *and* inside the version window it accepts.

    Until Transformers is imported, its window is read from its source (`kernels_available_from_source`), so
    planning does not import it (about 1 s, more under load); `transformers.utils.is_kernels_available()`
    answers once Transformers is imported, or when the window is not found in its source."""
    import sys

    if "transformers.utils" not in sys.modules:
        answer = kernels_available_from_source()
        if answer is not None:
            return answer
    from transformers.utils import is_kernels_available

    return bool(is_kernels_available())


def kernels_available_from_source() -> bool | None:
    """`transformers.utils.is_kernels_available()` without importing Transformers: `kernels` found and its
    version in `KERNELS_MIN_VERSION` <= v < `KERNELS_MAX_VERSION`, the two constants read from the source of
    `transformers.utils.import_utils` (None when they are not there: the caller asks Transformers)."""
    import importlib.util

    from packaging.version import InvalidVersion, Version

    from .declared import source_constant

    low = source_constant("transformers.utils.import_utils", "KERNELS_MIN_VERSION")
    high = source_constant("transformers.utils.import_utils", "KERNELS_MAX_VERSION")
    if low is None or high is None:
        return None
    version = installed_version("kernels") if importlib.util.find_spec("kernels") is not None else None
    try:
        return version is not None and Version(low) <= Version(version) < Version(high)
    except InvalidVersion:
        return None


def flash_packages_installed() -> frozenset[str]:
    """Which `flash_attention_N` have their original package installed (read from metadata, no import)."""
    found = set()
    for name, dist in FLASH_DISTRIBUTION.items():
        version = installed_version(dist)
        if version is None:
            continue
        if name == "flash_attention_2" and not at_least(version, FLASH_ATTN_2_MIN):
            continue
        found.add(name)
    return frozenset(found)


def current_environment() -> AttentionEnvironment:
    """The environment of this process."""
    return AttentionEnvironment(
        kernels_available=kernels_available(),
        flash_packages=flash_packages_installed(),
        torch_version=installed_version("torch"),
    )

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
    """Transformers' own check: `kernels` installed *and* inside the version window it accepts."""
    from transformers.utils import is_kernels_available

    return bool(is_kernels_available())


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

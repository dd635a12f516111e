"""`ZE_FLAT_DEVICE_HIERARCHY`: which Level Zero devices a process sees, and how a mask selects them.

Sources (INTEL.md S6, S7; read 2026-12):
- Level Zero spec, `oneapi-src/level-zero-spec` `scripts/core/PROG.rst`, "Device Hierarchy" and
  "Affinity Mask": `FLAT` reports every tile (stack) as a root device with no sub-devices;
  `COMPOSITE` reports each card as one device with its tiles as sub-devices; `COMBINED` reports
  tiles as devices but keeps the sub-device/root-device queries. The driver reads the hierarchy
  first, then interprets `ZE_AFFINITY_MASK` in that device model. Under FLAT a `device.subdevice`
  entry such as `0.0` "is not valid". Surviving devices keep the driver's order, renumbered from 0.
- Intel's driver, `intel/compute-runtime` `shared/source/execution_environment/execution_environment.cpp`
  (`setDeviceHierarchyMode`, `parseAffinityMask`): the value is compared case-sensitively to
  `COMPOSITE`, `FLAT`, `COMBINED`; anything else (unset, `flat`, `""`) silently becomes the
  device family's default, which is FLAT on the multi-tile Data Center GPU Max (Xe HPC) and
  COMPOSITE elsewhere (single-tile GPUs, where the two expose the same devices). Under FLAT and
  COMBINED, `X.Y` entries and ordinals beyond the devices are skipped silently; under COMPOSITE
  the sub-device entries of one card make that card one device.
- The spec's own table bolds COMPOSITE as the default; Intel's GPU Optimization Guide ("Exposing
  the Device Hierarchy", S7) and the driver make FLAT the default on the cards where it matters,
  so hwstack reads an unset variable as FLAT, as `torch.xpu.device_count()` does
  (`torch/xpu/__init__.py`: `expose_subdevices = ZE_FLAT_DEVICE_HIERARCHY != "COMPOSITE"`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from .errors import DeviceHierarchyError

HIERARCHY_VARIABLE = "ZE_FLAT_DEVICE_HIERARCHY"
#: The values the driver recognises (exact, upper case).
HIERARCHIES = ("FLAT", "COMPOSITE", "COMBINED")
#: What an unset variable means on the multi-tile cards (the driver's default there; S7).
DEFAULT_HIERARCHY = "FLAT"


@dataclass(frozen=True)
class DeviceHierarchy:
    """The device model a process runs under: `value` (FLAT, COMPOSITE, COMBINED) and whether the user set it."""

    value: str = DEFAULT_HIERARCHY
    explicit: bool = False

    def __post_init__(self) -> None:
        if self.value not in HIERARCHIES:
            raise DeviceHierarchyError(_bad_value_message(self.value))

    @property
    def tiles_are_devices(self) -> bool:
        """True under FLAT and COMBINED: each tile is its own device, mask ordinals count tiles."""
        return self.value != "COMPOSITE"

    @property
    def subdevice_entries_allowed(self) -> bool:
        """Whether `ZE_AFFINITY_MASK` may name `device.subdevice` entries (COMPOSITE only)."""
        return self.value == "COMPOSITE"

    def describe(self) -> str:
        """One line for reports: the value and whether it is the driver default."""
        if self.explicit:
            return f"{HIERARCHY_VARIABLE}={self.value} (set in the environment)"
        return (f"{HIERARCHY_VARIABLE} is unset: the driver default, {self.value} (each tile of a multi-tile card "
                f"is its own device; single-tile GPUs are the same in every hierarchy)")


def _bad_value_message(value: object) -> str:
    return (
        f"{HIERARCHY_VARIABLE}={value!r} is not a device hierarchy Level Zero knows: use exactly one of "
        f"{', '.join(HIERARCHIES)} (upper case). The driver compares the value case-sensitively and silently "
        f"falls back to its default for anything else, so the devices you get would not be the ones you "
        f"asked for. Fix the value, or unset {HIERARCHY_VARIABLE} for the default ({DEFAULT_HIERARCHY})."
    )


def parse_hierarchy(value: str | None) -> DeviceHierarchy:
    """The hierarchy for a variable's raw value; None (unset) is the FLAT default. Bad values raise."""
    if value is None:
        return DeviceHierarchy()
    if not isinstance(value, str) or value not in HIERARCHIES:
        raise DeviceHierarchyError(_bad_value_message(value))
    return DeviceHierarchy(value, explicit=True)


def read_hierarchy(environ: Mapping[str, str] | None = None) -> DeviceHierarchy:
    """The hierarchy `environ` (default `os.environ`) sets; raises `DeviceHierarchyError` on a bad value."""
    env = os.environ if environ is None else environ
    return parse_hierarchy(env.get(HIERARCHY_VARIABLE))


def as_hierarchy(hierarchy: DeviceHierarchy | str | None, environ: Mapping[str, str] | None = None) -> DeviceHierarchy:
    """`hierarchy` as a `DeviceHierarchy`: a given value wins (as set by the user); None reads `environ`."""
    if isinstance(hierarchy, DeviceHierarchy):
        return hierarchy
    if hierarchy is None:
        return read_hierarchy(environ)
    return parse_hierarchy(hierarchy)


@dataclass(frozen=True)
class ExposedDevice:
    """One device a process sees: its new ordinal, the physical card and the card's tiles in it."""

    index: int
    card: int
    tiles: tuple[int, ...]


@dataclass(frozen=True)
class Card:
    """A physical Intel GPU as the driver sorts it: PCI address (domain, bus, device, function) and integrated."""

    pci: tuple[int, int, int, int] = (0, 0, 0, 0)
    integrated: bool = False


def driver_order(cards: tuple[Card, ...] | list[Card], pci_order: bool) -> tuple[int, ...]:
    """The physical cards in the order Level Zero reports them (indices into `cards`).

    `intel/compute-runtime` `shared/source/execution_environment/execution_environment.cpp`
    `comparePciIdBusNumber`, used by `sortNeoDevices`, which `device_factory.cpp` calls *before*
    `parseAffinityMask`: without `ZE_ENABLE_PCI_ID_DEVICE_ORDER` discrete GPUs come before integrated ones,
    then PCI domain, bus, device, function; with it, PCI order only (an integrated GPU on bus 0 comes first).
    """
    return tuple(sorted(range(len(cards)), key=lambda i: ((0 if pci_order else int(cards[i].integrated)),
                                                          cards[i].pci)))


def mask_is_unset(mask: str | None) -> bool:
    """The driver reads an unset, empty or `default` `ZE_AFFINITY_MASK` as no mask (every device):
    compute-runtime `parseAffinityMask` returns early for `""` and `"default"` (its flag's default value)."""
    return mask is None or mask == "" or mask == "default"


def _lenient_entries(mask: str) -> list[tuple[int, int | None]]:
    entries: list[tuple[int, int | None]] = []
    for item in mask.split(","):
        parts = [part.strip() for part in item.split(".")]
        if len(parts) > 2 or not all(part.isdigit() and part.isascii() for part in parts):
            raise ValueError(f"ZE_AFFINITY_MASK={mask!r}: {item!r} is outside what the model reads (device[.subdevice])")
        entries.append((int(parts[0]), int(parts[1]) if len(parts) == 2 else None))
    return entries


def exposed_devices(cards: int, tiles: int, hierarchy: DeviceHierarchy | str | None = None,
                    mask: str | None = None, order: tuple[int, ...] | None = None) -> tuple[ExposedDevice, ...]:
    """The devices `zeDeviceGet` reports on `cards` cards of `tiles` tiles each, as the driver does.

    A model of `parseAffinityMask` in `intel/compute-runtime`: FLAT/COMBINED expose every tile as a
    device (card-major) and read mask ordinals as those devices, skipping `X.Y` entries and
    ordinals beyond them; COMPOSITE exposes cards, a `X` entry keeps card X whole and `X.Y` entries
    keep card X with those tiles (one device per card), skipping ordinals beyond the cards or
    tiles. Order follows the hardware (`order`: the physical cards as `driver_order` sorts them, which
    the driver does before it reads the mask; default 0..cards-1), not the mask; survivors are
    renumbered from 0. Entries the driver skips are skipped here too (hwenv's `select` refuses them
    before anything runs). An empty or `default` mask is no mask (`mask_is_unset`).
    """
    model = as_hierarchy(hierarchy, {})
    sorted_cards = tuple(range(cards)) if order is None else tuple(order)
    if model.tiles_are_devices:
        slots = [(card, (tile,)) for card in sorted_cards for tile in range(tiles)]
    else:
        slots = [(card, tuple(range(tiles))) for card in sorted_cards]
    if mask_is_unset(mask):
        # unset, empty or "default": the driver exposes everything
        return tuple(ExposedDevice(i, card, kept) for i, (card, kept) in enumerate(slots))
    keep: dict[int, set[int]] = {}
    for device, sub in _lenient_entries(mask):
        if device >= len(slots):
            continue
        if model.tiles_are_devices:
            if sub is None:
                keep.setdefault(device, set()).update(slots[device][1])
        elif sub is None:
            keep.setdefault(device, set()).update(range(tiles))
        elif sub < tiles:
            keep.setdefault(device, set()).add(sub)
    survivors = [(slots[i][0], tuple(sorted(keep[i]))) for i in sorted(keep)]
    return tuple(ExposedDevice(i, card, kept) for i, (card, kept) in enumerate(survivors))

"""`ZE_AFFINITY_MASK`: parse, validate and format the Level Zero device mask (FACTS.md X4, X5).

Grammar (Level Zero specification, "Affinity Mask"): a comma-separated list of
`device[.subdevice]` entries, each a non-negative decimal index. Two levels only: the
early three-level form (`0.1.2`, sub-sub-devices) is not accepted by current drivers and
is rejected here. The mask chooses *which* devices a process sees; it does not change the
*order* in which they are enumerated. For an order that is stable between runs also set
`ZE_ENABLE_PCI_ID_DEVICE_ORDER=1` (devices then come lowest PCI bus id first, X5).

The mask is read in the device model `ZE_FLAT_DEVICE_HIERARCHY` sets (`hwenv.hierarchy`):
under FLAT (the driver default) and COMBINED every ordinal is a tile-device and `0.1` is not
valid; under COMPOSITE `card.tile` entries of one card make one device.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import AffinityMaskError
from .hierarchy import HIERARCHY_VARIABLE, DeviceHierarchy, as_hierarchy, mask_is_unset

MASK_VARIABLE = "ZE_AFFINITY_MASK"
PCI_ORDER_VARIABLE = "ZE_ENABLE_PCI_ID_DEVICE_ORDER"


@dataclass(frozen=True, order=True)
class AffinityEntry:
    """One entry of a mask: a root device and, optionally, one of its sub-devices (tiles)."""

    device: int
    subdevice: int | None = None

    def __str__(self) -> str:
        return str(self.device) if self.subdevice is None else f"{self.device}.{self.subdevice}"


def _index(part: str, mask: str, what: str) -> int:
    if not part.isdigit() or not part.isascii():
        reason = "it is empty" if part == "" else f"{part!r} is not a non-negative decimal index"
        raise AffinityMaskError(
            f"{MASK_VARIABLE}={mask!r} is invalid: {what} {reason}. "
            f"Use comma-separated device indices with an optional .subdevice, e.g. '0,2' or '0.1,1'."
        )
    return int(part)


def parse_affinity_mask(mask: str, device_count: int | None = None, *,
                        hierarchy: DeviceHierarchy | str | None = None) -> tuple[AffinityEntry, ...]:
    """Parse `mask` into entries, in the order written; raise `AffinityMaskError` on any bad part.

    An empty mask (or `default`) is no mask: `()`, every device, as the driver reads it.

    `device_count`, when known, rejects indices beyond the devices present (devices of the
    hierarchy: tiles under FLAT/COMBINED, cards under COMPOSITE). `hierarchy` (a
    `DeviceHierarchy` or `"FLAT"`/`"COMPOSITE"`/`"COMBINED"`) checks the entries the way the
    driver reads them; without it only the grammar is checked.
    """
    if not isinstance(mask, str):
        raise AffinityMaskError(f"{MASK_VARIABLE} must be a string, got {mask!r} ({type(mask).__name__}).")
    if mask_is_unset(mask):
        return ()  # the driver reads "" and "default" as no mask: every device (compute-runtime parseAffinityMask)
    if mask.strip() == "":
        raise AffinityMaskError(
            f"{MASK_VARIABLE}={mask!r} is blank: the driver reads it as one entry that is not an index. Unset the "
            f"variable (or leave it empty) to use every device, or list indices such as '0,2'."
        )
    entries: list[AffinityEntry] = []
    for position, item in enumerate(mask.split(","), start=1):
        item = item.strip()
        if item == "":
            raise AffinityMaskError(
                f"{MASK_VARIABLE}={mask!r} is invalid: item {position} is empty (two commas in a row, "
                f"or a leading/trailing comma). Write e.g. '0,2'."
            )
        parts = item.split(".")
        if len(parts) > 2:
            raise AffinityMaskError(
                f"{MASK_VARIABLE}={mask!r} is invalid: {item!r} has {len(parts)} levels; the mask takes "
                f"'device' or 'device.subdevice' only."
            )
        device = _index(parts[0], mask, f"item {position} ({item!r}): device index")
        sub = _index(parts[1], mask, f"item {position} ({item!r}): sub-device index") if len(parts) == 2 else None
        entries.append(AffinityEntry(device, sub))
    _check_duplicates(entries, mask)
    if hierarchy is not None:
        _check_hierarchy(entries, mask, as_hierarchy(hierarchy, {}))
    if device_count is not None:
        for entry in entries:
            if entry.device >= device_count:
                raise AffinityMaskError(
                    f"{MASK_VARIABLE}={mask!r} names device {entry.device}, but only {device_count} "
                    f"device(s) are present (indices 0..{device_count - 1})."
                )
    return tuple(entries)


def _check_duplicates(entries: list[AffinityEntry], mask: str) -> None:
    seen: set[AffinityEntry] = set()
    whole_devices = {e.device for e in entries if e.subdevice is None}
    for entry in entries:
        if entry in seen:
            raise AffinityMaskError(f"{MASK_VARIABLE}={mask!r} lists {entry} twice; list each device once.")
        if entry.subdevice is not None and entry.device in whole_devices:
            raise AffinityMaskError(
                f"{MASK_VARIABLE}={mask!r} lists device {entry.device} whole and its sub-device {entry}; "
                f"keep one of the two."
            )
        seen.add(entry)


def _check_hierarchy(entries: list[AffinityEntry], mask: str, hierarchy: DeviceHierarchy) -> None:
    if hierarchy.subdevice_entries_allowed:
        return
    subs = [str(entry) for entry in entries if entry.subdevice is not None]
    if subs:
        how = "as set" if hierarchy.explicit else "the driver default: the variable is unset"
        raise AffinityMaskError(
            f"{MASK_VARIABLE}={mask!r} names sub-device entries ({', '.join(subs)}), which are not valid under "
            f"{HIERARCHY_VARIABLE}={hierarchy.value} ({how}): there every tile is already its own device and has "
            f"no sub-devices, and the driver would silently skip those entries (Level Zero spec, Affinity Mask). "
            f"Use {hierarchy.value} device ordinals such as '0,1' (on cards of T tiles, tile t of card c is "
            f"ordinal c*T+t), or set {HIERARCHY_VARIABLE}=COMPOSITE to address tiles as card.tile."
        )


def format_affinity_mask(entries: tuple[AffinityEntry, ...] | list[AffinityEntry]) -> str:
    """The mask string for `entries`: the inverse of `parse_affinity_mask`."""
    return ",".join(str(entry) for entry in entries)


def visible_root_devices(entries: tuple[AffinityEntry, ...]) -> int:
    """How many devices `torch.xpu.device_count()` reports under this (hierarchy-checked) mask.

    Sub-device entries of one card are one device (COMPOSITE: `1.1,1.2` is one, `0,1.0,1.1` two);
    under FLAT/COMBINED there are no sub-device entries and each ordinal is one device.
    """
    return len({entry.device for entry in entries})

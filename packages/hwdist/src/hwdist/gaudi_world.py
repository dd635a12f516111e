"""The Gaudi partial-server rule (G8), checked before any HCCL process group starts.

Intel supports distributed workloads on part of an 8-device server only as groups of 2 or 4
devices in fixed module-ID combinations; hwenv holds the table (`hwenv.check_group`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import hwenv

from .errors import GaudiWorldError

logger = logging.getLogger(__name__)


def check_gaudi_world(
    local_world_size: int,
    visible_count: int,
    environ: Mapping[str, str] | None = None,
    *,
    hl_smi_rows: tuple[hwenv.HlSmiRow, ...] | None = None,
) -> tuple[int, ...] | None:
    """Check that `local_world_size` processes on this server form a supported Gaudi group.

    Returns the module IDs the processes use when known (None: the whole server or unknown).
    The group comes from `HABANA_VISIBLE_MODULES` / `_DEVICES` (hwenv.current_selection), or,
    with no selection, from the first `local_world_size` device indices mapped by hl-smi.
    """
    try:
        selection = hwenv.current_selection("hpu", environ, hl_smi_rows=hl_smi_rows)
    except hwenv.HwenvError as error:
        raise GaudiWorldError(f"the Gaudi selection in the environment is not usable (G8): {error}") from error
    if local_world_size <= 1:
        return tuple(int(d) for d in selection.devices) or None
    if selection.devices:
        modules = tuple(int(d) for d in selection.devices)
        if local_world_size != len(modules):
            raise GaudiWorldError(
                f"{local_world_size} processes on this node but HABANA_VISIBLE_MODULES selects {len(modules)} "
                f"Gaudi modules {list(modules)}: on part of a server each selected module runs one process "
                f"(G8, G16). Launch {len(modules)} processes (hwdist launch picks that by default), or select "
                f"a supported group of {local_world_size}."
            )
        return modules
    if local_world_size > visible_count:
        raise GaudiWorldError(
            f"{local_world_size} processes on this node but only {visible_count} Gaudi device(s) are visible; "
            f"launch at most {visible_count} (one per device, G16)."
        )
    if local_world_size == visible_count:
        return None
    try:
        rows = hl_smi_rows if hl_smi_rows is not None else hwenv.read_hl_smi()
    except hwenv.HwenvError as error:
        raise GaudiWorldError(
            f"{local_world_size} processes use part of this {visible_count}-device Gaudi server and hl-smi "
            f"cannot be read to find their module IDs ({error}). Select a supported group explicitly: "
            f"hwdist launch --devices 0,1 ... (G8)."
        ) from error
    mapping = hwenv.index_to_module(rows)
    missing = [i for i in range(local_world_size) if i not in mapping]
    if missing:
        raise GaudiWorldError(f"hl-smi lists no Gaudi with index {missing}; cannot place {local_world_size} processes.")
    modules = tuple(mapping[i] for i in range(local_world_size))
    try:
        hwenv.check_group(modules)
    except hwenv.GaudiGroupError as error:
        raise GaudiWorldError(
            f"{local_world_size} processes on device indices 0..{local_world_size - 1} use Gaudi modules "
            f"{sorted(modules)}: {error} Select a supported group with hwdist launch --devices (module IDs)."
        ) from error
    logger.info("Gaudi processes use modules %s (hl-smi), a supported group (G8)", sorted(modules))
    return modules

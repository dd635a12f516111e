"""The Gaudi partial-server rule (G8), checked before any HCCL process group starts.

Intel supports a *distributed* workload (2 or more processes on a node) on part of an 8-device
server only as groups of 2 or 4 devices in fixed module-ID combinations; hwenv holds the table
(`hwenv.check_group`). One process on one card is a standard run and is never refused (Intel's
own instructions start one-card containers with `HABANA_VISIBLE_DEVICES=4`; INTEL.md S13).

Which modules the processes use follows the bridge (gaudi-pytorch-bridge 1.19,
`torch/distributed/hccl/__init__.py` `_setup_module_id`): an `HLS_MODULE_ID` already set wins;
else with `HABANA_VISIBLE_MODULES` the list position is the local rank; else module ID = local
rank (2 processes use modules {0,1}). Device indices are not mapped through `hl-smi` for this.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

import hwenv
from hwenv.gaudi import (
    DEVICES_VARIABLE,
    MODULE_ID_VARIABLE,
    MODULES_VARIABLE,
    module_pin,
    modules_for_processes,
)

from .errors import GaudiWorldError

logger = logging.getLogger(__name__)


def _bridge_modules(count: int, env: Mapping[str, str]) -> tuple[int, ...]:
    """The modules `count` processes use as the bridge assigns them before any pin is set
    (hwenv.gaudi.modules_for_processes): the first `count` of HABANA_VISIBLE_MODULES, else 0..count-1."""
    unpinned = {name: value for name, value in env.items() if name != MODULE_ID_VARIABLE}
    try:
        return modules_for_processes(count, unpinned)
    except hwenv.HwenvError as error:
        raise GaudiWorldError(f"{error} (G8, G16)") from error


def _single_process(env: Mapping[str, str]) -> tuple[int, ...] | None:
    """One process on this node: no group rule; the modules it may use, where the environment says."""
    try:
        pinned = module_pin(env)
    except hwenv.HwenvError as error:
        raise GaudiWorldError(str(error)) from error
    if pinned is not None:
        return (pinned,)  # the bridge's pin wins over every selection
    if env.get(MODULES_VARIABLE) is not None:
        listed = _bridge_modules(len(env[MODULES_VARIABLE].split(",")), env)
        idle = listed[1:]
        if idle:  # not refused: the container runtime writes every mounted card's module here (see idle_modules)
            logger.warning(
                "one Gaudi process on this node but %s=%r lists %d modules: the process uses module %d (list "
                "position 0 = local rank 0, as the bridge maps it) and modules %s stay idle; launch %d processes "
                "(a supported group, G8) or select the one module to use", MODULES_VARIABLE, env[MODULES_VARIABLE],
                len(listed), listed[0], list(idle), len(listed))
        return listed[:1]
    if env.get(DEVICES_VARIABLE) is not None:
        # A one-card container: its module ID is not in the environment, and what hl-smi prints inside
        # such a container is not documented, so it is not read.
        logger.info("one Gaudi process with %s=%r: its module ID is not known here", DEVICES_VARIABLE,
                    env[DEVICES_VARIABLE])
    return None


def idle_modules(local_world_size: int, environ: Mapping[str, str] | None = None) -> tuple[int, ...]:
    """The Gaudi modules `HABANA_VISIBLE_MODULES` lists past the first `local_world_size` (each process uses the
    module at its local rank's position): cards selected that no process will use.

    `check_gaudi_world` refuses a mismatch for 2+ processes and only warns for one, because the habana container
    runtime writes `HABANA_VISIBLE_MODULES` itself for every card a container mounts (HabanaAI/habana-container-
    runtime README, "HABANA_VISIBLE_MODULES Auto generated"), so one process in an all-card container is standard.
    A launcher that was given the selection explicitly (`--devices 0,1 --nproc-per-node 1`) refuses with this.
    """
    env = os.environ if environ is None else environ
    if env.get(MODULES_VARIABLE) is None or env.get(MODULE_ID_VARIABLE) is not None:
        return ()
    listed = _bridge_modules(len(env[MODULES_VARIABLE].split(",")), env)
    return listed[max(local_world_size, 0):]


def _selected(env: Mapping[str, str], hl_smi_rows: tuple[hwenv.HlSmiRow, ...] | None, kind: str) -> hwenv.Selection:
    """The node's selection for 2+ processes; a pin (`HLS_MODULE_ID`) is one process's, checked apart."""
    unpinned = {name: value for name, value in env.items() if name != MODULE_ID_VARIABLE}
    try:
        return hwenv.current_selection(kind, unpinned, hl_smi_rows=hl_smi_rows)
    except hwenv.HwenvError as error:
        raise GaudiWorldError(f"the Gaudi selection in the environment is not usable (G8): {error}") from error


def _check_pin(env: Mapping[str, str], expected: tuple[int, ...] | None, local_rank: int | None, count: int) -> None:
    """`HLS_MODULE_ID` here must be this rank's module: the bridge sets it so itself when it is imported
    (`_setup_module_id`), and an inherited one would pin every process to one card (the bridge lets it win)."""
    if local_rank is None or expected is None or local_rank >= len(expected):
        return
    try:
        pinned = module_pin(env)
    except hwenv.HwenvError as error:
        raise GaudiWorldError(str(error)) from error
    if pinned is not None and pinned != expected[local_rank]:
        raise GaudiWorldError(
            f"{MODULE_ID_VARIABLE}={env[MODULE_ID_VARIABLE]!r} is set in this process and the Gaudi bridge uses it "
            f"over every selection, but process LOCAL_RANK={local_rank} of the {count} on this node uses module "
            f"{expected[local_rank]} (module ID = local rank, or its position in {MODULES_VARIABLE}). Unset "
            f"{MODULE_ID_VARIABLE} before starting {count} processes (hwdist launch removes it from their "
            f"environment); select cards with {MODULES_VARIABLE} or hwdist launch --devices."
        )


def check_gaudi_world(
    local_world_size: int,
    visible_count: int,
    environ: Mapping[str, str] | None = None,
    *,
    hl_smi_rows: tuple[hwenv.HlSmiRow, ...] | None = None,
    local_rank: int | None = None,
    kind: str = "hpu",
) -> tuple[int, ...] | None:
    """Check that `local_world_size` processes on this server form a supported Gaudi group.

    Returns the module IDs the node's processes use, in local-rank order, where known (None: the
    whole server, or one process whose card the environment does not name). One process is
    never refused. 2+ processes use the `HABANA_VISIBLE_MODULES` / `_DEVICES` selection
    (hwenv.current_selection), else modules 0..N-1, and must form a supported group (G8). With
    `local_rank`, an inherited `HLS_MODULE_ID` that disagrees with this rank's module is refused.
    `kind` is the platform kind whose selection is read (Gaudi's).
    """
    env = os.environ if environ is None else environ
    if local_world_size <= 1:
        return _single_process(env)
    selection = _selected(env, hl_smi_rows, kind)
    if selection.devices:
        modules = tuple(int(d) for d in selection.devices)
        if local_world_size != len(modules):
            raise GaudiWorldError(
                f"{local_world_size} processes on this node but {selection.variable} selects {len(modules)} "
                f"Gaudi modules {list(modules)}: on part of a server each selected module runs one process "
                f"(G8, G16). Launch {len(modules)} processes (hwdist launch picks that by default), or select "
                f"a supported group of {local_world_size}."
            )
        # the bridge's order is known only from HABANA_VISIBLE_MODULES (list position = local rank)
        _check_pin(env, modules if env.get(MODULES_VARIABLE) is not None else None, local_rank, local_world_size)
        return modules
    if local_world_size > visible_count:
        raise GaudiWorldError(
            f"{local_world_size} processes on this node but only {visible_count} Gaudi device(s) are visible; "
            f"launch at most {visible_count} (one per device, G16)."
        )
    modules = _bridge_modules(local_world_size, env)
    _check_pin(env, modules, local_rank, local_world_size)
    if local_world_size == visible_count:
        return None
    try:
        hwenv.check_group(modules)
    except hwenv.GaudiGroupError as error:
        raise GaudiWorldError(
            f"{local_world_size} processes with no {MODULES_VARIABLE} use Gaudi modules {list(modules)} (module "
            f"ID = local rank, as the bridge assigns them): {error} Launch 2 or 4 processes, or select a supported "
            f"group with hwdist launch --devices (module IDs)."
        ) from error
    logger.info("Gaudi processes use modules %s (module ID = local rank), a supported group (G8)", list(modules))
    return modules

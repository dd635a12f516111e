"""The Gaudi half of `hwenv.select` / `current_selection` / `Selection.env()`: rules, no `Selection` type.

- One card needs no group check and no hl-smi: a single-card run is standard (INTEL.md S13).
  A single device *index* stays an index (`HABANA_VISIBLE_DEVICES`), because a one-card
  container is the common case and Intel's documentation does not say what `hl-smi` prints
  inside a container started with `HABANA_VISIBLE_DEVICES` (whether it lists the host's index,
  index 0, or every card). hwenv assumes nothing about it; `hwenv doctor` says so.
- Two or more cards are a distributed workload: device indices are mapped to module IDs with
  hl-smi and the group is checked against Intel's table (G8).
- `HLS_MODULE_ID`, the bridge's per-process pin, wins over both selection variables in the
  process that has it (bridge `set_device`), and is removed from a child's environment
  (`child_removals`) so a launched run does not inherit one process's pin.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from ..errors import GaudiModulePinError, SelectionError
from .groups import check_group
from .hl_smi import HlSmiRow, indices_to_modules, read_hl_smi
from .int64 import int64_status
from .mode import execution_mode
from .modules import module_pin
from .variables import (
    DEVICES_VARIABLE,
    INT64_VARIABLE,
    MODULE_ID_VARIABLE,
    MODULES_VARIABLE,
    parse_id_list,
)

BY_MODULE = "module"
BY_INDEX = "index"


def variable_for(by: str) -> str:
    """`HABANA_VISIBLE_MODULES` for module IDs, `HABANA_VISIBLE_DEVICES` for device indices."""
    return DEVICES_VARIABLE if by == BY_INDEX else MODULES_VARIABLE


def parse_devices(
    devices: str, by: str = BY_MODULE, hl_smi_rows: tuple[HlSmiRow, ...] | None = None
) -> tuple[tuple[str, ...], str]:
    """Validate a Gaudi `--devices` list; return the ids to write and how (`"module"` or `"index"`).

    One id is returned as given (no hl-smi, no group rule). Several indices are translated to
    module IDs with hl-smi; several module IDs must be a supported group (G8).
    """
    if by not in (BY_MODULE, BY_INDEX):
        raise SelectionError(f"by={by!r} is not valid for Gaudi; use 'module' (module IDs) or 'index' (device indices).")
    ids = parse_id_list(devices, variable_for(by))
    if len(ids) == 1:
        if by == BY_MODULE:
            check_group(ids)  # one card passes the group rule; the module ID must still exist on a server
        return (str(ids[0]),), by
    if by == BY_INDEX:
        rows = hl_smi_rows if hl_smi_rows is not None else read_hl_smi()
        ids = indices_to_modules(ids, rows)
    check_group(ids)
    return tuple(str(i) for i in ids), BY_MODULE


def environment_devices(
    environ: Mapping[str, str] | None = None, hl_smi_rows: tuple[HlSmiRow, ...] | None = None
) -> tuple[str | None, str]:
    """The Gaudi selection `environ` already makes: `(devices text or None, by)`, validated.

    Order, as the bridge decides: `HLS_MODULE_ID` (one module; must be in `HABANA_VISIBLE_MODULES`
    when that is set); then both selection variables (they must agree, checked with hl-smi);
    then `HABANA_VISIBLE_MODULES`; then `HABANA_VISIBLE_DEVICES` (one index stays an index).
    """
    env = os.environ if environ is None else environ
    modules = env.get(MODULES_VARIABLE)
    indices = env.get(DEVICES_VARIABLE)
    pin = module_pin(env)
    if pin is not None:
        if modules is not None and pin not in parse_id_list(modules, MODULES_VARIABLE):
            raise GaudiModulePinError(
                f"{MODULE_ID_VARIABLE}={pin} is not in {MODULES_VARIABLE}={modules!r}: the Gaudi bridge's set_device "
                f"asserts that the pinned module is visible. Unset {MODULE_ID_VARIABLE}, or make it one of the listed "
                f"modules."
            )
        return str(pin), BY_MODULE
    if modules is not None and indices is not None:
        module_ids = parse_id_list(modules, MODULES_VARIABLE)
        index_ids = parse_id_list(indices, DEVICES_VARIABLE)
        try:
            rows = hl_smi_rows if hl_smi_rows is not None else read_hl_smi()
        except Exception as error:
            raise SelectionError(
                f"Both {MODULES_VARIABLE}={modules!r} and {DEVICES_VARIABLE}={indices!r} are set and "
                f"hl-smi cannot be read to check that they agree ({error}). Set only {MODULES_VARIABLE}."
            ) from error
        translated = indices_to_modules(index_ids, rows)
        if set(translated) != set(module_ids):
            raise SelectionError(
                f"{MODULES_VARIABLE}={modules!r} and {DEVICES_VARIABLE}={indices!r} disagree: the "
                f"indices are module IDs {sorted(translated)} by hl-smi, not {sorted(module_ids)}. "
                f"Unset {DEVICES_VARIABLE} and keep {MODULES_VARIABLE} (module IDs are stable)."
            )
        return modules, BY_MODULE
    if modules is not None:
        parse_id_list(modules, MODULES_VARIABLE)  # its own name in the error (an empty value included)
        return modules, BY_MODULE
    if indices is not None:
        parse_id_list(indices, DEVICES_VARIABLE)
        return indices, BY_INDEX
    return None, BY_MODULE


def child_env(devices: tuple[str, ...], by: str, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The Gaudi variables to set for a child: the selection variable, and int64 where it is supported.

    `PT_ENABLE_INT64_SUPPORT=1` is written only when the child will run in eager mode (read from
    `environ`'s `PT_HPU_LAZY_MODE` and the installed plugin, `execution_mode`): Intel supports it
    only there (and on Gaudi2 or newer, where eager mode turns it on by default anyway). In lazy
    mode it is not written. The Gaudi generation is not known when an environment is prepared
    (possibly for another machine); on Gaudi 1 `hwenv doctor` reports int64 as unsupported.
    """
    env = os.environ if environ is None else environ
    out: dict[str, str] = {}
    if devices:
        out[variable_for(by)] = ",".join(devices)
    if int64_status(env, device_name=None, mode=execution_mode(env)).supported:
        out[INT64_VARIABLE] = "1"  # Transformers uses int64 token ids (G4)
    return out


def child_removals(devices: tuple[str, ...], by: str) -> tuple[str, ...]:
    """Inherited variables to drop from a child's environment: the pin, and the other selection variable."""
    removed = [MODULE_ID_VARIABLE]  # a child must not inherit this process's module pin
    if devices:
        removed.append(DEVICES_VARIABLE if by == BY_MODULE else MODULES_VARIABLE)
    return tuple(removed)

"""`validate_selection`: the device selection an environment makes for a kind, or an error before work starts.

The same rules `hwenv doctor` reports (`selection_checks`, `xpu_checks`) and `hwdist` enforces, with
the parsers they share (`current_selection`, `parse_affinity_mask`, `hwenv.gaudi.parse_id_list`), for
callers that must refuse rather than report (`hwrun plan`, issue 27 point 6):
- Gaudi: `HLS_MODULE_ID` (a module number, one of `HABANA_VISIBLE_MODULES` when that is set), then
  `HABANA_VISIBLE_MODULES` / `HABANA_VISIBLE_DEVICES` (ids, agreement through hl-smi when both are
  set, module IDs 0..7, Intel's supported groups for 2+ cards, G8);
- Intel GPU: `ZE_FLAT_DEVICE_HIERARCHY` and `ZE_AFFINITY_MASK` read in it (Level Zero);
- index kinds (`CUDA_VISIBLE_DEVICES`, `HIP_VISIBLE_DEVICES`, `ROCR_VISIBLE_DEVICES`): every one
  that is set is a list of distinct non-negative indices (device UUIDs are left to the runtime, which
  accepts them; doctor warns that hwenv/hwdist count by index).
With `device_count` (torch's count, already narrowed by the selection), a selection naming more
devices than that is an error: the runtimes drop entries they cannot find, silently.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from . import gaudi
from .errors import SelectionError
from .platforms import get_platform
from .selection import Selection, current_selection

#: Entry forms the CUDA/HIP runtimes accept that hwenv's index parser does not (it counts devices by index).
UUID_PREFIXES = ("GPU-", "MIG-")


def gaudi_fix(env: Mapping[str, str]) -> str:
    """How to repair an invalid Gaudi selection in `env` (doctor's `invalid-gaudi-selection` fix too)."""
    if gaudi.MODULES_VARIABLE in env and gaudi.DEVICES_VARIABLE in env:
        return f"keep only {gaudi.MODULES_VARIABLE} (module IDs are stable): unset {gaudi.DEVICES_VARIABLE}"
    return (f"set {gaudi.MODULES_VARIABLE} to one card, a supported group ({gaudi.supported_groups_text()}) or all 8, "
            f"or unset it; hwenv exec --devices ... sets it for one command")


def uses_uuids(value: str) -> bool:
    """Whether an index-list value names devices by UUID (`GPU-...`, `MIG-...`), which the runtimes accept."""
    return any(item.strip().startswith(UUID_PREFIXES) for item in value.split(","))


def index_problem(variable: str, value: str, count: int | None = None) -> tuple[str, str] | None:
    """`(message, fix)` when the runtime would silently drop devices of `variable=value`: a bad or repeated entry,
    an empty or '-1' list, more entries than `count` (torch's count under the selection); else None."""
    if uses_uuids(value):
        return None
    try:
        ids = gaudi.parse_id_list(value, variable)  # the parser hwenv.select and hwdist launch use
    except SelectionError as error:
        return (f"{error} The runtime stops reading the list at the first entry it cannot parse (so later devices "
                f"are silently dropped, and an empty or '-1' list hides every device); hwdist launch refuses it.",
                f"set {variable} to distinct indices such as 0,1, or unset it")
    if count is not None and count < len(ids):
        return (f"{variable}={value!r} names {len(ids)} device(s), but torch sees {count}: the runtime stops at the "
                f"first index that is not present, silently.",
                f"list only indices of devices present (unset {variable} and run hwenv doctor to see them)")
    return None


def check_index_variable(variable: str, value: str, count: int | None = None) -> None:
    """`SelectionError` (message and fix) where `index_problem` finds one."""
    found = index_problem(variable, value, count)
    if found:
        raise SelectionError(f"{found[0]} Fix: {found[1]}.")


def _indices(kind: str, env: Mapping[str, str], device_count: int | None) -> Selection:
    platform = get_platform(kind)
    present = [variable for variable in platform.visible_devices if variable in env]
    # with several variables set the runtime applies them in turn, so torch's count is compared with one alone
    count = device_count if len(present) == 1 else None
    for variable in present:
        check_index_variable(variable, env[variable], count)
    value = next((env[v] for v in present if env[v]), None)  # the one current_selection reads
    if value is None:
        return Selection(kind)
    return Selection(kind, tuple(item.strip() for item in value.split(",")))  # UUID entries kept as written


def _gaudi(kind: str, env: Mapping[str, str], hl_smi_rows: tuple[gaudi.HlSmiRow, ...] | None) -> Selection:
    # every Gaudi selection error already ends with its fix (which variable to change, the supported groups)
    gaudi.module_pin(env)
    gaudi.modules_for_processes(1, env)  # a pin must be one of HABANA_VISIBLE_MODULES when that is set
    unpinned = {name: value for name, value in env.items() if name != gaudi.MODULE_ID_VARIABLE}
    return current_selection(kind, unpinned, hl_smi_rows=hl_smi_rows)


def _affinity(kind: str, env: Mapping[str, str], device_count: int | None) -> Selection:
    from .affinity import MASK_VARIABLE

    selection = current_selection(kind, env)  # hierarchy, then the mask read in it (messages carry their fix)
    wanted = selection.count
    if device_count is not None and wanted is not None and device_count < wanted:
        raise SelectionError(
            f"{MASK_VARIABLE}={env[MASK_VARIABLE]!r} names {wanted} device(s), but the driver exposes {device_count}: "
            f"it skips ordinals that are not present, silently (Level Zero spec, Affinity Mask). Fix: list only "
            f"ordinals of devices present (unset {MASK_VARIABLE} and run hwenv doctor to see them)."
        )
    return selection


def validate_selection(
    kind: str,
    env: Mapping[str, str] | None = None,
    *,
    device_count: int | None = None,
    hl_smi_rows: tuple[gaudi.HlSmiRow, ...] | None = None,
) -> Selection:
    """The `Selection` `env` (default `os.environ`) makes for `kind`; an `HwenvError` naming the variable, its
    value, the rule and the fix when the runtime would not use the devices it names.

    `device_count` is the count torch reports under this selection (optional); `hl_smi_rows` the
    `hl-smi` mapping (read when both Gaudi variables are set and this is None).
    """
    env = os.environ if env is None else env
    platform = get_platform(kind)  # PlatformError for a kind no platform has
    grammar = platform.selection_grammar
    if grammar == "module-ids":
        return _gaudi(kind, env, hl_smi_rows)
    if grammar == "affinity-mask":
        return _affinity(kind, env, device_count)
    if grammar == "indices":
        return _indices(kind, env, device_count)
    return Selection(kind)


__all__ = ["UUID_PREFIXES", "check_index_variable", "gaudi_fix", "index_problem", "uses_uuids", "validate_selection"]

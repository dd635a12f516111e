"""Selection checks of `hwenv doctor`: each selection variable read with the parser `hwdist launch` uses.

`hwenv.current_selection` (Gaudi: `HABANA_VISIBLE_MODULES` / `HABANA_VISIBLE_DEVICES`, their
agreement through hl-smi, the supported groups, G8) and `hwenv.gaudi.parse_id_list` (the index
lists `select` reads: `CUDA_VISIBLE_DEVICES`, `HIP_VISIBLE_DEVICES`, `ROCR_VISIBLE_DEVICES`).
Not repeated here: `ZE_AFFINITY_MASK` and its hierarchy (`xpu_checks`), `HLS_MODULE_ID`
(`gaudi_checks.pin_findings`), `PT_HPU_LAZY_MODE` / `PT_ENABLE_INT64_SUPPORT` (`gaudi_checks`).
"""

from __future__ import annotations

from collections.abc import Mapping

from .. import gaudi
from ..accelerator import Accelerator
from ..errors import HwenvError
from ..platforms import platforms
from ..probes import ProbeResult
from ..selection import current_selection
from .common import Checks, Problem

#: Entry forms the CUDA/HIP runtimes accept that hwstack's index parser does not (it counts devices by index).
UUID_PREFIXES = ("GPU-", "MIG-")


def _gaudi_problem(kind: str, env: Mapping[str, str]) -> Problem | None:
    unpinned = {name: value for name, value in env.items() if name != gaudi.MODULE_ID_VARIABLE}
    try:
        current_selection(kind, unpinned)
    except HwenvError as error:
        both = gaudi.MODULES_VARIABLE in env and gaudi.DEVICES_VARIABLE in env
        fix = (f"keep only {gaudi.MODULES_VARIABLE} (module IDs are stable): unset {gaudi.DEVICES_VARIABLE}" if both
               else f"set {gaudi.MODULES_VARIABLE} to one card, a supported group ({gaudi.supported_groups_text()}) "
                    f"or all 8, or unset it; hwenv exec --devices ... sets it for one command")
        return Problem("invalid-gaudi-selection", "error", f"{error} (hwdist launch refuses this selection, and hwdist.init() with 2+ processes per node)", fix)
    return None


def _index_problem(variable: str, value: str, count: int | None) -> Problem | None:
    items = [item.strip() for item in value.split(",")]
    if any(item.startswith(UUID_PREFIXES) for item in items):
        return Problem(
            "uuid-selection", "warning",
            f"{variable}={value!r} names devices by UUID: the runtime accepts that, but hwenv/hwdist count devices "
            f"by index and refuse it (hwdist launch without --devices reads this variable).",
            f"use indices (e.g. {variable}=0,1), or pass hwdist launch --devices with indices",
        )
    try:
        ids = gaudi.parse_id_list(value, variable)  # the parser hwenv.select uses for index lists
    except HwenvError as error:
        return Problem(
            "invalid-device-selection", "error",
            f"{error} The runtime stops reading the list at the first entry it cannot parse (so later devices are "
            f"silently dropped, and an empty or '-1' list hides every device); hwdist launch refuses it.",
            f"set {variable} to distinct indices such as 0,1, or unset it",
        )
    # `count` is torch's count, already narrowed by the variable (0,3 on four GPUs is two), so indices
    # cannot be compared with it; fewer devices than entries means the runtime dropped some silently.
    if count is not None and count < len(ids):
        return Problem(
            "invalid-device-selection", "error",
            f"{variable}={value!r} names {len(ids)} device(s), but torch sees {count}: the runtime stops at the "
            f"first index that is not present, silently.",
            f"list only indices of devices present (unset {variable} and run hwenv doctor to see them)",
        )
    return None


def selection_checks(acc: Accelerator | None, probes: Mapping[str, ProbeResult], env: Mapping[str, str]) -> Checks:
    """Invalid device selections in the environment, each named with its rule and fix (issue 27)."""
    problems: list[Problem] = []
    seen: set[str] = set()
    for platform in platforms():
        grammar = platform.selection_grammar
        if grammar == "module-ids":
            if any(variable in env for variable in platform.visible_devices):
                found = _gaudi_problem(platform.kind, env)
                problems += [found] if found else []
        elif grammar == "indices":
            probe = probes.get(platform.kind)
            count = probe.count if probe is not None and probe.available else None
            for variable in platform.visible_devices:
                if variable in env and (variable not in seen or count is not None):
                    seen.add(variable)
                    found = _index_problem(variable, env[variable], count)
                    problems += [found] if found else []
    return problems, []


__all__ = ["selection_checks"]

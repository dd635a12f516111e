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
from ..validation import gaudi_fix, index_problem, uses_uuids
from .common import Checks, Problem


def _gaudi_problem(kind: str, env: Mapping[str, str]) -> Problem | None:
    unpinned = {name: value for name, value in env.items() if name != gaudi.MODULE_ID_VARIABLE}  # pin: gaudi_checks
    try:
        current_selection(kind, unpinned)
    except HwenvError as error:
        return Problem("invalid-gaudi-selection", "error", f"{error} (hwdist launch refuses this selection, and hwdist.init() with 2+ processes per node)", gaudi_fix(env))
    return None


def _index_problem(variable: str, value: str, count: int | None) -> Problem | None:
    if uses_uuids(value):
        return Problem(
            "uuid-selection", "warning",
            f"{variable}={value!r} names devices by UUID: the runtime accepts that, but hwenv/hwdist count devices "
            f"by index and refuse it (hwdist launch without --devices reads this variable).",
            f"use indices (e.g. {variable}=0,1), or pass hwdist launch --devices with indices",
        )
    # `count` is torch's count, already narrowed by the variable (0,3 on four GPUs is two), so indices
    # cannot be compared with it; fewer devices than entries means the runtime dropped some silently.
    found = index_problem(variable, value, count)  # the rule hwenv.validate_selection raises for
    return Problem("invalid-device-selection", "error", found[0], found[1]) if found else None


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
            present = [variable for variable in platform.visible_devices if variable in env]
            # several set: the runtime applies them in turn, so torch's count is compared with one alone
            count = probe.count if probe is not None and probe.available and len(present) == 1 else None
            for variable in present:
                if variable not in seen or count is not None:
                    seen.add(variable)
                    found = _index_problem(variable, env[variable], count)
                    problems += [found] if found else []
    return problems, []


__all__ = ["selection_checks"]

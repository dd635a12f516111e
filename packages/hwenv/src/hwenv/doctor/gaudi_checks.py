"""Gaudi checks of `hwenv doctor`: the plugin, Accelerate's gate (G5), int64 (G4), lazy mode (G2)."""

from __future__ import annotations

import importlib.util
import shutil
from collections.abc import Mapping

from .. import gaudi
from ..accelerator import Accelerator
from ..probes import ProbeResult
from ..versions import GAUDI_MIN_ACCELERATE, accelerate_sees_gaudi, format_version, library_versions
from .common import Checks, Problem


def _plugin_importable() -> bool:
    """Whether `habana_frameworks` can be imported (found without importing it)."""
    try:
        return importlib.util.find_spec("habana_frameworks") is not None
    except (ImportError, ValueError):
        return False


def gaudi_checks(acc: Accelerator | None, probes: Mapping[str, ProbeResult], env: Mapping[str, str]) -> Checks:
    """Problems and notes about Intel Gaudi."""
    problems: list[Problem] = []
    notes: list[str] = []
    hpu = probes["hpu"]
    plugin_present = _plugin_importable()
    if plugin_present and not accelerate_sees_gaudi():
        acc_version = library_versions().get("accelerate")
        problems.append(Problem(
            "accelerate-too-old-for-gaudi", "error",
            f"Accelerate {acc_version or '(not installed)'} is older than {format_version(GAUDI_MIN_ACCELERATE)}: "
            f"transformers.is_torch_hpu_available() returns False even with a Gaudi present (G3, G5).",
            f"pip install 'accelerate>={format_version(GAUDI_MIN_ACCELERATE)}'",
        ))
    if acc is not None and acc.kind == "hpu":
        if env.get(gaudi.INT64_VARIABLE) != "1":
            problems.append(Problem(
                "int64-disabled", "error",
                f"{gaudi.INT64_VARIABLE} is {repr(env[gaudi.INT64_VARIABLE]) if gaudi.INT64_VARIABLE in env else 'not set'}: "
                f"Transformers uses int64 token ids, "
                f"which Gaudi rejects unless int64 support is on (G4).",
                f"run with {gaudi.INT64_VARIABLE}=1 (hwenv exec and hwenv env set it for you)",
            ))
        lazy = env.get(gaudi.LAZY_MODE_VARIABLE)
        if lazy == "1":
            notes.append(f"Gaudi execution mode: lazy ({gaudi.LAZY_MODE_VARIABLE}=1). torch.compile needs eager mode.")
            problems.append(Problem(
                "lazy-mode-blocks-compile", "warning",
                f"{gaudi.LAZY_MODE_VARIABLE}=1 selects lazy mode; torch.compile (hpu_backend) needs eager mode (G2, G13).",
                f"run with {gaudi.LAZY_MODE_VARIABLE}=0 to use torch.compile, or do not compile",
            ))
        else:
            notes.append(
                f"Gaudi execution mode: eager ({gaudi.LAZY_MODE_VARIABLE}={lazy!r}); ops run when called (G2), "
                f"torch.compile routes to hpu_backend."
            )
    if not hpu.available and shutil.which("hl-smi") and not plugin_present:
        problems.append(Problem(
            "torch-without-hpu", "error",
            "hl-smi is installed (a Gaudi driver is here) but habana_frameworks is not importable (G3).",
            gaudi.PLUGIN_INSTALL_HINT,
        ))
    return problems, notes

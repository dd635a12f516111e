"""Intel GPU checks of `hwenv doctor`: the affinity mask (X4, X5) and the torch build (X1, X2)."""

from __future__ import annotations

import shutil
from collections.abc import Mapping

from ..accelerator import Accelerator
from ..affinity import MASK_VARIABLE, PCI_ORDER_VARIABLE, parse_affinity_mask
from ..errors import HwenvError
from ..probes import ProbeResult
from .common import Checks, Problem


def xpu_checks(acc: Accelerator | None, probes: Mapping[str, ProbeResult], env: Mapping[str, str]) -> Checks:
    """Problems and notes about Intel GPUs."""
    problems: list[Problem] = []
    xpu = probes["xpu"]
    if MASK_VARIABLE in env:
        try:
            parse_affinity_mask(env[MASK_VARIABLE], xpu.count if xpu.available else None)
        except HwenvError as error:
            problems.append(Problem("invalid-affinity-mask", "error", str(error), f"fix or unset {MASK_VARIABLE}"))
        if env.get(PCI_ORDER_VARIABLE) != "1":
            problems.append(Problem(
                "unstable-xpu-order", "warning",
                f"{MASK_VARIABLE} is set without {PCI_ORDER_VARIABLE}=1: the mask's order does not set enumeration "
                f"order, which may change between runs (X5).",
                f"also set {PCI_ORDER_VARIABLE}=1 (hwenv exec does)",
            ))
    if not xpu.available and shutil.which("xpu-smi") and "no XPU backend" in xpu.reason:
        problems.append(Problem(
            "torch-without-xpu", "error",
            "xpu-smi is installed (an Intel GPU driver is here) but this torch build has no XPU backend (X1, X2).",
            'pip install "transformers[torch]" --extra-index-url https://download.pytorch.org/whl/xpu',
        ))
    return problems, []

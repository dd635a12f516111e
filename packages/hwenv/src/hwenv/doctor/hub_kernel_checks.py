"""`hwenv doctor`: when Transformers reaches for Hub kernels on this device, and whether that works offline (issue 41.9).

The rules are `hwenv.hub_kernels`' (read from transformers 5.25 `modeling_utils.py`, `integrations/hub_kernels.py`
and kernels 0.19 `_internals/_versions.py`).
"""

from __future__ import annotations

from collections.abc import Mapping

from ..accelerator import Accelerator
from ..hub_kernels import FIX, hub_kernels_status
from ..probes import ProbeResult
from .common import Checks, Problem


def hub_kernel_checks(acc: Accelerator | None, probes: Mapping[str, ProbeResult], env: Mapping[str, str]) -> Checks:
    """An error when a plain Transformers load here would fail offline for a missing Hub kernel; else a note
    (with the fix where an offline run would fail)."""
    if acc is None:
        return [], []
    status = hub_kernels_status(acc.device_type, env)
    if status.fails_offline:
        return [Problem("hub-kernels-offline", "error",
                        f"{status.reason()}. hwrun is not affected (it loads with use_kernels=False unless asked); "
                        f"your own from_pretrained/Trainer scripts, `transformers serve` and benchmarks that call "
                        f"Transformers directly are.", FIX)], []
    if status.reaches_hub and status.missing:  # online: downloaded on first use; said, with the fix for offline
        return [], [f"Hub kernels: {status.reason()}. Offline (HF_HUB_OFFLINE=1 or no network) such a load raises; "
                    f"fix: {FIX}."]
    return [], [f"Hub kernels: {status.reason()}."]

"""The accelerator this machine has (or None) and the marks every test in tests/gpu carries: `gpu`, and a
skip with the reason where only a CPU is here."""

from __future__ import annotations

import hwenv
import pytest


def detected_accelerator() -> hwenv.Accelerator | None:
    """hwenv's detected accelerator, or None where detection finds only the CPU (or fails)."""
    try:
        accel = hwenv.detect()
    except hwenv.HwenvError:
        return None
    return accel if accel.platform.is_accelerator else None


ACCEL = detected_accelerator()
GPU_MARKS = [
    pytest.mark.gpu,
    pytest.mark.skipif(ACCEL is None, reason="needs an accelerator: hwenv.detect() found only the CPU here "
                                             "(run tools/run_gpu_tests.sh on a GPU machine)"),
]

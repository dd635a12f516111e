# Facts: X3, G5
# Run: uv run python examples/check_device.py
"""Is an Intel GPU (XPU) or an Intel Gaudi (HPU) usable here? The seeds' own checks, next to hwenv's answer.

X3: `torch.xpu.is_available(), torch.xpu.device_count()` prints e.g. `True 2` on a 2-XPU machine.
G5: `transformers.is_torch_hpu_available()` is True on a usable Gaudi, and False when Accelerate is
older than 1.5.0 even with a Gaudi present; hwenv says which of the two it is. On this CPU machine
both checks say False and hwenv says why each kind was skipped.
"""

from __future__ import annotations

import hwenv


def main() -> int:
    import torch
    from transformers import is_torch_hpu_available

    accel = hwenv.detect()
    print(f"hwenv.detect(): kind={accel.kind} count={accel.count} device={accel.device} bf16={accel.bf16}")
    for reason in accel.reasons:
        print(f"  skipped {reason}")

    # X3, the seed's check, verbatim (examples may touch torch.xpu; our packages leave that to hwenv).
    print("torch.xpu.is_available(), torch.xpu.device_count():", torch.xpu.is_available(), torch.xpu.device_count())

    # G5, the seed's check, verbatim, and why it may be False with a Gaudi present.
    print("transformers.is_torch_hpu_available():", is_torch_hpu_available())
    accelerate = hwenv.installed_version("accelerate")
    print(f"accelerate {accelerate}: new enough for Gaudi (>= 1.5.0): {hwenv.accelerate_sees_gaudi()}")

    report = hwenv.diagnose()
    for problem in report.problems:
        print(f"problem {problem.code}: {problem.message} Fix: {problem.fix}")
    if not report.problems:
        print("hwenv doctor: no problems")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Tensor parallelism on real accelerators (`gpu` marker, issue 37.3): `hwrun generate --tp 2` on two devices of
this machine (nccl on NVIDIA/ROCm, xccl on XPU, hccl on Gaudi), hwrun's engine on every rank (graphs captured per
rank where the device has them), gives `tp=1`'s greedy tokens. Skipped, with the reason,
where fewer than two accelerators are here (a CPU machine, or the one lent GPU):
`pytest -m gpu packages/hwrun/tests/test_hwrun_tp_gpu.py` on a machine with several."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import hwenv
import pytest


def _accelerators() -> tuple[hwenv.Accelerator | None, str]:
    try:
        accel = hwenv.detect()
    except hwenv.HwenvError as error:
        return None, f"hwenv.detect() failed: {error}"
    if not accel.platform.is_accelerator:
        return None, "needs 2 accelerators: hwenv.detect() found only the CPU here"
    if accel.count < 2:
        return None, f"needs 2 accelerators for --tp 2: this machine has {accel.count} {accel.kind}"
    return accel, ""


ACCEL, WHY = _accelerators()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(ACCEL is None, reason=WHY or "no accelerator")]


def test_generate_tp2_on_two_devices_equals_one_device(tmp_path):
    import hwrun
    from hwrun.testing.families import build_tiny_family

    model = str(build_tiny_family("llama", tmp_path / "llama"))
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    done = subprocess.run([sys.executable, "-m", "hwrun.cli", "generate", "--model", model, "--tp", "2", "--json",
                           "--dtype", "float32", "--max-new-tokens", "16", "The king said"],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    alone = hwrun.generate(hwrun.plan(model, dtype="float32"), "The king said", 16, batching="static",
                           decode="generate")
    printed = json.loads(done.stdout)
    assert printed["token_ids"] == alone.token_ids
    assert (printed["decode"], printed["batching"]) == ("graphs", "continuous")  # hwrun's engine, graphs per rank

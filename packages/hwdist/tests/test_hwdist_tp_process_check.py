"""`hwdist.launch.check_process_count` (issue 37): N processes, one per device, checked before anything starts, the
check `hwrun.plan(tp=N)` runs: a device count, the environment's selection (XPU affinity mask, Gaudi modules), Intel's
Gaudi groups (G8), the CPU per-core bound."""

from __future__ import annotations

import hwenv
import pytest
from hwdist.errors import GaudiWorldError, LaunchError
from hwdist.launch import check_process_count
from hwenv.testing import fake_gaudi, fake_xpu


def test_cpu_processes_are_bounded_by_the_cores():
    accel = hwenv.Accelerator("cpu", 1)
    assert check_process_count(2, accel).nproc == 2
    with pytest.raises(LaunchError, match="exceeds"):
        check_process_count(1000, accel)


@pytest.mark.parametrize("nproc", [0, -2, True, 1.5])
def test_bad_counts_are_refused(nproc):
    with pytest.raises(LaunchError, match="positive integer"):
        check_process_count(nproc, hwenv.Accelerator("cpu", 1))


def test_cuda_devices_bound_the_processes():
    accel = hwenv.Accelerator("cuda", 4)
    check = check_process_count(4, accel, read_selection=False)
    assert check.nproc == 4 and "local ranks 0..3 of the 4 visible" in check.reason
    with pytest.raises(LaunchError, match="exceeds the 4 cuda device"):
        check_process_count(8, accel, read_selection=False)


@pytest.mark.facts("X18")
def test_xpu_affinity_mask_is_the_selection():
    with fake_xpu(4, affinity_mask="2,3"):
        accel = hwenv.detect()
        check = check_process_count(2, accel)
        assert check.devices == ("2", "3") and "ZE_AFFINITY_MASK=2,3" in check.reason
        with pytest.raises(LaunchError, match="exceeds the 2 xpu device"):
            check_process_count(3, accel)


@pytest.mark.facts("G8")
def test_gaudi_groups_of_two_and_four_only():
    with fake_gaudi(8):
        accel = hwenv.detect()
        assert check_process_count(4, accel).modules == (0, 1, 2, 3)
        with pytest.raises(GaudiWorldError):
            check_process_count(3, accel)
    with fake_gaudi(8, visible_modules="6,7"):
        check = check_process_count(2, hwenv.detect())
        assert check.modules == (6, 7) and "HABANA_VISIBLE_MODULES=6,7" in check.reason


def test_launch_passes_the_scripts_own_options_unabbreviated(capsys):
    """`hwdist launch -m hwrun.cli train --device auto`: `--device` is the script's, not an abbreviation of ours."""
    import json

    from hwdist.cli import main

    assert main(["launch", "--dry-run", "--kind", "cpu", "--nproc-per-node", "2", "-m", "hwrun.cli", "train",
                 "--device", "auto", "--dev", "x"]) == 0
    argv = json.loads(capsys.readouterr().out)["argv"]
    assert argv[-6:] == ["hwrun.cli", "train", "--device", "auto", "--dev", "x"]

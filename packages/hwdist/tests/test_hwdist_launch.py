"""`hwdist launch`: the torchrun command it builds (with fakes for XPU / Gaudi / CUDA), and real
runs through torchrun on loopback: one node with 2 processes, two "nodes" with --nnodes 2."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import hwdist
import hwenv
import pytest
from hwdist.cli import main
from hwdist.launch import child_environment

WORKER = Path(__file__).with_name("hwdist_worker.py")
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def clean_env(**extra: str) -> dict[str, str]:
    drop = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
            "ZE_AFFINITY_MASK", "HABANA_VISIBLE_MODULES", "HABANA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(HWENV_DEVICE="cpu", OMP_NUM_THREADS="1", HWDIST_TEST_TIMEOUT="20", PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


# ---- the command ---------------------------------------------------------------------------

@pytest.mark.facts("X4", "X5", "X18")
def test_xpu_defaults_to_one_process_per_visible_device(fake_xpu):
    fake_xpu(count=4)
    argv, env = hwdist.launch_command("train.py", ["--lr", "1e-4"])
    assert argv == [*TORCHRUN, "--nproc-per-node=4", "train.py", "--lr", "1e-4"]
    assert env == {"ZE_ENABLE_PCI_ID_DEVICE_ORDER": "1"}


@pytest.mark.facts("X4", "X5")
def test_xpu_selection_sets_mask_for_the_child_and_counts_it(fake_xpu):
    fake_xpu(count=4)
    argv, env = hwdist.launch_command("train.py", devices="0,2")
    assert "--nproc-per-node=2" in argv
    assert env == {"ZE_AFFINITY_MASK": "0,2", "ZE_ENABLE_PCI_ID_DEVICE_ORDER": "1"}
    assert "ZE_AFFINITY_MASK" not in os.environ  # only the child gets it (X4)


@pytest.mark.facts("G6", "G8", "G16", "G4")
def test_gaudi_supported_group_gives_module_ids_and_nproc(fake_gaudi):
    fake_gaudi(8)
    argv, env = hwdist.launch_command("train.py", devices="5,4")
    assert "--nproc-per-node=2" in argv
    assert env == {"HABANA_VISIBLE_MODULES": "5,4", "PT_ENABLE_INT64_SUPPORT": "1"}
    argv, _ = hwdist.launch_command("train.py")
    assert "--nproc-per-node=8" in argv


@pytest.mark.facts("G8")
def test_gaudi_unsupported_group_or_partial_use_is_rejected(fake_gaudi):
    fake_gaudi(8)
    with pytest.raises(hwdist.LaunchError, match=r"not a supported 2-device group"):
        hwdist.launch_command("train.py", devices="0,2")
    with pytest.raises(hwdist.LaunchError, match="part of the 4 selected Gaudi modules"):
        hwdist.launch_command("train.py", devices="0,1,2,3", nproc_per_node=2)


@pytest.mark.facts("G8")
def test_one_process_over_several_modules_given_on_the_command_line_is_refused(fake_gaudi, monkeypatch):
    """`--devices 0,1 --nproc-per-node 1` leaves a selected card idle: refused (issue 42.8). The same selection
    from the environment is allowed (the habana container runtime writes HABANA_VISIBLE_MODULES itself)."""
    fake_gaudi(8)
    with pytest.raises(hwdist.LaunchError, match="--nproc-per-node 1 uses 1 of the 2 selected Gaudi modules; the "
                       "others would stay idle: .*--nproc-per-node 2"):
        hwdist.launch_command("train.py", devices="0,1", nproc_per_node=1)
    monkeypatch.setenv("HABANA_VISIBLE_MODULES", "0,1")
    argv, _ = hwdist.launch_command("train.py", nproc_per_node=1)
    assert "--nproc-per-node=1" in argv


@pytest.mark.facts("G8")
def test_a_bad_selection_inherited_from_the_environment_names_its_variable(fake_gaudi, monkeypatch):
    fake_gaudi(8)
    monkeypatch.setenv("HABANA_VISIBLE_MODULES", "0,0")
    with pytest.raises(hwdist.LaunchError) as info:
        hwdist.launch_command("train.py")
    assert "HABANA_VISIBLE_MODULES='0,0'" in str(info.value) and "None" not in str(info.value)


@pytest.mark.facts("G8", "G6")
@pytest.mark.parametrize("by, variable", [("module", "HABANA_VISIBLE_MODULES"), ("index", "HABANA_VISIBLE_DEVICES")])
def test_gaudi_single_card_launch_starts_one_process(clean_device_env, by, variable):
    """`hwdist launch --kind hpu --devices 3`: one card is a standard run, not a refused group (issue 23.1)."""
    argv, env = hwdist.launch_command("train.py", kind="hpu", devices="3", by=by)
    assert "--nproc-per-node=1" in argv
    assert env[variable] == "3"
    assert main(["launch", "--dry-run", "--kind", "hpu", "--devices", "3", "train.py"]) == 0


@pytest.mark.facts("G8")
def test_gaudi_distributed_group_outside_intels_table_names_the_supported_groups(clean_device_env):
    with pytest.raises(hwdist.LaunchError) as info:
        hwdist.launch_command("train.py", kind="hpu", devices="0,2")
    assert "not a supported 2-device group" in str(info.value)
    assert "{0,1} or {2,3} or {4,5} or {6,7}" in str(info.value) and "{0,1,2,3} or {4,5,6,7}" in str(info.value)
    with pytest.raises(hwdist.LaunchError, match="groups of 2 or 4"):
        hwdist.launch_command("train.py", kind="hpu", devices="0,1,2")


@pytest.mark.facts("G8")
def test_gaudi_module_pin_is_honoured_for_one_process_and_not_inherited(fake_gaudi, monkeypatch):
    fake_gaudi(8)
    monkeypatch.setenv("HLS_MODULE_ID", "5")  # the bridge's pin wins over every selection
    plan = hwdist.plan_launch("train.py")
    assert plan.nproc_per_node == 1 and plan.env["HABANA_VISIBLE_MODULES"] == "5"
    # one process on one module is pinned by the selection itself (issue 41.4: with world size 1 the bridge's
    # _setup_module_id pins nothing, and an unpinned process takes any free card, backend/synapse_helpers/device.cpp)
    assert child_environment(plan.env, {"HLS_MODULE_ID": "2"}, selection=plan.selection)["HLS_MODULE_ID"] == "5"
    with pytest.raises(hwdist.LaunchError, match="exceeds the 1 hpu device"):
        hwdist.launch_command("train.py", nproc_per_node=2)


@pytest.mark.facts("X4")
def test_xpu_composite_sub_devices_of_one_card_are_one_process(clean_device_env, monkeypatch):
    """Under COMPOSITE, `0.0,0.1,1` is two root devices (card 0's tiles are one device): 2 processes,
    not 3 (hwenv's Selection.count follows the hierarchy; issue 23.6). Under FLAT it is refused."""
    monkeypatch.setenv("ZE_FLAT_DEVICE_HIERARCHY", "COMPOSITE")
    argv, env = hwdist.launch_command("train.py", kind="xpu", devices="0.0,0.1,1")
    assert "--nproc-per-node=2" in argv and env["ZE_AFFINITY_MASK"] == "0.0,0.1,1"
    with pytest.raises(hwdist.LaunchError, match="exceeds the 2 xpu device"):
        hwdist.launch_command("train.py", kind="xpu", devices="0.0,0.1,1", nproc_per_node=3)
    monkeypatch.setenv("ZE_FLAT_DEVICE_HIERARCHY", "FLAT")
    with pytest.raises(hwdist.LaunchError, match="not valid under ZE_FLAT_DEVICE_HIERARCHY=FLAT"):
        hwdist.launch_command("train.py", kind="xpu", devices="0.0,0.1,1")


def test_rocm_launch_counts_its_devices(clean_device_env):
    argv, env = hwdist.launch_command("train.py", kind="rocm", device_count=4)
    assert "--nproc-per-node=4" in argv and env == {}
    with pytest.raises(hwdist.LaunchError, match="exceeds the 4 rocm device"):
        hwdist.launch_command("train.py", kind="rocm", device_count=4, nproc_per_node=5)


def test_rocm_devices_go_to_its_visible_devices_variable(clean_device_env):
    variable = hwenv.get_platform("rocm").visible_devices_variable
    argv, env = hwdist.launch_command("train.py", kind="rocm", devices="0,1")
    assert "--nproc-per-node=2" in argv and env == {variable: "0,1"}


def test_kind_choices_come_from_the_registry():
    from hwdist.cli import build_parser

    kind = next(a for a in build_parser()._subparsers._group_actions[0].choices["launch"]._actions
                if a.dest == "kind")
    assert tuple(kind.choices) == tuple(p.kind for p in hwenv.platforms())
    assert "rocm" in kind.choices


def test_cuda_visible_devices_and_too_many_processes(fake_cuda):
    fake_cuda(count=2)
    argv, env = hwdist.launch_command("train.py", devices="1")
    assert "--nproc-per-node=1" in argv and env == {"CUDA_VISIBLE_DEVICES": "1"}
    with pytest.raises(hwdist.LaunchError, match="exceeds the 2 cuda device"):
        hwdist.launch_command("train.py", nproc_per_node=3)


def test_cpu_defaults_to_one_process_and_has_no_devices():
    argv, env = hwdist.launch_command("train.py", kind="cpu")
    assert "--nproc-per-node=1" in argv and env == {}
    argv, _ = hwdist.launch_command("train.py", kind="cpu", nproc_per_node=3)
    assert "--nproc-per-node=3" in argv
    with pytest.raises(hwdist.LaunchError, match="selects nothing on cpu"):
        hwdist.launch_command("train.py", kind="cpu", devices="0")


def test_kind_for_another_machine_needs_devices_or_nproc(clean_device_env):
    with pytest.raises(hwdist.LaunchError, match="pass --nproc-per-node N, --devices, or --device-count N"):
        hwdist.launch_command("train.py", kind="xpu")  # no XPU here
    argv, env = hwdist.launch_command("train.py", kind="xpu", devices="0,1")
    assert "--nproc-per-node=2" in argv and env["ZE_AFFINITY_MASK"] == "0,1"


@pytest.mark.facts("X4")
def test_detected_kind_checks_devices_against_this_machine(fake_xpu):
    fake_xpu(count=2)
    with pytest.raises(hwdist.LaunchError, match=r"2 xpu device\(s\) this process sees.*names device 3") as info:
        hwdist.launch_command("train.py", devices="0,3")
    assert "--device-count" in str(info.value)  # the fix for a command meant for another machine
    with pytest.raises(hwdist.LaunchError, match="exceeds the 2 xpu device"):
        hwdist.launch_command("train.py", nproc_per_node=3)


@pytest.mark.facts("X4", "G16")
def test_explicit_device_count_is_the_target_nodes_count(fake_xpu):
    fake_xpu(count=2)  # this machine: 2 XPUs; the command is for nodes with 8
    argv, env = hwdist.launch_command("train.py", kind="xpu", devices="0,5", device_count=8)
    assert "--nproc-per-node=2" in argv and env["ZE_AFFINITY_MASK"] == "0,5"
    argv, _ = hwdist.launch_command("train.py", kind="xpu", device_count=8)
    assert "--nproc-per-node=8" in argv
    argv, _ = hwdist.launch_command("train.py", devices="0,5", device_count=8)  # detected kind, count given
    assert "--nproc-per-node=2" in argv
    with pytest.raises(hwdist.LaunchError, match=r"--device-count 8.*names device 9"):
        hwdist.launch_command("train.py", kind="xpu", devices="0,9", device_count=8)
    with pytest.raises(hwdist.LaunchError, match="exceeds the 8 xpu device"):
        hwdist.launch_command("train.py", kind="xpu", nproc_per_node=9, device_count=8)


def test_explicit_kind_is_not_checked_against_this_machines_count(fake_xpu):
    fake_xpu(count=2)  # --kind may build the command for another machine: syntax only
    argv, env = hwdist.launch_command("train.py", kind="xpu", devices="0,3")
    assert "--nproc-per-node=2" in argv and env["ZE_AFFINITY_MASK"] == "0,3"
    argv, _ = hwdist.launch_command("train.py", kind="xpu", nproc_per_node=4)
    assert "--nproc-per-node=4" in argv
    argv, _ = hwdist.launch_command("train.py", kind="xpu")  # this machine's count is still the default
    assert "--nproc-per-node=2" in argv
    with pytest.raises(hwdist.LaunchError, match=r"item 2 is empty"):
        hwdist.launch_command("train.py", kind="xpu", devices="0,,1")


@pytest.mark.facts("X4")
def test_inherited_selection_is_replaced_so_indices_are_not_counted(fake_xpu, fake_cuda, monkeypatch):
    fake_xpu(count=4)
    monkeypatch.setenv("ZE_AFFINITY_MASK", "2,3")  # this process sees 2 of the 4 XPUs
    argv, env = hwdist.launch_command("train.py")
    assert "--nproc-per-node=2" in argv and env["ZE_AFFINITY_MASK"] == "2,3"
    argv, env = hwdist.launch_command("train.py", devices="0,3")  # replaces the mask in the child
    assert "--nproc-per-node=2" in argv and env["ZE_AFFINITY_MASK"] == "0,3"
    with pytest.raises(hwdist.LaunchError, match="3 levels"):
        hwdist.launch_command("train.py", devices="0.1.2")
    with pytest.raises(hwdist.LaunchError, match="names device 4"):
        hwdist.launch_command("train.py", devices="0,4", device_count=4)
    monkeypatch.delenv("ZE_AFFINITY_MASK")
    fake_cuda(count=2)
    monkeypatch.setenv("HWENV_DEVICE", "cuda")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "6,7")
    argv, env = hwdist.launch_command("train.py", devices="0,5")
    assert "--nproc-per-node=2" in argv and env == {"CUDA_VISIBLE_DEVICES": "0,5"}


def test_without_xpus_here_devices_are_checked_for_syntax_only(clean_device_env, monkeypatch):
    argv, env = hwdist.launch_command("train.py", kind="xpu", devices="0,7")
    assert "--nproc-per-node=2" in argv and env["ZE_AFFINITY_MASK"] == "0,7"
    with pytest.raises(hwdist.LaunchError, match="not a non-negative decimal index"):
        hwdist.launch_command("train.py", kind="xpu", devices="0,x")
    with pytest.raises(hwdist.LaunchError, match=r"--device-count 4.*names device 7"):
        hwdist.launch_command("train.py", kind="xpu", devices="0,7", device_count=4)
    monkeypatch.setenv("HWENV_DEVICE", "xpu")  # detection refuses: a LaunchError, not hwenv's own error
    with pytest.raises(hwdist.LaunchError, match="HWENV_DEVICE='xpu'.*--kind"):
        hwdist.launch_command("train.py", devices="0")


@pytest.mark.parametrize("device_count, kind, pattern", [
    (0, "xpu", "positive integer"), (True, "xpu", "positive integer"), ("8", "xpu", "positive integer"),
    (2, "cpu", "counts hpu, xpu, rocm or cuda devices.*--nproc-per-node.*--kind hpu|xpu|rocm|cuda"),
])
def test_bad_device_count_is_rejected(device_count, kind, pattern):
    with pytest.raises(hwdist.LaunchError, match=pattern):
        hwdist.launch_command("train.py", kind=kind, device_count=device_count)


def test_cli_device_count_for_another_machine(fake_xpu, capsys):
    fake_xpu(count=2)
    assert main(["launch", "--dry-run", "--kind", "xpu", "--device-count", "8", "--devices", "4,7", "train.py"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert "--nproc-per-node=2" in shown["argv"] and shown["env"]["ZE_AFFINITY_MASK"] == "4,7"
    assert main(["launch", "--dry-run", "--kind", "xpu", "--device-count", "4", "--devices", "4,7", "train.py"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hwdist launch: error:") and "--device-count 4" in err and err.count("\n") == 1


def test_multi_node_options_pass_through_unchanged():
    extra = ["--nnodes", "2", "--node-rank", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", "head:29400"]
    argv, _ = hwdist.launch_command("train.py", ["x"], kind="cpu", nproc_per_node=2, torchrun_args=extra)
    assert argv == [*TORCHRUN, "--nproc-per-node=2", *extra, "train.py", "x"]
    with pytest.raises(hwdist.LaunchError, match="repeat --nproc-per-node"):
        hwdist.launch_command("train.py", kind="cpu", torchrun_args=["--nproc_per_node=2"])


def test_bad_kind_and_nproc_are_rejected():
    with pytest.raises(hwdist.LaunchError, match="not an accelerator kind"):
        hwdist.launch_command("train.py", kind="tpu")
    with pytest.raises(hwdist.LaunchError, match="positive integer"):
        hwdist.launch_command("train.py", kind="cpu", nproc_per_node=0)
    with pytest.raises(hwdist.LaunchError, match="needs a script"):
        hwdist.launch_command("", kind="cpu")


def test_dry_run_prints_command_and_env(fake_xpu, capsys):
    fake_xpu(count=4)
    code = main(["launch", "--dry-run", "--devices", "1,3", "--nnodes", "2", "--node_rank", "0",
                 "--rdzv-backend", "c10d", "--rdzv-endpoint", "10.0.0.1:29400", "--max-restarts", "3",
                 "train.py", "--epochs", "1"])
    assert code == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["argv"] == [*TORCHRUN, "--nproc-per-node=2", "--nnodes", "2", "--node-rank", "0",
                             "--rdzv-backend", "c10d", "--rdzv-endpoint", "10.0.0.1:29400", "--max-restarts", "3",
                             "train.py", "--epochs", "1"]
    assert shown["env"] == {"ZE_AFFINITY_MASK": "1,3", "ZE_ENABLE_PCI_ID_DEVICE_ORDER": "1"}
    assert shown["command"].endswith("train.py --epochs 1")


def test_cli_error_is_one_line_exit_2(fake_gaudi, capsys):
    fake_gaudi(8)
    assert main(["launch", "--dry-run", "--devices", "0,3", "train.py"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hwdist launch: error:") and err.count("\n") == 1


def test_module_flag_runs_python_dash_m(capsys):
    assert main(["launch", "--dry-run", "--kind", "cpu", "--nproc-per-node", "2", "-m", "hwdist", "bench"]) == 0
    argv = json.loads(capsys.readouterr().out)["argv"]
    assert argv[-3:] == ["-m", "hwdist", "bench"]


@pytest.mark.facts("G6")
def test_child_environment_drops_conflicting_gaudi_indices_and_the_module_pin(clean_device_env):
    selection = hwenv.select("hpu", "0,1")
    inherited = {"HABANA_VISIBLE_DEVICES": "3", "HLS_MODULE_ID": "3", "PATH": "/bin"}
    env = child_environment({"HABANA_VISIBLE_MODULES": "0,1"}, inherited, selection=selection)
    assert env["HABANA_VISIBLE_MODULES"] == "0,1" and env["PATH"] == "/bin"
    assert "HABANA_VISIBLE_DEVICES" not in env and "HLS_MODULE_ID" not in env
    # without the plan's selection (tools that only have the changes), the module pin still goes
    assert child_environment({}, {"HLS_MODULE_ID": "3", "PATH": "/bin"}) == {"PATH": "/bin"}


# ---- real runs through torchrun ----------------------------------------------------------

def _wait_all(procs: list[subprocess.Popen], deadline: float) -> list[str]:
    end = time.monotonic() + deadline
    outputs = []
    for proc in procs:
        try:
            outputs.append(proc.communicate(timeout=max(end - time.monotonic(), 1))[0])
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            pytest.fail("hwdist launch did not finish in time:\n" + "\n".join(o or "" for o in outputs))
    return outputs


def _results(out: Path, world_size: int, logs: list[str]) -> dict[int, dict]:
    results = {}
    for rank in range(world_size):
        path = out / f"rank{rank}.json"
        assert path.exists(), f"no result from rank {rank}:\n" + "\n".join(logs)
        results[rank] = json.loads(path.read_text())
        assert "crash" not in results[rank], results[rank]["crash"]
    return results


@pytest.mark.facts("X18", "G16")
@pytest.mark.slow
def test_launch_runs_two_processes_end_to_end(tmp_path):
    command = [sys.executable, "-m", "hwdist", "launch", "--kind", "cpu", "--nproc-per-node", "2",
               "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
               str(WORKER), "launch", str(tmp_path), "--flag", "value"]
    proc = subprocess.Popen(command, env=clean_env(HWDIST_TEST_MARK="child-only"), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    logs = _wait_all([proc], 60)
    assert proc.returncode == 0, logs[0]
    results = _results(tmp_path, 2, logs)
    for rank, result in results.items():
        assert result["sum"] == [3.0]
        assert result["objects"] == [[0, 0, 2], [1, 1, 2]]
        assert result["env"]["RANK"] == str(rank) and result["env"]["WORLD_SIZE"] == "2"
        assert result["env"]["HWDIST_TEST_MARK"] == "child-only"
        assert result["argv"] == ["--flag", "value"]


@pytest.mark.slow
def test_two_nodes_on_loopback_with_c10d_rendezvous(tmp_path):
    endpoint = f"127.0.0.1:{free_port()}"
    procs = []
    for node in range(2):
        command = [sys.executable, "-m", "hwdist", "launch", "--kind", "cpu", "--nproc-per-node", "1",
                   "--nnodes", "2", "--node-rank", str(node), "--rdzv-backend", "c10d",
                   "--rdzv-endpoint", endpoint, "--rdzv-id", "hwdist-test", str(WORKER), "launch", str(tmp_path)]
        procs.append(subprocess.Popen(command, env=clean_env(), stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    logs = _wait_all(procs, 80)
    assert [p.returncode for p in procs] == [0, 0], "\n".join(logs)
    results = _results(tmp_path, 2, logs)
    for result in results.values():
        assert result["sum"] == [3.0]  # 1 + 2 across the two nodes
        assert result["objects"] == [[0, 0, 2], [1, 0, 2]]  # one local rank 0 on each node
        assert result["env"]["LOCAL_WORLD_SIZE"] == "1" and result["env"]["WORLD_SIZE"] == "2"

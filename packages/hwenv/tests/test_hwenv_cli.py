"""`hwenv env` and `hwenv exec` (X4, G6): exact variables, docker/json formats, one-line errors."""

import json
import subprocess
import sys

import pytest
from hwenv.cli import main


@pytest.mark.facts("X4", "X5")
def test_env_for_xpu_on_a_machine_without_xpu(clean_device_env, capsys):
    assert main(["env", "--kind", "xpu", "--devices", "0,2"]) == 0
    assert capsys.readouterr().out.splitlines() == ["ZE_AFFINITY_MASK=0,2", "ZE_ENABLE_PCI_ID_DEVICE_ORDER=1"]


@pytest.mark.facts("G6", "G4")
def test_env_docker_format_for_gaudi(clean_device_env, capsys, override_versions):
    override_versions(habana_torch_plugin="1.22.0")  # eager by default, so int64 is written (bridge env_flags.yaml)
    assert main(["env", "--kind", "hpu", "--devices", "5,4,7,6", "--format", "docker"]) == 0
    assert capsys.readouterr().out.strip() == "-e HABANA_VISIBLE_MODULES=5,4,7,6 -e PT_ENABLE_INT64_SUPPORT=1"


def test_env_json(clean_device_env, capsys):
    assert main(["env", "--kind", "cuda", "--devices", "1", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"CUDA_VISIBLE_DEVICES": "1"}


@pytest.mark.parametrize(
    "argv",
    [["env", "--kind", "xpu", "--devices", "0,,2"], ["env", "--kind", "hpu", "--devices", "0,2"],
     ["env", "--kind", "hpu", "--devices", "0,1,2"], ["env", "--devices", "0"]],
)
def test_errors_are_one_line_exit_2(clean_device_env, capsys, argv):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("hwenv env: error:") and err.count("\n") == 1 and "Traceback" not in err


def _run(*args, env=None):
    return subprocess.run([sys.executable, "-m", "hwenv.cli", *args], capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.facts("X4")
def test_exec_sets_selection_for_that_command_only(clean_device_env):
    code = "import os; print(os.environ['ZE_AFFINITY_MASK'], os.environ['ZE_ENABLE_PCI_ID_DEVICE_ORDER'])"
    result = _run("exec", "--kind", "xpu", "--devices", "1,0", "--", sys.executable, "-c", code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "1,0 1"
    import os

    assert "ZE_AFFINITY_MASK" not in os.environ


def test_exec_without_command_is_an_error(clean_device_env):
    result = _run("exec", "--kind", "xpu", "--devices", "0")
    assert result.returncode == 2 and "needs a command" in result.stderr and "Traceback" not in result.stderr


def test_exec_missing_program(clean_device_env):
    result = _run("exec", "--kind", "xpu", "--devices", "0", "--", "definitely-not-a-program-xyz")
    assert result.returncode == 2 and "not found" in result.stderr

"""`hwenv exec|env --devices 3` on Gaudi: a single card is a standard run (INTEL.md S13; issue 23 point 1),
pinned with the variable the bridge reads (issue 41 points 3-4).

Sources: gaudi-pytorch-bridge 1.19 `backend/synapse_helpers/device.cpp` (a process acquires the module named by
`HLS_MODULE_ID`, else any free card), `distributed/hccl/__init__.py` `_setup_module_id` (pins only ranks of a
distributed run); HabanaAI/habana-container-runtime `cmd/habana-container-runtime-hook/container_config.go` and
README (`HABANA_VISIBLE_DEVICES` is read by the OCI hook when a container starts; the bridge never reads it).
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from hwenv.cli import main


def _capture_exec(monkeypatch) -> dict:
    called: dict = {}

    def fake_execvpe(program, argv, environment):
        called.update(program=program, argv=argv, env=environment)
        return None

    monkeypatch.setattr("hwenv.cli.os.execvpe", fake_execvpe)
    return called


def test_exec_one_card_with_kind_hpu(clean_device_env):
    code = "import os; print(os.environ['HABANA_VISIBLE_MODULES'], os.environ.get('HLS_MODULE_ID'))"
    env = {"PATH": "/usr/bin:/bin", "HLS_MODULE_ID": "6", "PT_HPU_LAZY_MODE": "0"}
    result = subprocess.run([sys.executable, "-m", "hwenv.cli", "exec", "--kind", "hpu", "--devices", "3", "--",
                             sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["3", "3"]  # the selection, pinned to it: not the inherited pin 6


def test_exec_one_card_on_a_fake_gaudi(fake_gaudi, monkeypatch):
    fake_gaudi(count=8)
    called = _capture_exec(monkeypatch)
    assert main(["exec", "--devices", "3", "--", "python", "train.py"]) == 0
    assert called["argv"] == ["python", "train.py"]
    assert called["env"]["HABANA_VISIBLE_MODULES"] == "3" and called["env"]["PT_ENABLE_INT64_SUPPORT"] == "1"


def test_exec_one_index_is_pinned_to_its_module_by_hl_smi(fake_gaudi, monkeypatch):
    fake_gaudi(count=8)  # HL_SMI_CSV_8: index 4 is module 1
    called = _capture_exec(monkeypatch)
    assert main(["exec", "--by", "index", "--devices", "4", "--", "python", "train.py"]) == 0
    env = called["env"]
    assert env["HABANA_VISIBLE_DEVICES"] == "4"  # for a container start
    assert env["HABANA_VISIBLE_MODULES"] == "1" and env["HLS_MODULE_ID"] == "1"  # what the bridge reads


def test_exec_refuses_an_index_it_cannot_map_because_the_bridge_never_reads_it(fake_gaudi, monkeypatch, capsys):
    fake_gaudi(count=8, hl_smi=None)
    monkeypatch.setenv("PATH", "/nonexistent")  # no hl-smi at all
    called = _capture_exec(monkeypatch)
    assert main(["exec", "--by", "index", "--devices", "4", "--", "python", "train.py"]) == 2
    err = capsys.readouterr().err
    assert "HABANA_VISIBLE_DEVICES=4 is read only by the habana container runtime when a container starts" in err
    assert "the Gaudi bridge never reads it" in err and "--devices M" in err and "--format docker" in err
    assert called == {}  # nothing ran


def test_env_for_a_container_start_keeps_the_index_and_says_what_it_does(clean_device_env, monkeypatch, capsys):
    monkeypatch.setenv("PATH", "/nonexistent")
    assert main(["env", "--kind", "hpu", "--by", "index", "--devices", "4", "--format", "docker"]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("-e HABANA_VISIBLE_DEVICES=4")  # what `docker run --runtime=habana` reads
    assert "read only by the habana container runtime" in captured.err


@pytest.mark.parametrize(("lazy", "int64"), [("0", True), ("1", False)])
def test_env_writes_int64_only_for_eager_mode(clean_device_env, monkeypatch, capsys, lazy, int64):
    monkeypatch.setenv("PT_HPU_LAZY_MODE", lazy)
    assert main(["env", "--kind", "hpu", "--devices", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:2] == ["HABANA_VISIBLE_MODULES=3", "HLS_MODULE_ID=3"]
    assert ("PT_ENABLE_INT64_SUPPORT=1" in lines) is int64


def test_env_refuses_a_three_card_group_naming_the_supported_ones(clean_device_env, capsys):
    assert main(["env", "--kind", "hpu", "--devices", "0,1,2"]) == 2
    err = capsys.readouterr().err
    assert "distributed run" in err and "{0,1} or {2,3}" in err

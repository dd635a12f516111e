"""`hwenv exec|env --devices 3` on Gaudi: a single card is a standard run (INTEL.md S13; issue 23 point 1)."""

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
    assert result.stdout.split() == ["3", "None"]  # the selection, and no inherited pin


def test_exec_one_card_on_a_fake_gaudi(fake_gaudi, monkeypatch):
    fake_gaudi(count=8)
    called = _capture_exec(monkeypatch)
    assert main(["exec", "--devices", "3", "--", "python", "train.py"]) == 0
    assert called["argv"] == ["python", "train.py"]
    assert called["env"]["HABANA_VISIBLE_MODULES"] == "3" and called["env"]["PT_ENABLE_INT64_SUPPORT"] == "1"


def test_exec_one_index_on_a_fake_gaudi(fake_gaudi, monkeypatch):
    fake_gaudi(count=8, hl_smi=None)  # no hl-smi needed for one card
    called = _capture_exec(monkeypatch)
    assert main(["exec", "--by", "index", "--devices", "4", "--", "python", "train.py"]) == 0
    assert called["env"]["HABANA_VISIBLE_DEVICES"] == "4" and "HABANA_VISIBLE_MODULES" not in called["env"]


@pytest.mark.parametrize(("lazy", "int64"), [("0", True), ("1", False)])
def test_env_writes_int64_only_for_eager_mode(clean_device_env, monkeypatch, capsys, lazy, int64):
    monkeypatch.setenv("PT_HPU_LAZY_MODE", lazy)
    assert main(["env", "--kind", "hpu", "--devices", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "HABANA_VISIBLE_MODULES=3"
    assert ("PT_ENABLE_INT64_SUPPORT=1" in lines) is int64


def test_env_refuses_a_three_card_group_naming_the_supported_ones(clean_device_env, capsys):
    assert main(["env", "--kind", "hpu", "--devices", "0,1,2"]) == 2
    err = capsys.readouterr().err
    assert "distributed run" in err and "{0,1} or {2,3}" in err

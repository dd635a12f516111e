"""The plan's quantization refusals word what to do: a library that is not installed names the hwrun extra that
installs it (the import check made to fail here), and "pick a method that quantizes on load" lists the methods that
run on that device only (issue 43.1; no hqq, which no device runs, and no float8 on the CPU)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import tomllib
from pathlib import Path

import hwenv
import hwrun
import pytest
from hwrun.errors import HwrunError, QuantizationError
from hwrun.model import quantization_table as qt
from hwrun.model.quantization import on_load_methods
from hwrun.testing import build_tiny_model

GiB = 2**30
PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny-quant-refusals")))


@pytest.fixture
def missing(monkeypatch):
    """Make `importlib.util.find_spec` answer None for the packages named (as when they are not installed)."""
    real = importlib.util.find_spec
    gone: set[str] = set()

    def find_spec(name, *args, **kwargs):
        return None if name.split(".")[0] in gone else real(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    return gone


def _pre_quantized(tiny: str, folder: Path, quantization_config: dict) -> str:
    shutil.copytree(tiny, folder)
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = quantization_config
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


@pytest.mark.parametrize("method, package, extra", [("int8-weight-only", "torchao", "torchao"),
                                                    ("int4-weight-only", "torchao", "torchao")])
def test_a_missing_torchao_is_refused_naming_the_extra(tiny, missing, method, package, extra):
    missing.add(package)
    with pytest.raises(QuantizationError) as refused:
        hwrun.plan(tiny, device="cpu", quantization=method)
    message = str(refused.value)
    assert f"quantization={method!r} needs torchao, which is not installed" in message
    assert f"`pip install 'hwrun[{extra}]'`" in message
    assert isinstance(refused.value, HwrunError)  # hwrun.errors' base class: the CLI prints it, no traceback


def test_a_missing_bitsandbytes_is_refused_naming_the_quant_extra(tiny, missing):
    missing.add("bitsandbytes")
    with pytest.raises(QuantizationError, match=r"needs bitsandbytes, which is not installed; install it with "
                                                r"`pip install 'hwrun\[quant\]'`"):
        hwrun.plan(tiny, device="cpu", quantization="4bit")


@pytest.mark.parametrize("quant_method, package, extra", [
    ("compressed-tensors", "compressed_tensors", "compressed-tensors"),
    ("gptq", "gptqmodel", "gptq"),
    ("awq", "gptqmodel", "gptq"),
    ("auto-round", "auto_round", "autoround"),
])
def test_a_pre_quantized_checkpoint_whose_library_is_missing_names_the_extra(tiny, tmp_path, missing, quant_method,
                                                                           package, extra):
    missing.add(package)
    folder = _pre_quantized(tiny, tmp_path / quant_method, {"quant_method": quant_method, "bits": 4})
    with pytest.raises(QuantizationError, match=rf"needs .*, which is not installed; install it with `pip install "
                                                rf"'hwrun\[{extra}\]'`"):
        hwrun.plan(folder, device="cpu")


def test_every_extra_the_refusals_name_is_an_extra_of_hwrun():
    extras = set(tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"])
    assert {m.extra for m in qt.METHODS.values() if m.extra} <= extras


def test_the_on_load_list_follows_the_device(tiny):
    assert on_load_methods("cpu") == ("int4-weight-only", "int8-weight-only", "int8-dynamic", "bnb-4bit", "bnb-8bit")
    assert "float8" in on_load_methods("cuda") and "hqq" not in on_load_methods("cuda")
    assert on_load_methods("hpu") == ("bnb-4bit", "bnb-8bit", "fp8-inc")  # fp8-inc: INC converts after load
    assert on_load_methods("mps") == ()
    with pytest.raises(QuantizationError) as refused:
        hwrun.plan(tiny, device="cpu", quantization="gptq")
    message = str(refused.value)
    assert "pick a method that quantizes on load on cpu (int4-weight-only, int8-weight-only, int8-dynamic, " \
           "bnb-4bit, bnb-8bit)." in message
    assert "hqq" not in message and "float8" not in message
    h100 = hwenv.Accelerator("cuda", 1, names=("H100",), memory=(80 * GiB,), capability=(9, 0))
    with pytest.raises(QuantizationError, match=r"quantizes on load on cuda \(.*float8.*\)"):
        hwrun.plan(tiny, device=h100, quantization="awq")


def test_the_readme_table_labels_methods_no_device_runs_as_not_in_hwrun_yet():
    table = qt.markdown()
    assert "| `hqq` (not in hwrun yet) |" in table and "| `fp8-inc` (on load) |" in table
    assert "| `int8-weight-only` (on load) |" in table and "| `awq` (pre-quantized) |" in table


def test_the_quantize_help_names_every_method():
    from hwrun.cli.main import build_parser

    parser = build_parser()
    plan = next(a for a in parser._subparsers._group_actions[0].choices["plan"]._actions if "--quantize" in
                a.option_strings)
    assert all(name in plan.help for name in qt.METHODS), plan.help

"""fp8-inc (issue 43): FP8 on Gaudi through Intel Neural Compressor, from an already-measured QUANTIZE config.

On the CPU with hwenv.testing's Gaudi fake and hwrun.testing's fake INC (`fake_inc`: records calls, converts nothing),
whose signatures the drift tests hold to the installed neural-compressor-pt (the `inc` extra; the dev install leaves it out, see
the skip reason).
What is real here: hwrun's plan, its checks of the config and of INC's measurement file name, the load, the call
to convert, and the decode/serving decisions; what is faked: the Gaudi and INC's FP8 patching (none happens)."""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import json
from pathlib import Path

import hwenv
import hwrun
import pytest
from hwenv.testing import fake_gaudi
from hwrun.errors import QuantizationError
from hwrun.model import quantization_table as qt
from hwrun.model.quantization import INC_MARK, inc_measure_file
from hwrun.testing import build_tiny_model
from hwrun.testing.inc import fake_inc

GiB = 2**30
GAUDI2 = hwenv.Accelerator("hpu", 1, names=("GAUDI2",), memory=(96 * GiB,))
PROMPTS = ["The king said", "Once upon a time"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny-inc")))


@pytest.fixture
def measured(tmp_path, monkeypatch):
    """A QUANTIZE config whose measurement file exists (an empty stand-in .npz at INC's name for it)."""
    monkeypatch.delenv("QUANT_CONFIG", raising=False)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    dump = tmp_path / "hqt_output" / "measure"
    dump.parent.mkdir()
    (tmp_path / "hqt_output" / "measure_hooks_maxabs.npz").write_bytes(b"")
    path = tmp_path / "maxabs_quant.json"
    path.write_text(json.dumps({"mode": "QUANTIZE", "observer": "maxabs", "scale_method": "maxabs_hw",
                                "allowlist": {"types": [], "names": []}, "blocklist": {"types": [], "names": []},
                                "dump_stats_path": str(dump)}))
    return path


@pytest.fixture
def no_load(monkeypatch):
    """Record any model load (none may happen for a refused plan)."""
    loads = []
    monkeypatch.setattr("hwrun.model.load.load", lambda *a, **k: loads.append(a) or (_ for _ in ()).throw(
        AssertionError("loaded")))
    from transformers import AutoModelForCausalLM

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained",
                        classmethod(lambda cls, *a, **k: loads.append(a) or (_ for _ in ()).throw(
                            AssertionError("loaded"))))
    return loads


def _refused(tiny, device=GAUDI2, **kwargs) -> str:
    with fake_gaudi(1), fake_inc(), pytest.raises(QuantizationError) as refused:
        hwrun.plan(tiny, device=device, quantization="fp8-inc", **kwargs)
    return str(refused.value)


def test_gaudi2_with_inc_and_a_measured_config_plans_fp8_inc_with_reasons(tiny, measured):
    with fake_gaudi(1), fake_inc() as calls:
        plan = hwrun.plan(tiny, device=GAUDI2, quantization="fp8-inc", inc_config=measured)
    assert plan.quantization == "fp8-inc" and plan.inc_config == str(measured)
    reason = plan.reasons["quantization"]
    assert "fp8-inc via neural-compressor" in reason and "hpu runs it" in reason
    assert f"INC config {str(measured)!r} (given (inc_config / --inc-config)): mode QUANTIZE" in reason
    assert "measure_hooks_maxabs.npz" in reason and "convert(model, FP8Config.from_json_file(path))" in reason
    assert plan.to_dict()["inc_config"] == str(measured)
    assert calls.calls == []  # planning imports nothing of INC
    # the load needs the unquantized size: INC converts after the bf16 load
    plain = hwrun.plan(tiny, device=GAUDI2)
    assert plan.weight_bytes == plain.weight_bytes


def test_the_config_path_falls_back_to_quant_config_as_inc_reads_it(tiny, measured, monkeypatch):
    monkeypatch.setenv("QUANT_CONFIG", str(measured))
    with fake_gaudi(1), fake_inc():
        plan = hwrun.plan(tiny, device=GAUDI2, quantization="fp8-inc")
    assert plan.inc_config == str(measured) and "(from $QUANT_CONFIG)" in plan.reasons["quantization"]


def test_not_on_hpu_is_refused_before_load(tiny, measured, no_load):
    message = _refused(tiny, device="cpu", inc_config=measured)
    assert "quantization='fp8-inc' (neural-compressor) on CPU (cpu)" in message
    assert "QDQ simulation" in message and "hwrun runs it on: hpu" in message
    gaudi1 = hwenv.Accelerator("hpu", 1, names=("GAUDI",), memory=(32 * GiB,))
    assert "Gaudi 2 and Gaudi 3 only" in _refused(tiny, device=gaudi1, inc_config=measured)
    assert no_load == []


def test_a_missing_neural_compressor_names_the_extra(tiny, measured, monkeypatch, no_load):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a, **k: None if name.split(".")[0] == "neural_compressor" else real(name, *a, **k))
    message = _refused(tiny, inc_config=measured)
    assert "quantization='fp8-inc' needs neural-compressor, which is not installed" in message
    assert "`pip install 'hwrun[inc]'`" in message
    assert no_load == []


def test_every_config_refusal_names_the_value_and_what_to_do(tiny, measured, tmp_path, no_load):
    assert "pass inc_config=PATH (--inc-config PATH) or set QUANT_CONFIG=PATH" in _refused(tiny)
    gone = tmp_path / "nowhere.json"
    assert f"the INC config {str(gone)!r}" in _refused(tiny, inc_config=gone) and "cannot be read" in _refused(
        tiny, inc_config=gone)
    bad = tmp_path / "bad.json"
    bad.write_text("{mode: QUANTIZE")
    assert "is not JSON" in _refused(tiny, inc_config=bad)
    listed = tmp_path / "list.json"
    listed.write_text("[]")
    assert "holds a JSON list" in _refused(tiny, inc_config=listed)
    config = json.loads(measured.read_text())
    for mode in ("MEASURE", "AUTO"):
        other = tmp_path / f"{mode}.json"
        other.write_text(json.dumps({**config, "mode": mode}))
        message = _refused(tiny, inc_config=other)
        assert f'has "mode": {mode!r}' in message and '"mode": "QUANTIZE"' in message
        assert "prepare(model, FP8Config.from_json_file(PATH))" in message and "finalize_calibration(model)" in message
    unmeasured = tmp_path / "unmeasured.json"
    unmeasured.write_text(json.dumps({**config, "dump_stats_path": str(tmp_path / "empty" / "measure")}))
    message = _refused(tiny, inc_config=unmeasured)
    assert f"{str(tmp_path / 'empty' / 'measure')}_hooks_maxabs.npz" in message and "does not exist" in message
    assert "run INC's measurement first" in message
    with fake_gaudi(1), fake_inc(), pytest.raises(QuantizationError, match="with quantization='fp8-inc' only"):
        hwrun.plan(tiny, device=GAUDI2, quantization="bnb-4bit", inc_config=measured)
    assert no_load == []


def test_the_cli_refuses_before_load_and_passes_inc_config(tiny, measured, tmp_path, no_load, capsys):
    from hwrun.cli.main import main

    unmeasured = tmp_path / "m.json"
    unmeasured.write_text(json.dumps({**json.loads(measured.read_text()), "mode": "MEASURE"}))
    with fake_gaudi(1, name="GAUDI2"), fake_inc():
        code = main(["generate", "hi", "--model", tiny, "--device", "hpu", "--quantize", "fp8-inc", "--inc-config",
                     str(unmeasured), "--max-new-tokens", "2"])
        assert code != 0 and "\"mode\": 'MEASURE'" in capsys.readouterr().err
        assert main(["plan", tiny, "--device", "hpu", "--quantize", "fp8-inc", "--inc-config", str(measured),
                     "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["inc_config"] == str(measured)
    assert no_load == []


def test_the_load_converts_once_with_the_config_and_the_loops_run_it_eagerly(tiny, measured, caplog):
    from hwrun.inference.decision import decide_serving, planned

    with fake_gaudi(1, lazy_mode="1") as gaudi, fake_inc() as calls:
        plan = hwrun.plan(tiny, device=GAUDI2, quantization="fp8-inc", inc_config=measured)
        # the fake Gaudi allocates nothing: the model loads on the CPU (no device map, no Gaudi variables) under the
        # Gaudi plan otherwise, so load() runs its own path to after_load and INC's convert; decisions stay HPU's
        on_host = dataclasses.replace(plan, device="cpu", device_map=None, env={})
        with caplog.at_level("INFO", logger="hwrun.model.quantization"):
            model, tokenizer = hwrun.load(on_host)
        assert [name for name, _ in calls.calls] == ["from_json_file", "convert"]
        (converted, config), = calls.named("convert")
        assert converted is model and calls.named("from_json_file") == [(str(measured),)]
        assert config.mode == "QUANTIZE" and config.dump_stats_path == json.loads(measured.read_text())[
            "dump_stats_path"]
        assert getattr(model, INC_MARK) == "fp8-inc" and model.is_quantized is True
        assert "converted the model to FP8 with Intel Neural Compressor" in caplog.text
        # hwrun's loops: the model's own forward, eagerly (EAGER_METHODS), never graphs/compile/the fused step
        # (Gaudi in lazy mode: decode="auto" leaves a run to Transformers' loop; decode="graphs" asks for hwrun's)
        before = planned(plan, 2, decode="graphs", batching="continuous")
        assert (before.step, before.use_graphs, before.compile_backend) == ("model", False, None)
        assert "fp8-inc weights run the model's own forward, eagerly" in before.step_reason
        serving = decide_serving(plan, model)
        # asked of the loaded model: its INC mark (no Transformers quantizer loaded it)
        assert (serving.runner, serving.step, serving.use_graphs) == ("engine", "model", False)
        assert "eager steps (fp8-inc weights run the model's own forward" in serving.reason
        result = hwrun.generate(plan, PROMPTS, 6, model=model, tokenizer=tokenizer, decode="graphs",
                                batching="continuous")
        assert (result.batching, result.decode) == ("continuous", "graphs")
        assert "no graph is captured: eager steps (fp8-inc" in result.decode_reason
        assert "capture_begin" not in gaudi.graph_events
    assert [name for name, _ in calls.calls].count("convert") == 1  # generate did not convert again
    plain_plan = hwrun.plan(tiny, device="cpu")
    plain, _ = hwrun.load(plain_plan)
    reference = hwrun.generate(plain_plan, PROMPTS, 6, model=plain, tokenizer=tokenizer, batching="static")
    assert result.token_ids == reference.token_ids  # the fake converts nothing: the same tokens


def test_the_table_row_and_the_readme_say_hpu_yes():
    assert qt.cell("hpu", "fp8-inc").runs and not qt.cell("cpu", "fp8-inc").runs
    assert "fp8-inc" in qt.EAGER_METHODS and qt.METHODS["fp8-inc"].extra == "inc"
    assert "| `fp8-inc` (on load) | neural-compressor | no | no | no | yes | no | no | no |" in qt.markdown()
    assert {"inc-api", "inc-files", "inc-fp8"} <= set(qt.SOURCES)
    pyproject = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    assert 'inc = [\n    "neural-compressor-pt>=3.10",\n]' in pyproject


# ---- drift: the fake and hwrun's file-name rule against the installed neural-compressor-pt --------------------


def _real_quantization():
    import sys

    from hwrun.testing.inc import MODULES

    assert not any(getattr(sys.modules.get(m), "HWRUN_FAKE", False) for m in MODULES), "a fake INC is installed"
    return pytest.importorskip("neural_compressor.torch.quantization",
                               reason="neural-compressor-pt not installed (pip install 'hwrun[inc]'): the dev install leaves "
                                      "it out because PEFT imports INC's FP8 modules whenever it builds LoRA layers and "
                                      "INC then logs to stderr (hwrun train --lora's one-line errors got 3 more lines)")


def _inner(function, name):
    """The function `name` inside INC's `log_process` wrapper (which has no functools.wraps), or `function`."""
    for cell in function.__closure__ or ():
        if inspect.isfunction(cell.cell_contents) and cell.cell_contents.__name__ == name:
            return cell.cell_contents
    return function


def test_the_fake_has_the_real_signatures():
    real = _real_quantization()
    with fake_inc():
        import neural_compressor.torch.quantization as fake

        for name in ("prepare", "convert", "finalize_calibration"):
            real_sig, fake_sig = inspect.signature(_inner(getattr(real, name), name)), inspect.signature(getattr(fake, name))
            assert list(real_sig.parameters) == list(fake_sig.parameters), name
            assert [p.default for p in real_sig.parameters.values()] == [
                p.default for p in fake_sig.parameters.values()], name
        assert (inspect.signature(real.FP8Config.from_json_file).parameters.keys()
                == inspect.signature(fake.FP8Config.from_json_file).parameters.keys() == {"filename"})
        real_init = inspect.signature(real.FP8Config.__init__).parameters
        fake_init = inspect.signature(fake.FP8Config.__init__).parameters
        assert list(real_init) == list(fake_init)
        assert [p.default for p in real_init.values()] == [p.default for p in fake_init.values()]


def test_the_real_from_json_file_reads_a_quantize_config(measured):
    real = _real_quantization()
    config = real.FP8Config.from_json_file(str(measured))
    assert config.mode == "QUANTIZE" and config.observer == "maxabs"
    assert config.dump_stats_path == json.loads(measured.read_text())["dump_stats_path"]


@pytest.mark.parametrize("extra, rank", [({}, None), ({"scale_method": "unit_scale"}, None),
                                         ({"dynamic_quantization": True, "scale_method": "maxabs_hw"}, None),
                                         ({}, ("1", "2")), ({}, ("0", None)),
                                         ({"seperate_measure_files": False}, ("1", "2"))])
def test_hwruns_measurement_file_is_the_one_incs_quantize_step_reads(tmp_path, monkeypatch, extra, rank):
    """INC's own parser (`Fp8cfg.parse`) names the file QUANTIZE reads (measure_file + '.npz', when use_stats_files);
    hwrun's `inc_measure_file` must name the same one. On the CPU INC parses only QDQ configs (use_qdq)."""
    _real_quantization()
    from neural_compressor.torch.algorithms.fp8_quant._quant_common.quant_config import Fp8cfg
    from neural_compressor.torch.algorithms.fp8_quant.prepare_quant import prepare_model

    config = {"mode": "QUANTIZE", "observer": "maxabs", "dump_stats_path": str(tmp_path / "out" / "measure"),
              "use_qdq": True, **extra}
    if extra.get("dynamic_quantization"):
        config["use_qdq"] = False  # INC refuses dynamic with QDQ; on the CPU it refuses dynamic at all
        assert inc_measure_file(config, {}) is None
        return
    env = {} if rank is None else {"LOCAL_RANK": rank[0], **({"WORLD_SIZE": rank[1]} if rank[1] else {})}
    # INC reads the rank once (torch.distributed, else LOCAL_RANK / WORLD_SIZE) into module globals: set them alike
    monkeypatch.setattr(prepare_model, "_local_rank", int(rank[0]) if rank else -1)
    monkeypatch.setattr(prepare_model, "_local_rank_initialized", True)
    monkeypatch.setattr(prepare_model, "_world_size", int(rank[1]) if rank and rank[1] else -1)
    monkeypatch.setattr(prepare_model, "_world_size_initialized", True)
    parsed = Fp8cfg.parse(dict(config)).cfg
    want = parsed["measure_file"] + ".npz" if parsed["use_stats_files"] else None
    assert inc_measure_file(config, env) == want

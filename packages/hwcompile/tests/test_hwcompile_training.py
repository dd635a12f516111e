"""training_arguments: the keywords, checked against the real transformers.TrainingArguments (G2, G14)."""

from __future__ import annotations

import hwcompile
import hwenv
import pytest

GAUDI = hwenv.Accelerator("hpu", 8)


def _arguments(tmp_path, **keywords):
    from transformers import TrainingArguments

    return TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], **keywords)


@pytest.mark.facts("G14")
def test_gaudi_keywords_are_accepted_and_give_hpu_backend(tmp_path, monkeypatch):
    monkeypatch.delenv("PT_HPU_LAZY_MODE", raising=False)  # the fake bridge's own default (a test may leave it set)
    keywords = hwcompile.training_arguments(GAUDI)
    assert keywords == {"torch_compile": True, "torch_compile_backend": "hpu_backend"}
    arguments = _arguments(tmp_path, **keywords)
    assert arguments.torch_compile is True and arguments.torch_compile_backend == "hpu_backend"


@pytest.mark.facts("G12", "G14")
def test_on_the_fake_gaudi_transformers_agrees(tmp_path, dynamo_gaudi):
    from accelerate.state import AcceleratorState, PartialState
    from transformers import TrainingArguments

    dynamo_gaudi(8)
    try:
        by_itself = TrainingArguments(output_dir=str(tmp_path), torch_compile=True, report_to=[])
        ours = TrainingArguments(output_dir=str(tmp_path), report_to=[], **hwcompile.training_arguments(None))
        assert by_itself.device.type == "hpu"  # TrainingArguments saw the (fake) Gaudi (G12)
        assert by_itself.torch_compile_backend == ours.torch_compile_backend == "hpu_backend"  # G14
        assert ours.torch_compile is True
    finally:
        AcceleratorState._reset_state(True)
        PartialState._reset_state()


@pytest.mark.parametrize("kind", ["cpu", "cuda", "xpu"])
def test_elsewhere_the_default_backend(tmp_path, kind):
    keywords = hwcompile.training_arguments(hwenv.Accelerator(kind))
    assert keywords == {"torch_compile": True, "torch_compile_backend": "inductor"}
    arguments = _arguments(tmp_path, **keywords)
    assert arguments.torch_compile is True and arguments.torch_compile_backend == "inductor"
    default = _arguments(tmp_path, torch_compile=True)  # what transformers picks by itself off Gaudi
    assert default.torch_compile_backend == keywords["torch_compile_backend"]


def test_requested_backend_and_mode(tmp_path, caplog):
    keywords = hwcompile.training_arguments("cuda", backend="aot_eager", mode="reduce-overhead")
    assert keywords == {"torch_compile": True, "torch_compile_backend": "aot_eager",
                        "torch_compile_mode": "reduce-overhead"}
    arguments = _arguments(tmp_path, **keywords)
    assert (arguments.torch_compile_backend, arguments.torch_compile_mode) == ("aot_eager", "reduce-overhead")
    gaudi = hwcompile.training_arguments(GAUDI, backend="inductor", mode="reduce-overhead")
    assert gaudi == {"torch_compile": True, "torch_compile_backend": "hpu_backend"}
    assert "torch_compile_mode='reduce-overhead'" in caplog.text


@pytest.mark.facts("G2")
def test_no_compile_means_eager(tmp_path):
    keywords = hwcompile.training_arguments(GAUDI, compile=False)
    assert keywords == {"torch_compile": False}
    arguments = _arguments(tmp_path, **keywords)
    assert arguments.torch_compile is False and arguments.torch_compile_backend is None


@pytest.mark.facts("G2")
def test_lazy_mode_is_refused_for_gaudi_training(monkeypatch):
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "1")
    with pytest.raises(hwcompile.LazyModeError, match="PT_HPU_LAZY_MODE=0"):
        hwcompile.training_arguments(GAUDI)
    assert hwcompile.training_arguments(GAUDI, compile=False) == {"torch_compile": False}
    assert hwcompile.training_arguments("cuda")["torch_compile_backend"] == "inductor"


def test_callable_backend_is_refused_for_training_arguments():
    with pytest.raises(hwcompile.CompileArgumentError, match="takes a backend name"):
        hwcompile.training_arguments("cuda", backend=lambda gm, inputs: gm.forward)

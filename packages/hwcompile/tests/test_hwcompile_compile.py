"""hwcompile.compile: routed to hpu_backend on a (fake) Gaudi, the requested backend elsewhere (G2, G13)."""

from __future__ import annotations

import logging

import hwcompile
import hwenv
import pytest
import torch
from hwcompile.testing import routing_warnings, tiny_llama
from hwenv.gaudi import PLUGIN_INSTALL_HINT

GAUDI = hwenv.Accelerator("hpu", 8)


def _f(x):
    return torch.sin(x) * 2 + x


@pytest.fixture
def spy_backend(monkeypatch):
    """Wrap a registered backend (by name) in a spy that counts graphs and calls the real one."""
    from torch._dynamo.backends import registry

    def install(name):
        real = registry.lookup_backend(name)
        calls = []

        def spy(gm, example_inputs, **kwargs):
            calls.append(gm)
            return real(gm, example_inputs, **kwargs)

        monkeypatch.setitem(registry._COMPILER_FNS, name, spy)
        return calls

    yield install
    torch._dynamo.reset()


@pytest.mark.facts("G13")
def test_tiny_llama_compiled_with_inductor_reaches_hpu_backend_on_gaudi(gaudi, caplog):
    caplog.set_level(logging.WARNING)
    model = tiny_llama()
    ids = torch.randint(0, 256, (2, 8))
    with torch.no_grad():
        expected = model(ids).logits
        compiled = hwcompile.compile(model, backend="inductor", accel=GAUDI)
        got = compiled(ids).logits
        again = compiled(ids).logits
    assert gaudi.graphs, "the stand-in hpu_backend received no graph"
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(again, expected)
    [record] = routing_warnings(caplog.records)
    assert "'inductor'" in record.getMessage()


@pytest.mark.facts("G13")
def test_compile_detects_the_fake_gaudi_by_itself(gaudi, caplog):
    caplog.set_level(logging.WARNING)
    compiled = hwcompile.compile(_f)  # accel=None: hwenv.detect() finds the fake Gaudi
    x = torch.randn(4)
    torch.testing.assert_close(compiled(x), _f(x))
    assert len(gaudi.graphs) == 1 and len(routing_warnings(caplog.records)) == 1


@pytest.mark.facts("G13")
def test_eager_stays_eager_on_gaudi(gaudi, caplog, spy_backend):
    caplog.set_level(logging.WARNING)
    eager_graphs = spy_backend("eager")
    x = torch.randn(4)
    torch.testing.assert_close(hwcompile.compile(_f, "eager", accel=GAUDI)(x), _f(x))
    assert len(eager_graphs) == 1 and gaudi.graphs == []
    assert routing_warnings(caplog.records) == []


def test_gaudi_drops_mode_and_inductor_options_naming_them(gaudi, caplog):
    caplog.set_level(logging.WARNING)
    x = torch.randn(4)
    hwcompile.compile(_f, "inductor", accel=GAUDI, mode="reduce-overhead", fullgraph=True)(x)
    hwcompile.compile(lambda t: t * 3, accel=GAUDI,
                      options={"triton.cudagraphs": True, "keep_input_mutations": True})(x)
    assert gaudi.calls[0] == {}  # mode never reaches hpu_backend
    assert gaudi.calls[1] == {"options": {"keep_input_mutations": True}}
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "mode='reduce-overhead'" in text and "options['triton.cudagraphs']" in text
    assert "options['keep_input_mutations']" not in text


@pytest.mark.facts("G2")
def test_lazy_mode_is_an_error_that_says_to_run_eager(fake_gaudi, hpu_backend):
    fake_gaudi(8, lazy_mode="1")
    with pytest.raises(hwcompile.LazyModeError) as error:
        hwcompile.compile(_f, "inductor", accel=GAUDI)
    assert "PT_HPU_LAZY_MODE=0" in str(error.value) and isinstance(error.value, RuntimeError)
    assert hpu_backend.graphs == []


@pytest.mark.facts("G2")
@pytest.mark.parametrize("mode", ["0", None])
def test_eager_mode_or_unset_compiles(dynamo_gaudi, hpu_backend, mode):
    dynamo_gaudi(8, lazy_mode=mode)
    x = torch.randn(3)
    torch.testing.assert_close(hwcompile.compile(_f, accel=GAUDI)(x), _f(x))
    assert len(hpu_backend.graphs) == 1


def test_missing_gaudi_plugin_says_what_to_install(fake_gaudi):
    fake_gaudi(8)  # fake habana_frameworks without the dynamo backend, and no stand-in registered
    assert not hwcompile.hpu_backend_registered()
    with pytest.raises(hwcompile.HpuBackendMissingError) as error:
        hwcompile.compile(_f, accel=GAUDI)
    assert isinstance(error.value, ImportError)
    assert PLUGIN_INSTALL_HINT in str(error.value) and "hpu_backend" in str(error.value)


def test_on_cpu_the_requested_backend_really_runs_not_the_stand_in(hpu_backend, spy_backend, caplog):
    caplog.set_level(logging.WARNING)
    aot_graphs = spy_backend("aot_eager")
    x = torch.randn(5)
    compiled = hwcompile.compile(_f, "aot_eager", accel=hwenv.Accelerator("cpu"))
    torch.testing.assert_close(compiled(x), _f(x))
    assert len(aot_graphs) == 1 and hpu_backend.graphs == []
    assert routing_warnings(caplog.records) == []


@pytest.mark.slow
def test_on_cpu_the_default_backend_is_inductor(hpu_backend, monkeypatch, clean_device_env):
    import torch._inductor.compile_fx as compile_fx

    real, calls = compile_fx.compile_fx, []

    def spy(*args, **kwargs):
        calls.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(compile_fx, "compile_fx", spy)
    x = torch.randn(8)
    compiled = hwcompile.compile(_f)  # this machine: cpu, default backend
    torch.testing.assert_close(compiled(x), _f(x))
    assert len(calls) == 1 and hpu_backend.graphs == []
    torch._dynamo.reset()


def test_result_is_what_torch_compile_returns_no_extra_wrapper():
    ours = hwcompile.compile(_f, "eager", accel="cpu")
    plain = torch.compile(_f, backend="eager")
    assert type(ours) is type(plain)
    model = torch.nn.Linear(2, 2)
    assert type(hwcompile.compile(model, "eager", accel="cpu")) is type(torch.compile(model, backend="eager"))


def test_decorator_form(gaudi):
    @hwcompile.compile(backend="inductor", accel=GAUDI, fullgraph=True)
    def g(x):
        return x.cos() + 1

    x = torch.randn(3)
    torch.testing.assert_close(g(x), x.cos() + 1)
    assert len(gaudi.graphs) == 1


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"mode": "reduce-overhead", "options": {"max_autotune": True}}, "either mode or options"),
    ({"fullgrph": True}, "takes no keyword 'fullgrph'"),
    ({"options": ["max_autotune"]}, "must be a dict"),
])
def test_bad_arguments_are_rejected_before_compiling(hpu_backend, kwargs, match):
    with pytest.raises(hwcompile.CompileArgumentError, match=match):
        hwcompile.compile(_f, accel=GAUDI, **kwargs)
    assert hpu_backend.graphs == []


def test_bad_backend_type_is_rejected():
    with pytest.raises(hwcompile.CompileArgumentError, match="not a torch.compile backend"):
        hwcompile.compile(_f, 12, accel="cpu")


@pytest.mark.facts("G2")
def test_compile_and_hwenv_doctor_agree_on_the_mode(fake_gaudi):
    fake_gaudi(8, lazy_mode="1")
    report = hwenv.diagnose()
    assert "lazy-mode-blocks-compile" in [problem.code for problem in report.problems]
    assert hwcompile.lazy_mode()
    with pytest.raises(hwcompile.LazyModeError):
        hwcompile.check_eager_mode()
    assert not hwcompile.lazy_mode({"PT_HPU_LAZY_MODE": "0"}) and not hwcompile.lazy_mode({})


@pytest.mark.facts("G13")
def test_eager_on_gaudi_needs_no_hpu_backend(dynamo_gaudi, caplog):
    dynamo_gaudi(8)  # no stand-in registered: eager must not ask for the plugin
    caplog.set_level(logging.WARNING)
    x = torch.randn(3)
    torch.testing.assert_close(hwcompile.compile(_f, "eager", accel=GAUDI)(x), _f(x))
    assert routing_warnings(caplog.records) == []


def test_hpu_backend_options_are_the_bridge_1_19_config_keys():
    """gaudi-pytorch-bridge 1.19.0 (5a56187), compile_backend/config.py: 18 settings, no `verbose`."""
    from hwcompile.gaudi import HPU_BACKEND_OPTIONS

    assert len(HPU_BACKEND_OPTIONS) == 18 and "verbose" not in HPU_BACKEND_OPTIONS
    assert {"use_inplace_index_copy", "enable_sfg", "use_cpp_partitioner", "force_static_compile",
            "use_boxed_input", "reassign_copy_"} <= HPU_BACKEND_OPTIONS

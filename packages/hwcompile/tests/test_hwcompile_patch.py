"""patch_torch_compile: reach, idempotence, undo, thread safety (G13); beside Transformers: test_hwcompile_transformers."""

from __future__ import annotations

import importlib.util
import logging
import sys
import textwrap
import threading

import hwcompile
import hwenv
import pytest
import torch
from hwcompile.testing import routing_warnings

GAUDI = hwenv.Accelerator("hpu", 8)


def _load(tmp_path, name, source):
    """Import a module from source text (stands for modelling code in another package)."""
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(source))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def load_module(tmp_path):
    names = []

    def load(name, source):
        names.append(name)
        return _load(tmp_path, name, source)

    yield load
    for name in names:
        sys.modules.pop(name, None)


def _recorder():
    graphs = []

    def my_backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    return my_backend, graphs


def test_off_gaudi_the_patch_is_a_no_op(clean_device_env):
    original = torch.compile
    with hwcompile.patch_torch_compile() as patch:  # this machine is not a Gaudi
        assert torch.compile is original and not patch.active and not hwcompile.is_patched()
        assert "runs torch's backends" in patch.reason
    assert torch.compile is original


@pytest.mark.facts("G13")
def test_undo_restores_the_identical_object_and_patching_twice_wraps_once(gaudi):
    original = torch.compile
    first = hwcompile.patch_torch_compile(GAUDI)
    wrapper = torch.compile
    second = hwcompile.patch_torch_compile(GAUDI)
    assert wrapper is not original and torch.compile is wrapper  # the second call added no layer
    assert wrapper.__wrapped__ is original and first.original is original
    assert hwcompile.is_patched()
    second.undo()
    assert torch.compile is wrapper  # first still holds it
    second.undo()  # undoing a handle twice does nothing more
    assert torch.compile is wrapper
    first.undo()
    assert torch.compile is original and not hwcompile.is_patched()
    with hwcompile.patch_torch_compile(GAUDI):
        with hwcompile.patch_torch_compile(GAUDI):
            assert torch.compile is not original
        assert torch.compile is not original
    assert torch.compile is original


def test_patch_and_undo_are_thread_safe(gaudi):
    original = torch.compile
    barrier = threading.Barrier(8)
    errors = []

    def work():
        try:
            barrier.wait()
            for _ in range(25):
                with hwcompile.patch_torch_compile(GAUDI):
                    assert getattr(torch.compile, "__wrapped__", None) is original
        except BaseException as error:  # reported below
            errors.append(error)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == [] and torch.compile is original


@pytest.mark.facts("G13")
def test_direct_calls_and_torch_compiler_compile_are_routed(gaudi, caplog):
    caplog.set_level(logging.WARNING)
    x = torch.randn(4)
    with hwcompile.patch_torch_compile(GAUDI):
        a = torch.compile(lambda t: t + 1, backend="inductor")(x)
        b = torch.compiler.compile(lambda t: t * 2, backend="aot_eager")(x)
        c = torch.compile(lambda t: t - 1, backend="eager")(x)  # eager stays: no graph for hpu_backend
    torch.testing.assert_close((a, b, c), (x + 1, x * 2, x - 1))
    assert len(gaudi.graphs) == 2
    assert len(routing_warnings(caplog.records)) == 2  # one for inductor, one for aot_eager


@pytest.mark.facts("G13")
def test_decorators_in_a_module_imported_before_the_patch(gaudi, caplog, load_module):
    caplog.set_level(logging.WARNING)
    modelling = load_module("hwcompile_test_modelling_before", """
        import torch

        def make_plain():
            @torch.compile
            def scaled(x):
                return x * 3 + 1
            return scaled

        def make_with_arguments():
            @torch.compile(fullgraph=True, mode="max-autotune")
            def shifted(x):
                return x.sin() - 1
            return shifted
    """)
    x = torch.randn(5)
    with hwcompile.patch_torch_compile(GAUDI):
        scaled = modelling.make_plain()
        shifted = modelling.make_with_arguments()
        torch.testing.assert_close(scaled(x), x * 3 + 1)
        torch.testing.assert_close(shifted(x), x.sin() - 1)
    assert len(gaudi.graphs) == 2 and gaudi.calls[1] == {}  # max-autotune was dropped
    [warning] = routing_warnings(caplog.records)  # both asked for the default backend: one warning
    assert "None (default inductor)" in warning.getMessage()


@pytest.mark.facts("G13")
def test_module_level_decorator_in_modelling_code_imported_after_the_patch(gaudi, caplog, load_module):
    caplog.set_level(logging.WARNING)
    x = torch.randn(5)
    with hwcompile.patch_torch_compile(GAUDI):
        modelling = load_module("hwcompile_test_modelling_after", """
            import torch

            @torch.compile
            def gelu_ish(x):
                return x * torch.sigmoid(1.702 * x)
        """)
        torch.testing.assert_close(modelling.gelu_ish(x), x * torch.sigmoid(1.702 * x))
    assert len(gaudi.graphs) == 1 and len(routing_warnings(caplog.records)) == 1


@pytest.mark.facts("G13")
def test_module_compile_is_routed_with_one_warning(gaudi, caplog):
    caplog.set_level(logging.WARNING)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).eval()
    x = torch.randn(3, 8)
    with torch.no_grad():
        expected = model(x)
        with hwcompile.patch_torch_compile(GAUDI):
            model.compile()  # nn.Module.compile calls torch.compile(self._call_impl, ...)
        got = model(x)
        again = model(x)
    torch.testing.assert_close((got, again), (expected, expected))
    assert len(gaudi.graphs) == 1
    [warning] = routing_warnings(caplog.records)
    assert "None (default inductor)" in warning.getMessage()


def test_what_was_compiled_before_the_patch_keeps_its_backend(gaudi, load_module):
    my_backend, graphs = _recorder()
    early = torch.compile(lambda t: t + 2, backend=my_backend)  # compiled (lazily) before patching
    x = torch.randn(3)
    with hwcompile.patch_torch_compile(GAUDI):
        torch.testing.assert_close(early(x), x + 2)
    assert len(graphs) == 1 and gaudi.graphs == []


def test_from_torch_import_compile_is_not_reached_unless_listed(gaudi, caplog, load_module):
    caplog.set_level(logging.WARNING)
    bound = load_module("hwcompile_test_bound_compile", """
        from torch import compile

        def build(backend):
            return compile(lambda t: t * 5, backend=backend)
    """)
    x = torch.randn(3)
    my_backend, graphs = _recorder()
    with hwcompile.patch_torch_compile(GAUDI):
        torch.testing.assert_close(bound.build(my_backend)(x), x * 5)
    assert len(graphs) == 1 and gaudi.graphs == []  # the early binding kept the original torch.compile
    assert routing_warnings(caplog.records) == []

    original = torch.compile
    with hwcompile.patch_torch_compile(GAUDI, modules=[bound]):
        assert bound.compile is torch.compile is not original
        torch.testing.assert_close(bound.build(my_backend)(x), x * 5)
    assert bound.compile is original
    assert len(graphs) == 1 and len(gaudi.graphs) == 1 and len(routing_warnings(caplog.records)) == 1


def test_modules_that_are_not_torch_compile_bindings_are_refused(gaudi, load_module):
    other = load_module("hwcompile_test_other_compile", "def compile(x):\n    return x\n")
    original = torch.compile
    with pytest.raises(hwcompile.PatchError, match="not torch.compile"):
        hwcompile.patch_torch_compile(GAUDI, modules=[other])
    with pytest.raises(hwcompile.PatchError, match="not an imported module"):
        hwcompile.patch_torch_compile(GAUDI, modules=["hwcompile_no_such_module"])
    assert torch.compile is original and not hwcompile.is_patched()


@pytest.mark.facts("G2")
def test_patch_refuses_lazy_mode(dynamo_gaudi, hpu_backend):
    dynamo_gaudi(8, lazy_mode="1")
    original = torch.compile
    with pytest.raises(hwcompile.LazyModeError, match="PT_HPU_LAZY_MODE=0"):
        hwcompile.patch_torch_compile(GAUDI)
    assert torch.compile is original


def test_a_reset_behind_the_patch_is_repaired_by_the_next_patch_call(gaudi):
    original = torch.compile
    first = hwcompile.patch_torch_compile(GAUDI)
    wrapper = torch.compile
    torch.compile = original  # someone else restores torch.compile while our handle is held
    second = hwcompile.patch_torch_compile(GAUDI)
    assert torch.compile is wrapper and "re-installed" in second.reason
    second.undo()
    first.undo()
    assert torch.compile is original


def test_a_functools_wraps_wrapper_over_the_patch_is_not_taken_for_hwcompile(gaudi, caplog):
    import functools

    from hwcompile.patch import is_patched_wrapper

    original = torch.compile
    patch = hwcompile.patch_torch_compile(GAUDI)
    ours = torch.compile

    @functools.wraps(ours)  # copies __dict__, hwcompile's mark included
    def theirs(*args, **kwargs):
        return ours(*args, **kwargs)

    torch.compile = theirs
    try:
        assert is_patched_wrapper(ours) and not is_patched_wrapper(theirs)
        assert hwcompile.is_patched()  # ours is under theirs: calls still pass through it
        assert hwcompile.torch_compile_function() is original
        patch.undo()
        assert torch.compile is theirs and not hwcompile.is_patched()
        assert any("replaced after hwcompile patched it" in r.getMessage() for r in caplog.records)
    finally:
        torch.compile = original

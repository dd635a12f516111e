"""kernels internals isolated in one function (issue 25, point 2) and `kernelized_layers` on kernels' public API.

Run on every supported pair: transformers 5.22.2 + kernels 0.17.2 (the lock), 5.24.0 + 0.18.3 and
5.25.0 + 0.19.1 (`uv run --with ...`); the assertions follow the installed kernels.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import hwattn
import pytest
from hwattn import KernelsInternalsError, kernel_plan, kernelized_layers, kernels_compat
from hwenv import Accelerator, at_least

XPU = Accelerator("xpu", torch_version="2.8.0")
SRC = Path(hwattn.__file__).parent


def installed_kernels() -> str:
    import kernels

    return kernels.__version__


@pytest.fixture
def model(make_config):
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM(make_config()).eval()


def test_internals_are_read_from_where_the_installed_kernels_keeps_them():
    internals = kernels_compat.kernels_internals()
    assert internals.version == installed_kernels()
    moved = at_least(installed_kernels(), (0, 19))
    assert internals.location == ("kernels._internals.layer" if moved else "kernels.layer")
    assert isinstance(internals.current_mapping(), dict)


@pytest.mark.parametrize("version", ["0.17.2", "0.18.3", "0.19.1"])
def test_each_version_looks_in_its_own_place_and_a_wrong_place_is_a_clear_error(version):
    """Asking for another release's layout on the installed kernels: works where the layout is the same,
    else the error names that version, what moved and the supported window."""
    same_layout = at_least(version, (0, 19)) == at_least(installed_kernels(), (0, 19))
    if same_layout:
        assert kernels_compat.kernels_internals(version).location in {"kernels.layer", "kernels._internals.layer"}
        return
    with pytest.raises(KernelsInternalsError) as info:
        kernels_compat.kernels_internals(version)
    message = str(info.value)
    assert f"installed kernels {version}" in message
    assert "kernels 0.19 moved `kernels.layer.globals._KERNEL_MAPPING`" in message
    assert "kernels._internals.layer" in message
    assert "0.17.2 <= version < 0.20" in message and "kernels 0.19.1 with transformers 5.25.0" in message
    assert isinstance(info.value, ImportError)


def test_kernel_plan_raises_the_clear_error_when_the_internal_moves(model, monkeypatch):
    monkeypatch.setattr(kernels_compat, "INTERNALS_LOCATIONS", (((0,), "kernels.moved_again"),))
    with pytest.raises(KernelsInternalsError, match=rf"installed kernels {re.escape(installed_kernels())} "
                                                    r"\(looked in kernels.moved_again"):
        kernel_plan(model, XPU)


def test_a_kernels_outside_the_window_is_planned_with_a_warning(caplog):
    caplog.set_level(logging.WARNING, logger="hwattn.kernels_compat")
    kernels_compat._warned.discard("0.20.0")
    if not at_least(installed_kernels(), (0, 19)):
        with pytest.raises(KernelsInternalsError, match="outside that window"):
            kernels_compat.kernels_internals("0.20.0")
        return
    assert kernels_compat.kernels_internals("0.20.0").location == "kernels._internals.layer"
    assert any("outside the window" in r.getMessage() and "0.20.0" in r.getMessage() for r in caplog.records)


def test_only_kernels_compat_touches_kernels_internals():
    """Issue 25: no private kernels name outside the one isolating function's module."""
    private = re.compile(r"_KERNEL_MAPPING\b|_select_repository|kernels\.layer\b|kernels\._internals|"
                         r"repos_by_capability|(?<![A-Za-z])_repo_id|_validate_device_type")
    offenders = [f"{path.name}:{n}" for path in sorted(SRC.glob("*.py")) if path.name != "kernels_compat.py"
                 for n, line in enumerate(path.read_text().splitlines(), 1) if private.search(line)]
    assert offenders == []
    assert private.search((SRC / "kernels_compat.py").read_text())  # the check can find them


# ---- kernelized_layers: what a loaded model really uses --------------------------------------------------------

class _FakeRepository:
    """A kernels repository (RepositoryProtocol: `load()` -> layer class) that never touches the Hub."""

    def __init__(self, repo_id: str, name: str, layer: type) -> None:
        self._repo_id, self.layer_name, self.func_name, self._layer = repo_id, name, name, layer

    def load(self) -> type:
        return self._layer


def _kernel_classes():
    import torch
    from torch import nn

    class TestSilu(nn.Module):
        can_torch_compile = True
        has_backward = True

        def forward(self, x):
            return torch.nn.functional.silu(x)

    class TestRope(nn.Module):
        can_torch_compile = True
        has_backward = True

        def forward(self, q, k, cos, sin, unsqueeze_dim=1):
            cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)

            def rotate(x):
                half = x.shape[-1] // 2
                return torch.cat((-x[..., half:], x[..., :half]), dim=-1)

            return q * cos + rotate(q) * sin, k * cos + rotate(k) * sin

    return TestSilu, TestRope


def test_kernelized_layers_reports_what_kernelize_replaced(model):
    import torch
    from kernels import Mode, kernelize, use_kernel_mapping

    assert kernelized_layers(model) == ()  # nothing kernelized yet
    silu, rope = _kernel_classes()
    ids = torch.arange(6).unsqueeze(0)
    with torch.no_grad():
        before = model(ids).logits
    mapping = {"SiLU": {"cpu": {Mode.INFERENCE: _FakeRepository("tests/silu", "TestSilu", silu)}},
               "rotary_pos_emb": {"cpu": {Mode.INFERENCE: _FakeRepository("tests/rope", "TestRope", rope)}}}
    with use_kernel_mapping(mapping, inherit_mapping=False):
        kernelize(model, mode=Mode.INFERENCE, device="cpu")
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, before, atol=1e-5)  # same maths, now through the test kernels
    found = {k.module: k for k in kernelized_layers(model)}
    acts = {f"model.layers.{i}.mlp.act_fn" for i in range(2)}
    ropes = {f"model.layers.{i}.self_attn.rotary_pos_emb" for i in range(2)}
    if hasattr(__import__("kernels"), "get_kernelized_layers"):  # kernels >= 0.18: the public API
        assert set(found) == acts | ropes
        assert {(found[m].layer, found[m].repo, found[m].repo_layer) for m in acts} == {("SiLU", "tests/silu", "TestSilu")}
        assert {(found[m].layer, found[m].repo) for m in ropes} == {("rotary_pos_emb", "tests/rope")}
        assert all("get_kernelized_layers" in k.reason for k in found.values())
    else:  # kernels 0.17: replaced forwards only, no repository, no kernel functions
        assert set(found) == acts
        assert all(k.layer == "SiLU" and k.repo is None and k.repo_layer == "TestSilu" for k in found.values())
        assert all("get_kernelized_layers is in kernels >= 0.18" in k.reason for k in found.values())
    assert all(k.replaced for k in found.values())

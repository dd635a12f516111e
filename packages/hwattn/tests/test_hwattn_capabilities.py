"""hwattn's per-kind tables (`hwattn.capabilities`): a row for every registered kind, rows that agree
with the platforms' facts and with Transformers / kernels, and a clear error for a kind without one."""

from __future__ import annotations

import ast
import inspect

import hwenv
import pytest
from hwattn import AttentionEnvironment, KindNotCoveredError, resolve_attention
from hwattn.capabilities import (
    FLASH,
    GQA,
    HUB_KERNELS,
    NVIDIA_ONLY_FLASH,
    TABLES,
    gqa_rule_for_device_type,
)
from hwattn.names import FLASH_KERNEL_DEVICES, FLASH_KERNEL_REPO, ROCM_FLASH_KERNEL_REPO
from hwenv.platforms import Platform, get_platform, register, unregister

KERNELS = AttentionEnvironment(kernels_available=True)


def missing_rows(kinds: tuple[str, ...]) -> dict[str, list[str]]:
    """{table name: kinds without a row} for the given kinds."""
    return {name: [kind for kind in kinds if kind not in table] for name, table in TABLES.items()
            if any(kind not in table for kind in kinds)}


def test_every_table_has_a_row_for_every_registered_kind():
    kinds = tuple(platform.kind for platform in hwenv.platforms())
    assert len(kinds) >= 6
    assert not missing_rows(kinds), "add these rows to hwattn/capabilities.py"
    stale = {name: sorted(set(table) - set(kinds)) for name, table in TABLES.items() if set(table) - set(kinds)}
    assert not stale, "rows for kinds hwenv does not register"


def test_every_row_says_why():
    for name, table in TABLES.items():
        for kind, row in table.items():
            assert row.reason.strip(), (name, kind)


@pytest.fixture
def plugin_kind():
    """A plug-in platform registered for one test (as an installed `hwstack.platforms` entry point would be)."""
    platform = Platform(kind="dummy", device_type="dummy", display_name="Dummy accelerator",
                        probe="hwattn:__name__", priority=30, vendor="test")
    register(platform, origin="test")
    yield platform
    unregister("dummy")


def test_a_new_kind_without_rows_is_found_and_refused(plugin_kind):
    kinds = tuple(platform.kind for platform in hwenv.platforms())
    assert missing_rows(kinds) == {"FLASH": ["dummy"], "HUB_KERNELS": ["dummy"], "GQA": ["dummy"]}
    accel = hwenv.Accelerator("dummy")
    with pytest.raises(KindNotCoveredError, match=r"'dummy' has no row in hwattn.capabilities.GQA.*capabilities.py"):
        resolve_attention(accel, "sdpa", environment=KERNELS)
    with pytest.raises(KindNotCoveredError, match="FLASH"):
        resolve_attention(accel, "flash_attention_2", environment=KERNELS)


def test_flash_rows_agree_with_the_platforms():
    for kind, support in FLASH.items():
        platform = get_platform(kind)
        nvidia = platform.vendor == "nvidia"
        offers_nvidia_only = any(name in support.kernels for name in NVIDIA_ONLY_FLASH)
        assert offers_nvidia_only == nvidia, kind  # FA3/FA4 exactly on NVIDIA (X8): never on ROCm
        assert support.capability_checked == nvidia, kind  # CUDA compute capability is an NVIDIA number
        if support.kernels:
            assert platform.is_accelerator and not support.fallback_allowed, kind
        else:
            assert support.fallback_allowed and support.why_not, kind
        if not support.fallback_allowed:  # its refusal names what to use instead
            assert support.label and support.source or support.capability_checked, kind


def test_each_offered_hub_kernel_ships_a_build_for_the_kind():
    for kind, support in FLASH.items():
        device = HUB_KERNELS[kind].kernels_device
        for repo in support.kernels.values():
            assert device in FLASH_KERNEL_DEVICES[repo], (kind, repo)


def test_hub_kernel_names_are_the_libraries_names(monkeypatch):
    """Each row's kernels device type / KernelConfig key is what kernels and Transformers call the kind."""
    import torch
    from hwattn import device_keys
    from kernels import LayerRepository, use_kernel_mapping
    from transformers.utils import import_utils

    for kind, hub in HUB_KERNELS.items():
        platform = get_platform(kind)
        if hub.config_key is not None:
            assert hub.config_key in device_keys() and hub.config_key == hub.kernels_device, kind
        if hub.kernels_device is None:
            assert hub.config_key is None and hub.refused, kind
            continue
        # kernels' public mapping API raises for a device type it does not know (e.g. 'hpu').
        with use_kernel_mapping({"HwattnProbe": {hub.kernels_device: LayerRepository("a/b", layer_name="C", version=1)}},
                                inherit_mapping=False):
            pass
        # Transformers' own name for a tensor on this platform (a HIP build's cuda device is 'rocm').
        monkeypatch.setattr(import_utils, "is_rocm_platform", lambda amd=platform.vendor == "amd": amd)
        assert import_utils.get_device_type(torch.device(platform.device_type)) == hub.kernels_device, kind


def test_kinds_sharing_a_device_type_share_the_gqa_rule():
    by_type: dict[str, set] = {}
    for platform in hwenv.platforms():
        by_type.setdefault(platform.device_type, set()).add(GQA[platform.kind].masked_from)
    assert all(len(rules) == 1 for rules in by_type.values()), by_type
    assert gqa_rule_for_device_type("cuda").masked_from is None  # NVIDIA and ROCm
    assert gqa_rule_for_device_type("xpu").masked_from == (2, 8)
    assert gqa_rule_for_device_type("meta").masked_from is None  # no platform: Transformers' default branch


def _transformers_flash_fallback(rocm: bool) -> dict[str, str]:
    """Transformers' `FLASH_ATTN_KERNEL_FALLBACK` as its source defines it on a ROCm / a non-ROCm torch."""
    from transformers import modeling_flash_attention_utils as module

    tree = ast.parse(inspect.getsource(module))
    node = next(n.value for n in tree.body if isinstance(n, ast.Assign)
                and any(getattr(t, "id", None) == "FLASH_ATTN_KERNEL_FALLBACK" for t in n.targets))

    def value(expr: ast.expr) -> str:
        if isinstance(expr, ast.IfExp):
            assert ast.unparse(expr.test) == "is_rocm_platform()"
            return value(expr.body if rocm else expr.orelse)
        return ast.literal_eval(expr)

    return {ast.literal_eval(k): value(v) for k, v in zip(node.keys, node.values, strict=True)}


def test_rocm_flash_kernel_is_transformers_rocm_fallback():
    from transformers.modeling_flash_attention_utils import FLASH_ATTN_KERNEL_DEVICES

    rocm, other = _transformers_flash_fallback(rocm=True), _transformers_flash_fallback(rocm=False)
    assert other == FLASH_KERNEL_REPO == FLASH["cuda"].kernels
    assert dict(FLASH["rocm"].kernels) == {"flash_attention_2": rocm["flash_attention_2"]} == {
        "flash_attention_2": ROCM_FLASH_KERNEL_REPO}
    assert FLASH_ATTN_KERNEL_DEVICES[ROCM_FLASH_KERNEL_REPO] == ("rocm",)
    assert "rocm" not in FLASH_ATTN_KERNEL_DEVICES[FLASH_KERNEL_REPO["flash_attention_2"]]  # flash-attn2: no ROCm
    # Transformers would also load the aiter kernel for 'flash_attention_3' on ROCm; hwattn refuses FA3 there
    # (X8, issue 24) and says so in the error.
    assert rocm["flash_attention_3"] == ROCM_FLASH_KERNEL_REPO
    assert ROCM_FLASH_KERNEL_REPO in FLASH["rocm"].refusal_note


def test_kernels_refuses_a_device_type_it_does_not_know():
    """The check above can fail: the same public call raises for 'hpu' (no hub kernels on Gaudi)."""
    from kernels import LayerRepository, use_kernel_mapping

    with pytest.raises(ValueError, match="hpu"):
        with use_kernel_mapping({"HwattnProbe": {"hpu": LayerRepository("a/b", layer_name="C", version=1)}}, inherit_mapping=False):
            pass

"""Hub-kernel mappings and trust (issue 27 point 8): a repository outside the allowed organisations needs an
explicit allow, and `trust_remote_code: True` in a mapping needs the caller's own `trust_remote_code=True`."""

from __future__ import annotations

import hwattn
import pytest
from hwattn import (
    KernelMappingError,
    KernelTrustError,
    kernel_mapping,
    kernel_plan,
    load_kwargs,
    validate_mapping,
)
from hwenv import Accelerator

XPU = Accelerator("xpu", torch_version="2.8.0")
OTHER = {"RMSNorm": {"xpu": "myorg/fast-norm:FastRMSNorm"}}
TRUSTING = {"RMSNorm": {"xpu": ("kernels-community/rmsnorm:RMSNorm", {"version": 1, "trust_remote_code": True})}}


@pytest.fixture(scope="module")
def model(make_config):
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM(make_config()).eval()


def test_trusted_organisation_needs_no_allow():
    assert hwattn.TRUSTED_KERNEL_ORGS == ("kernels-community",)
    assert validate_mapping({"RMSNorm": "kernels-community/rmsnorm"}) == {"RMSNorm": "kernels-community/rmsnorm:RMSNorm"}


@pytest.mark.parametrize("mapping", [OTHER, {"RMSNorm": "myorg/fast-norm:FastRMSNorm"},
                                     {"RMSNorm": {"xpu": ("myorg/fast-norm:FastRMSNorm", {"version": 1})}},
                                     {"RMSNorm": {"cuda": "kernels-community/rmsnorm", "xpu": "myorg/fast-norm"}},
                                     {"RMSNorm": {"xpu": "Kernels-Community/rmsnorm"}}])  # organisations match exactly
def test_another_organisation_is_refused_naming_value_rule_and_both_allows(mapping):
    with pytest.raises(KernelTrustError) as info:
        kernel_mapping(mapping)
    message = str(info.value)
    org = "Kernels-Community" if "Kernels-Community" in str(mapping) else "myorg"
    assert f"organisation {org!r}" in message and "allowed: kernels-community" in message
    assert f"allowed_orgs=({org!r},)" in message and "allow_repos=(" in message
    assert isinstance(info.value, KernelMappingError) and isinstance(info.value, hwattn.HwattnError)
    assert isinstance(info.value, ValueError)


def test_an_explicit_allow_lets_it_through():
    assert kernel_mapping(OTHER, allowed_orgs=("myorg",)).kernel_mapping == OTHER
    assert kernel_mapping(OTHER, allowed_orgs="myorg").kernel_mapping == OTHER  # one name is one organisation
    assert kernel_mapping(OTHER, allow_repos=["myorg/fast-norm"]).kernel_mapping == OTHER
    with pytest.raises(KernelTrustError):  # another repository of that organisation is not allowed by allow_repos
        kernel_mapping({"RMSNorm": "myorg/other-norm:X"}, allow_repos=["myorg/fast-norm"])


@pytest.mark.parametrize(("option", "value", "named"), [
    ("allowed_orgs", ("my org",), "'my org'"), ("allowed_orgs", (3,), "3"), ("allowed_orgs", 5, "5"),
    ("allow_repos", ("myorg",), "'myorg'"), ("allow_repos", ("a/b/c",), "'a/b/c'"),
])
def test_malformed_allow_options_are_errors(option, value, named):
    with pytest.raises(KernelMappingError) as info:
        kernel_mapping(OTHER, **{option: value})
    assert option in str(info.value) and named in str(info.value)


def test_trust_remote_code_in_a_mapping_needs_the_callers_own():
    with pytest.raises(KernelTrustError) as info:
        kernel_mapping(TRUSTING)
    message = str(info.value)
    assert "trust_remote_code=True in the mapping" in message and "'kernels-community/rmsnorm'" in message
    assert "Pass trust_remote_code=True yourself" in message
    config = kernel_mapping(TRUSTING, trust_remote_code=True)
    assert config.kernel_mapping["RMSNorm"]["xpu"][1]["trust_remote_code"] is True
    # trust_remote_code does not widen the organisations
    with pytest.raises(KernelTrustError, match="organisation 'myorg'"):
        kernel_mapping({"RMSNorm": {"xpu": ("myorg/n:N", {"version": 1, "trust_remote_code": True})}},
                       trust_remote_code=True)
    with pytest.raises(KernelMappingError, match="trust_remote_code must be True or False"):
        kernel_mapping(TRUSTING, trust_remote_code="yes")


def test_trust_remote_code_false_in_a_mapping_needs_nothing():
    mapping = {"RMSNorm": {"xpu": ("kernels-community/rmsnorm:RMSNorm", {"version": 1, "trust_remote_code": False})}}
    assert kernel_mapping(mapping).kernel_mapping == mapping


def test_local_kernels_have_no_organisation_but_keep_the_trust_rule():
    local = {"RMSNorm": {"xpu": "/opt/rmsnorm:RMSNorm"}}
    assert kernel_mapping(local, use_local_kernel=True).kernel_mapping == local
    with pytest.raises(KernelTrustError):
        kernel_mapping({"RMSNorm": {"xpu": ("/opt/rmsnorm:RMSNorm", {"version": 1, "trust_remote_code": True})}},
                       use_local_kernel=True)


def test_load_kwargs_applies_the_rules_to_dicts_and_kernel_configs():
    from transformers import KernelConfig

    with pytest.raises(KernelTrustError):
        load_kwargs(XPU, "sdpa", mapping=OTHER)
    with pytest.raises(KernelTrustError):  # a KernelConfig built without hwattn is checked too
        load_kwargs(XPU, "sdpa", mapping=KernelConfig(kernel_mapping=OTHER))
    with pytest.raises(KernelTrustError):
        load_kwargs(XPU, "sdpa", mapping=KernelConfig(kernel_mapping=TRUSTING))
    if hwattn.kernels_available():
        kwargs = load_kwargs(XPU, "sdpa", mapping=OTHER, allowed_orgs=("myorg",))
        assert kwargs["kernel_config"].kernel_mapping == OTHER
        kwargs = load_kwargs(XPU, "sdpa", mapping=KernelConfig(kernel_mapping=TRUSTING), trust_remote_code=True)
        assert kwargs["use_kernels"] is True


def test_kernel_plan_applies_the_rules(model):
    with pytest.raises(KernelTrustError):
        kernel_plan(model, XPU, OTHER)
    plan = kernel_plan(model, XPU, OTHER, allow_repos=("myorg/fast-norm",))
    assert {k.repo for k in plan.replaced if k.layer == "RMSNorm"} == {"myorg/fast-norm"}

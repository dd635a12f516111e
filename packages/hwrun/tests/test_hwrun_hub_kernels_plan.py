"""`hwrun plan` says when a plain Transformers load here reaches for Hub kernels, with the fix (issue 41.9).

Sources: transformers 5.25 `modeling_utils.py` (`from_pretrained`: absent `use_kernels` -> True unless
`USE_HUB_KERNELS` is off), `integrations/hub_kernels.py` (`_build_kernel_mapping`: cuda, rocm, xpu only);
kernels 0.19 `_internals/_versions.py` (offline, a version missing from the cache raises). The rule is hwenv's
(`hwenv.hub_kernels_status`); hwrun itself loads with `use_kernels=False` (hwattn).
"""

from __future__ import annotations

import hwenv
import hwrun
import pytest
from hwrun.testing import build_tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny-hub-plan")))


def test_plan_on_an_xpu_offline_says_a_plain_load_fails_and_the_fix(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELS_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("USE_HUB_KERNELS", raising=False)
    plan = hwrun.plan(tiny, device=hwenv.Accelerator("xpu", 1, memory=(64 * 2**30,)))
    reason = plan.reasons["use_kernels"]
    assert plan.use_kernels is False
    assert hwrun.from_pretrained_kwargs(plan)["use_kernels"] is False  # hwrun's own load does not reach the Hub
    if not hwenv.hub_kernels_status("xpu").default_on:
        # the oldest supported pair (transformers 5.22.2): from_pretrained leaves an absent use_kernels off, so a
        # plain load fetches nothing and the plan says nothing about it
        assert "by itself" not in reason
        return
    assert "hwrun loads with use_kernels=False" in reason
    assert "kernels-community/rotary v2" in reason and "offline this fails now" in reason
    assert "USE_HUB_KERNELS=NO" in reason


def test_plan_says_nothing_where_no_hub_kernel_is_fetched(tiny, monkeypatch):
    monkeypatch.delenv("USE_HUB_KERNELS", raising=False)
    for device in ("cpu", hwenv.Accelerator("hpu", 1, names=("GAUDI2",))):
        assert "Hub kernels on by itself" not in hwrun.plan(tiny, device=device).reasons["use_kernels"]
    monkeypatch.setenv("USE_HUB_KERNELS", "NO")
    assert "by itself" not in hwrun.plan(tiny, device=hwenv.Accelerator("cuda", 1)).reasons["use_kernels"]

"""`hwenv.run_environment`: the variables a run needs, decided by the platform (issue 41.5).

Gaudi: gaudi-pytorch-bridge 1.19 `scripts/env_flags.yaml` marks `PT_ENABLE_INT64_SUPPORT` "supported only for
non-lazy mode (PT_HPU_LAZY_MODE=0) and Gaudi2 or newer" (default true in eager mode), and
`common/eager/utils.cpp` `IsInt64Supported` is false on a device named "GAUDI"; so it is written only in eager
mode on Gaudi 2+, never in lazy mode (1.20 and older by default) or on Gaudi 1.
"""

from __future__ import annotations

import hwenv
import pytest


@pytest.mark.parametrize("environ, plugin, names, expected", [
    ({"PT_HPU_LAZY_MODE": "0"}, "1.22.0", ("GAUDI2",), {"PT_ENABLE_INT64_SUPPORT": "1"}),
    ({}, "1.21.0", ("GAUDI3",), {"PT_ENABLE_INT64_SUPPORT": "1"}),
    ({}, "1.20.0", ("GAUDI2",), {}),  # lazy by default up to 1.20
    ({"PT_HPU_LAZY_MODE": "1"}, "1.22.0", ("GAUDI2",), {}),
    ({"PT_HPU_LAZY_MODE": "0"}, "1.22.0", ("GAUDI",), {}),  # Gaudi 1
])
def test_int64_only_where_the_bridge_supports_it(environ, plugin, names, expected):
    from hwenv.testing import override_versions

    with override_versions(habana_torch_plugin=plugin):
        env, reason = hwenv.run_environment(hwenv.Accelerator("hpu", 1, names=names), environ)
    assert env == expected
    assert ("token ids are int64" in reason) if expected else ("PT_ENABLE_INT64_SUPPORT not set: int64 is not "
                                                               "supported" in reason)


def test_platforms_without_a_rule_need_nothing():
    for kind in ("xpu", "cuda", "rocm", "mps", "cpu"):
        assert hwenv.get_platform(kind).run_env is None
        assert hwenv.run_environment(kind, {}) == ({}, "no variables needed on this device")
    assert hwenv.get_platform("hpu").run_env == "hwenv.gaudi.environment:run_env"

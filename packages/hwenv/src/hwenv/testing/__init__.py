"""The shared fakes every hwstack package tests with: fake `torch.xpu`, Gaudi, CUDA, `hl-smi`, versions.

The fakes carry the real APIs' names and signatures (`torch.xpu.is_available`,
`device_count`, `get_device_name`, `is_bf16_supported`, ...; `habana_frameworks.torch`,
`torch.hpu`; `hl-smi -Q index,module_id -f csv` output), and a test checks them against the
installed torch. Each fake is a context manager; the same fakes are pytest fixtures (this
module is registered as a pytest plugin through the `pytest11` entry point):

    def test_plan_on_four_xpus(fake_xpu):
        fake_xpu(count=4, bf16=True)
        assert hwenv.detect().kind == "xpu"

Importing this module does not import torch or pytest.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any

from .common import (
    DEVICE_VARIABLES,
    GiB,
    _device_index,
    _fake_device_functions,
    _Patches,
    _properties,
    clean_device_env,
    clear_library_caches,
    override_versions,
)
from .cuda import fake_cuda
from .gaudi import HL_SMI_CSV_8, fake_gaudi, fake_hl_smi, write_fake_hl_smi
from .xpu import fake_xpu

__all__ = [
    "DEVICE_VARIABLES", "GiB", "HL_SMI_CSV_8", "clean_device_env", "clear_library_caches", "fake_cuda",
    "fake_gaudi", "fake_hl_smi", "fake_xpu", "override_versions", "write_fake_hl_smi",
    "_Patches", "_device_index", "_fake_device_functions", "_properties",
]


# ---- pytest fixtures (loaded through the `pytest11` entry point) -----------------------------

def _fixture_factory(context_manager):
    def fixture():
        stack = contextlib.ExitStack()

        def apply(*args: Any, **kwargs: Any):
            return stack.enter_context(context_manager(*args, **kwargs))

        try:
            yield apply
        finally:
            stack.close()

    fixture.__name__ = context_manager.__name__
    fixture.__doc__ = f"Factory fixture: call it to apply `hwenv.testing.{context_manager.__name__}` for this test."
    return fixture


_pytest = sys.modules.get("pytest")  # fixtures exist only when pytest is the one importing us
if _pytest is not None and hasattr(_pytest, "fixture"):
    fake_xpu_fixture = _pytest.fixture(name="fake_xpu")(_fixture_factory(fake_xpu))
    fake_cuda_fixture = _pytest.fixture(name="fake_cuda")(_fixture_factory(fake_cuda))
    fake_gaudi_fixture = _pytest.fixture(name="fake_gaudi")(_fixture_factory(fake_gaudi))
    fake_hl_smi_fixture = _pytest.fixture(name="fake_hl_smi")(_fixture_factory(fake_hl_smi))
    versions_fixture = _pytest.fixture(name="override_versions")(_fixture_factory(override_versions))

    @_pytest.fixture(name="clean_device_env", autouse=False)
    def clean_device_env_fixture():
        """Run the test with no device-selection variables in the environment."""
        with clean_device_env():
            yield

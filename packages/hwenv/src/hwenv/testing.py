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
import importlib.machinery
import os
import stat
import sys
import tempfile
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from . import versions as _versions

GiB = 2**30

#: Canned `hl-smi -Q index,module_id -f csv` output for an 8-Gaudi server, in the format of
#: Intel's multi-tenant guide (header `index, module_id`, a space after the comma, rows not
#: sorted by index). The mapping itself is made up for tests.
HL_SMI_CSV_8 = """index, module_id
3, 6
1, 4
2, 7
0, 5
7, 2
5, 0
6, 3
4, 1
"""

#: Environment variables that steer device selection; fakes clear them so tests start clean.
DEVICE_VARIABLES = (
    "HWENV_DEVICE", "ZE_AFFINITY_MASK", "ZE_ENABLE_PCI_ID_DEVICE_ORDER", "HABANA_VISIBLE_MODULES",
    "HABANA_VISIBLE_DEVICES", "PT_ENABLE_INT64_SUPPORT", "PT_HPU_LAZY_MODE", "CUDA_VISIBLE_DEVICES",
)


class _Patches:
    """Set attributes / sys.modules entries / env vars and undo them in reverse order."""

    _missing = object()

    def __init__(self) -> None:
        self._undo: list[Any] = []

    def setattr(self, obj: Any, name: str, value: Any) -> None:
        old = getattr(obj, name, self._missing)
        self._undo.append(lambda: delattr(obj, name) if old is self._missing else setattr(obj, name, old))
        setattr(obj, name, value)

    def module(self, name: str, module: types.ModuleType) -> None:
        old = sys.modules.get(name, self._missing)
        self._undo.append(lambda: sys.modules.pop(name, None) if old is self._missing else sys.modules.__setitem__(name, old))
        sys.modules[name] = module

    def setenv(self, name: str, value: str | None) -> None:
        old = os.environ.get(name)
        self._undo.append(lambda: os.environ.pop(name, None) if old is None else os.environ.__setitem__(name, old))
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value

    def undo(self) -> None:
        while self._undo:
            self._undo.pop()()


def clear_library_caches() -> None:
    """Clear the cached device checks of transformers and accelerate, so fakes take effect."""
    names = {
        "transformers.utils.import_utils": (
            "is_torch_xpu_available", "is_torch_hpu_available", "is_torch_bf16_gpu_available",
            "is_torch_cuda_available", "is_torch_accelerator_available", "is_torch_flex_attn_available",
        ),
        "accelerate.utils.imports": ("is_xpu_available", "is_hpu_available", "is_cuda_available", "is_bf16_available"),
    }
    for module_name, functions in names.items():
        module = sys.modules.get(module_name)
        for function in functions:
            cached = getattr(module, function, None) if module else None
            if hasattr(cached, "cache_clear"):
                cached.cache_clear()


def _properties(name: str, memory: int, **extra: Any) -> types.SimpleNamespace:
    return types.SimpleNamespace(name=name, total_memory=memory, **extra)


def _device_index(device: Any, count: int) -> int:
    if device is None:
        return 0
    if isinstance(device, int):
        index = device
    else:
        index = getattr(device, "index", None)
        if index is None and isinstance(device, str):
            index = int(device.split(":")[1]) if ":" in device else 0
        index = 0 if index is None else int(index)
    if not 0 <= index < count:
        raise RuntimeError(f"Invalid device id {index} (fake has {count} device(s))")
    return index


def _fake_device_functions(count: int, names: list[str], bf16: bool, memory: int) -> dict[str, Any]:
    """Functions with the signatures of `torch.xpu`'s (checked by hwenv's tests)."""
    state = {"current": 0}

    def is_available() -> bool:
        return count > 0

    def device_count() -> int:
        return count

    def get_device_name(device=None) -> str:
        return names[_device_index(device, count)]

    def is_bf16_supported(including_emulation: bool = True) -> bool:
        return bf16

    def get_device_properties(device=None):
        index = _device_index(device, count)
        return _properties(names[index], memory)

    def current_device() -> int:
        return state["current"]

    def set_device(device) -> None:
        state["current"] = _device_index(device, count)

    def synchronize(device=None) -> None:
        return None

    return {f.__name__: f for f in (is_available, device_count, get_device_name, is_bf16_supported,
                                      get_device_properties, current_device, set_device, synchronize)}


@contextlib.contextmanager
def _replaced_functions(module: Any, functions: dict[str, Any]) -> Iterator[None]:
    """Replace `module`'s functions (the module object stays), clear device variables and caches."""
    patches = _Patches()
    try:
        for variable in DEVICE_VARIABLES:
            patches.setenv(variable, None)
        for fname, function in functions.items():
            patches.setattr(module, fname, function)
        clear_library_caches()
        yield
    finally:
        patches.undo()
        clear_library_caches()


@contextlib.contextmanager
def fake_xpu(count: int = 1, *, bf16: bool = True, name: str = "Intel(R) Data Center GPU Max 1550",
             memory: int = 64 * GiB) -> Iterator[types.SimpleNamespace]:
    """Make the real `torch.xpu` report `count` Intel GPUs (the functions are replaced, not the module).
    It reports devices only: allocating on `xpu` still fails, so import libraries that allocate at
    import time (bitsandbytes, and peft or TrainingArguments through it) before entering."""
    import torch

    names = [name] * count
    functions = _fake_device_functions(count, names, bf16, memory)
    with _replaced_functions(torch.xpu, functions):
        yield types.SimpleNamespace(count=count, bf16=bf16, names=names, memory=memory, functions=functions)


@contextlib.contextmanager
def fake_cuda(count: int = 1, *, bf16: bool = True, name: str = "NVIDIA H200", memory: int = 140 * GiB,
              capability: tuple[int, int] = (9, 0)) -> Iterator[types.SimpleNamespace]:
    """Make the real `torch.cuda` report `count` NVIDIA GPUs of the given compute capability."""
    import torch

    names = [name] * count
    functions = _fake_device_functions(count, names, bf16, memory)

    def get_device_capability(device=None) -> tuple[int, int]:
        _device_index(device, count)
        return capability

    def get_device_properties(device=None):
        index = _device_index(device, count)
        return _properties(names[index], memory, major=capability[0], minor=capability[1])

    functions["get_device_capability"] = get_device_capability
    functions["get_device_properties"] = get_device_properties
    with _replaced_functions(torch.cuda, functions):
        yield types.SimpleNamespace(count=count, bf16=bf16, names=names, memory=memory, capability=capability)


def _package(name: str, **attributes: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__path__ = []  # a package, so submodules import
    module.__spec__ = importlib.machinery.ModuleSpec(name, loader=None, is_package=True)
    module.__dict__.update(attributes)
    return module


def write_fake_hl_smi(directory: str | os.PathLike, csv: str = HL_SMI_CSV_8, *, exit_code: int = 0) -> Path:
    """Write an executable `hl-smi` into `directory` that prints `csv` for `-Q index,module_id -f csv`."""
    path = Path(directory) / "hl-smi"
    path.write_text(
        f"#!{sys.executable}\n"
        "import sys\n"
        f"expected = ['-Q', 'index,module_id', '-f', 'csv']\n"
        "if sys.argv[1:] != expected:\n"
        "    print('fake hl-smi: unexpected arguments', sys.argv[1:], file=sys.stderr); sys.exit(64)\n"
        f"sys.stdout.write({csv!r})\n"
        f"sys.exit({exit_code})\n"
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


@contextlib.contextmanager
def fake_hl_smi(csv: str = HL_SMI_CSV_8, *, exit_code: int = 0) -> Iterator[Path]:
    """Put a fake `hl-smi` first on PATH for the duration."""
    patches = _Patches()
    with tempfile.TemporaryDirectory(prefix="fake-hl-smi-") as directory:
        path = write_fake_hl_smi(directory, csv, exit_code=exit_code)
        try:
            patches.setenv("PATH", f"{directory}{os.pathsep}{os.environ.get('PATH', '')}")
            yield path
        finally:
            patches.undo()


def _torch_globals_transformers_patches(torch: Any) -> list[tuple[Any, str]]:
    """The torch attributes transformers replaces on Gaudi (utils/import_utils.py, is_torch_hpu_available)."""
    return [(torch, "gather"), (torch.Tensor, "gather"), (torch, "take_along_dim"), (torch.linalg, "cholesky"),
            (torch, "scatter"), (torch.Tensor, "scatter"), (torch, "compile")]


@contextlib.contextmanager
def fake_gaudi(count: int = 8, *, name: str = "GAUDI2", memory: int = 96 * GiB, plugin_version: str = "1.22.0",
               accelerate_version: str | None = None, hl_smi: str | None = HL_SMI_CSV_8,
               lazy_mode: str | None = None) -> Iterator[types.SimpleNamespace]:
    """Install a fake `habana_frameworks` (with `.torch`, `.torch.core`, `.torch.hpu`,
    `.torch.distributed.hccl`) and `torch.hpu`, as the real plugin registers it, plus a fake
    `hl-smi` on PATH. `accelerate_version` overrides the version hwenv reads (G5 tests).
    """
    import torch

    patches = _Patches()
    names = [name] * count
    functions = _fake_device_functions(count, names, True, memory)
    # Stream/Event: torch._dynamo reads them from torch.hpu while tracing (_in_graph_classes).
    hpu = _package("habana_frameworks.torch.hpu", **functions, Stream=type("Stream", (), {}),
                   Event=type("Event", (), {}))
    core = _package("habana_frameworks.torch.core", mark_step=lambda *args, **kwargs: None)
    hccl = _package("habana_frameworks.torch.distributed.hccl")
    distributed = _package("habana_frameworks.torch.distributed", hccl=hccl)
    htorch = _package("habana_frameworks.torch", core=core, hpu=hpu, distributed=distributed)
    root = _package("habana_frameworks", torch=htorch, __version__=plugin_version)
    overrides = {"habana-torch-plugin": plugin_version}
    if accelerate_version is not None:
        overrides["accelerate"] = accelerate_version
    with contextlib.ExitStack() as stack:
        try:
            for variable in DEVICE_VARIABLES:
                patches.setenv(variable, None)
            if lazy_mode is not None:
                patches.setenv("PT_HPU_LAZY_MODE", lazy_mode)
            # transformers.is_torch_hpu_available() patches these torch globals when it first
            # returns True; save them so the fake leaves torch as it found it.
            for owner, attribute in _torch_globals_transformers_patches(torch):
                patches.setattr(owner, attribute, getattr(owner, attribute))
            for module in (root, htorch, core, hpu, distributed, hccl):
                patches.module(module.__name__, module)
            patches.setattr(torch, "hpu", hpu)
            stack.enter_context(override_versions(**overrides))
            hl_smi_path = stack.enter_context(fake_hl_smi(hl_smi)) if hl_smi is not None else None
            clear_library_caches()
            yield types.SimpleNamespace(count=count, names=names, memory=memory, hpu=hpu, modules=root,
                                        hl_smi=hl_smi_path, functions=functions)
        finally:
            patches.undo()
            clear_library_caches()


@contextlib.contextmanager
def override_versions(**distributions: str | None) -> Iterator[None]:
    """Make hwenv read the given versions (`accelerate="1.4.0"`; None = not installed).

    Keyword names use `_` for `-`: `habana_torch_plugin="1.22.0"`.
    """
    previous = dict(_versions._overrides)
    try:
        for name, version in distributions.items():
            _versions._overrides[name.replace("_", "-")] = version
        yield
    finally:
        _versions._overrides.clear()
        _versions._overrides.update(previous)


@contextlib.contextmanager
def clean_device_env() -> Iterator[None]:
    """Remove every device-selection variable from `os.environ` for the duration."""
    patches = _Patches()
    try:
        for variable in DEVICE_VARIABLES:
            patches.setenv(variable, None)
        yield
    finally:
        patches.undo()


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

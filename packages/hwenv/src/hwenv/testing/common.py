"""What every fake shares: reversible patches, the device variables, device functions, versions."""

from __future__ import annotations

import contextlib
import importlib.machinery
import os
import sys
import types
from collections.abc import Iterator
from typing import Any

from .. import versions as _versions

GiB = 2**30

DEVICE_VARIABLES = (
    "HWENV_DEVICE", "ZE_AFFINITY_MASK", "ZE_ENABLE_PCI_ID_DEVICE_ORDER", "ZE_FLAT_DEVICE_HIERARCHY", "HABANA_VISIBLE_MODULES",
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


def _package(name: str, **attributes: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__path__ = []  # a package, so submodules import
    module.__spec__ = importlib.machinery.ModuleSpec(name, loader=None, is_package=True)
    module.__dict__.update(attributes)
    return module


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



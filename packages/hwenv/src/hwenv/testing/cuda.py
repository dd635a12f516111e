"""`fake_cuda`: the real `torch.cuda` made to report NVIDIA GPUs of a compute capability."""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator

from .common import GiB, _device_index, _fake_device_functions, _properties, _replaced_functions


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



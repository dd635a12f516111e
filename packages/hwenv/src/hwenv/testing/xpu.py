"""`fake_xpu`: the real `torch.xpu` made to report Intel GPUs (functions replaced, module kept)."""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator

from .common import GiB, _fake_device_functions, _replaced_functions


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



"""Device-graph capture emulated on host tensors, for the fakes' graph classes (`HPUGraph`, `XPUGraph`).

A real graph records the kernels a region launches and replays them on the same memory. `OpTape`
does that one level up: between `begin()` and `end()` a `TorchDispatchMode` records every aten op
with its arguments (the very tensor objects), and `replay()` runs the same ops again on the same
tensors, writing each fresh result into the tensor the capture produced (results that share
storage with an input are views or in-place writes and need nothing). So a step whose inputs and
outputs live in fixed buffers replays exactly, and a step that depends on anything else (a Python
number read at capture time, a new tensor passed in) replays stale values, as on a device. What a
capture cannot contain raises, as on a device: a host read of a device value (`.item()`,
`.tolist()`, `bool(t)`: `aten._local_scalar_dense`) and ops whose output shape depends on the data
(`nonzero`). Nothing here runs on import; torch is imported on first use.
"""

from __future__ import annotations

from typing import Any

#: aten ops a capture cannot hold (their result is needed on the host, or sizes an output from data).
UNCAPTURABLE = ("_local_scalar_dense", "nonzero", "masked_select", "_unique2", "unique_dim")


class GraphCaptureError(RuntimeError):
    """An op a device graph cannot capture ran during a (fake) capture."""


def _mode_class() -> type:
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class Recorder(TorchDispatchMode):
        def __init__(self, tape: OpTape) -> None:
            super().__init__()
            self.tape = tape

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
            import torch

            kwargs = kwargs or {}
            name = func.overloadpacket.__name__
            if name in UNCAPTURABLE:
                raise GraphCaptureError(
                    f"{self.tape.owner}: aten.{name} ran during graph capture; a captured region cannot read a "
                    "device value on the host or size an output from data (the real capture fails too).")
            out = func(*args, **kwargs)
            inputs = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0]
                      if isinstance(t, torch.Tensor)}
            outs = tree_flatten(out)[0]
            fresh = [isinstance(o, torch.Tensor) and o.untyped_storage().data_ptr() not in inputs for o in outs]
            self.tape.ops.append((func, args, kwargs, outs, fresh))
            return out

    return Recorder


class OpTape:
    """The ops of one capture and their replay (see the module docstring). `owner` names the fake in errors."""

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self.ops: list[tuple[Any, ...]] = []
        self._mode: Any = None

    @property
    def capturing(self) -> bool:
        """True between `begin()` and `end()`."""
        return self._mode is not None

    def begin(self) -> None:
        """Start recording (forgets an earlier capture)."""
        if self._mode is not None:
            raise GraphCaptureError(f"{self.owner}: capture already in progress")
        self.ops = []
        self._mode = _mode_class()(self)
        self._mode.__enter__()

    def end(self) -> None:
        """Stop recording."""
        if self._mode is None:
            raise GraphCaptureError(f"{self.owner}: capture_end() without capture_begin()")
        mode, self._mode = self._mode, None
        mode.__exit__(None, None, None)

    def replay(self) -> None:
        """Run the recorded ops again on the captured tensors."""
        from torch.utils._pytree import tree_flatten

        if self._mode is not None:
            raise GraphCaptureError(f"{self.owner}: replay() during capture")
        for func, args, kwargs, outs, fresh in self.ops:
            new = tree_flatten(func(*args, **kwargs))[0]
            for old, value, copy in zip(outs, new, fresh, strict=True):
                if copy:
                    old.copy_(value)

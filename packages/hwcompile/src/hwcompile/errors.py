"""Every error hwcompile raises: one base class, one subclass per kind of problem.

Each message names the bad value, the rule it breaks and what to do instead.
"""

from __future__ import annotations


class HwcompileError(Exception):
    """Base of every hwcompile error."""


class CompileArgumentError(HwcompileError, ValueError, RuntimeError):
    """Arguments `torch.compile` would reject (bad backend type, `mode` and `options` together, ...).

    Also a `RuntimeError`, which is what `torch.compile` itself raises for `mode` + `options`.
    """


class LazyModeError(HwcompileError, RuntimeError):
    """`torch.compile` was asked for on Gaudi while it runs in lazy mode (`hwenv.gaudi.execution_mode`, G2)."""


class CompileBackendMissingError(HwcompileError, ImportError):
    """A platform's own torch.compile backend is not registered and its plugin cannot register it."""


class HpuBackendMissingError(CompileBackendMissingError):
    """The `hpu_backend` torch.compile backend is not registered and the Gaudi plugin cannot register it."""


class PatchError(HwcompileError, ValueError):
    """`patch_torch_compile` was asked to rebind something it cannot (e.g. a module without `compile`)."""

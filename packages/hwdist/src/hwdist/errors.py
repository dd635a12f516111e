"""Every error hwdist raises: one base class, one subclass per kind of failure.

Each message names the bad value, the rule it breaks and the fix.
"""

from __future__ import annotations


class HwdistError(Exception):
    """Base of every hwdist error."""


class BackendUnavailableError(HwdistError, ImportError):
    """The collective backend for this device cannot be used here (missing build or plugin)."""


class BackendMismatchError(HwdistError, ValueError):
    """A backend was asked for that does not fit the device, or differs from the running group."""


class DistEnvError(HwdistError, ValueError):
    """RANK / LOCAL_RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT are missing or inconsistent."""


class NotInitializedError(HwdistError, RuntimeError):
    """A collective was called before `hwdist.init()`."""


class CollectiveError(HwdistError, RuntimeError):
    """A collective failed: a peer rank exited, or the context's timeout passed."""


class LaunchError(HwdistError, ValueError):
    """`hwdist launch` arguments that cannot make a valid torchrun command."""


class BenchError(HwdistError, ValueError):
    """`hwdist bench` arguments that cannot be measured (bad size list, dtype, op)."""


class GaudiWorldError(DistEnvError):
    """A world size or module-ID group on part of a Gaudi server that Intel does not support (G8)."""


class CollectiveArgumentError(HwdistError, ValueError):
    """A collective's local input is unusable (wrong device, unknown op, indivisible shape)."""


class CollectiveMismatchError(CollectiveArgumentError):
    """Ranks passed different dtypes, shapes or operations to the same collective."""

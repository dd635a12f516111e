"""hwdist: collectives on xccl / hccl / nccl (NVIDIA, and RCCL on ROCm) / gloo, process groups
from torchrun, a launcher and a bandwidth benchmark. Importing it does not import torch. See README.md.

Every public name is loaded from its submodule on first use (PEP 562), as in hwenv, so
`hwdist --help` and `import hwdist` load only what they use (issue 29: start-up).
"""

from __future__ import annotations

import importlib

__version__ = "0.2.0"

#: Public name -> the submodule that defines it.
_EXPORTS: dict[str, str] = {
    **dict.fromkeys(("BackendChoice", "backend_for", "ddp_backend"), "backend"),
    **dict.fromkeys(("all_gather", "all_gather_object", "all_reduce", "barrier", "broadcast", "reduce_scatter"),
                    "collectives"),
    **dict.fromkeys(("DEFAULT_TIMEOUT", "DistContext", "current", "init", "is_initialized", "shutdown"), "context"),
    **dict.fromkeys(("LaunchEnv", "read_launch_env"), "env"),
    **dict.fromkeys((
        "BackendMismatchError", "BackendUnavailableError", "BenchError", "CollectiveArgumentError",
        "CollectiveError", "CollectiveMismatchError", "DistEnvError", "GaudiWorldError", "HwdistError",
        "LaunchError", "NotInitializedError"), "errors"),
    "check_gaudi_world": "gaudi_world",
    **dict.fromkeys(("LaunchPlan", "launch_command", "plan_launch"), "launch"),
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str) -> object:
    """Load a public name from its submodule on first use."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'hwdist' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))

"""hwdist: collectives on xccl / hccl / nccl (NVIDIA, and RCCL on ROCm) / gloo, process groups
from torchrun, a launcher and a bandwidth benchmark. Importing it does not import torch. See README.md."""

from .backend import BackendChoice, backend_for, ddp_backend
from .collectives import (
    all_gather,
    all_gather_object,
    all_reduce,
    barrier,
    broadcast,
    reduce_scatter,
)
from .context import DEFAULT_TIMEOUT, DistContext, current, init, is_initialized, shutdown
from .env import LaunchEnv, read_launch_env
from .errors import (
    BackendMismatchError,
    BackendUnavailableError,
    BenchError,
    CollectiveArgumentError,
    CollectiveError,
    CollectiveMismatchError,
    DistEnvError,
    GaudiWorldError,
    HwdistError,
    LaunchError,
    NotInitializedError,
)
from .gaudi_world import check_gaudi_world
from .launch import LaunchPlan, launch_command, plan_launch

__version__ = "0.2.0"

__all__ = [
    "BackendChoice", "BackendMismatchError", "BackendUnavailableError", "BenchError", "CollectiveArgumentError",
    "CollectiveError", "CollectiveMismatchError", "DEFAULT_TIMEOUT", "DistContext", "DistEnvError",
    "GaudiWorldError", "HwdistError", "LaunchEnv", "LaunchError", "LaunchPlan", "NotInitializedError", "all_gather",
    "all_gather_object", "all_reduce", "backend_for", "barrier", "broadcast", "check_gaudi_world", "current",
    "ddp_backend", "init", "is_initialized", "launch_command", "plan_launch", "read_launch_env", "reduce_scatter", "shutdown",
    "__version__",
]

"""hwcompile: `torch.compile` that routes to `hpu_backend` on Gaudi, for our calls and everyone else's.

`route_backend` decides, `compile` compiles, `patch_torch_compile` routes other people's
`torch.compile` calls, `training_arguments` gives Trainer's keywords. Importing this package
changes nothing and does not import torch. See README.md.
"""

from .compiling import compile, original_torch_compile
from .errors import (
    CompileArgumentError,
    HpuBackendMissingError,
    HwcompileError,
    LazyModeError,
    PatchError,
)
from .gaudi import check_eager_mode, ensure_hpu_backend, hpu_backend_registered, lazy_mode
from .patch import CompilePatch, is_patched, is_transformers_wrapper, patch_torch_compile
from .routing import (
    GAUDI_BACKENDS,
    HPU_BACKEND,
    CompileDecision,
    reset_warnings,
    route_backend,
    routing_table,
    routing_table_markdown,
)
from .training import training_arguments

__version__ = "0.1.0"

__all__ = [
    "CompileArgumentError", "CompileDecision", "CompilePatch", "GAUDI_BACKENDS", "HPU_BACKEND",
    "HpuBackendMissingError", "HwcompileError", "LazyModeError", "PatchError", "check_eager_mode", "compile",
    "ensure_hpu_backend", "hpu_backend_registered", "is_patched", "is_transformers_wrapper", "lazy_mode",
    "original_torch_compile", "patch_torch_compile", "reset_warnings", "route_backend", "routing_table",
    "routing_table_markdown", "training_arguments", "__version__",
]

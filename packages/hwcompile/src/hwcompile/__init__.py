"""hwcompile: `torch.compile` that routes to `hpu_backend` on Gaudi, for our calls and everyone else's.

`route_backend` decides (from the device's `hwenv` platform), `compile` compiles,
`patch_torch_compile` routes other people's `torch.compile` calls (beside Transformers' own
Gaudi wrapper, in either order), `training_arguments` gives Trainer's keywords. Importing this package
changes nothing and does not import torch. See README.md.
"""

from .cache import PersistentCache, cache_root, compile_cache_dir, enable_persistent_cache
from .compiling import (
    TORCH_COMPILE_KEYWORDS,
    compile,
    original_torch_compile,
    torch_compile_function,
    torch_compile_keywords,
)
from .errors import (
    CompileArgumentError,
    CompileBackendMissingError,
    HpuBackendMissingError,
    HwcompileError,
    LazyModeError,
    PatchError,
)
from .gaudi import (
    check_compile_mode,
    check_eager_mode,
    ensure_backend,
    ensure_hpu_backend,
    gaudi_mode,
    hpu_backend_registered,
    lazy_mode,
)
from .patch import CompilePatch, is_patched, is_transformers_wrapper, patch_torch_compile
from .routing import (
    GAUDI_BACKENDS,
    HPU_BACKEND,
    CompileDecision,
    own_backend,
    reset_warnings,
    route_backend,
    routing_table,
    routing_table_markdown,
)
from .training import training_arguments

__version__ = "0.2.0"

__all__ = [
    "CompileArgumentError", "CompileBackendMissingError", "CompileDecision", "CompilePatch", "GAUDI_BACKENDS",
    "PersistentCache", "cache_root", "compile_cache_dir", "enable_persistent_cache",
    "HPU_BACKEND", "HpuBackendMissingError", "HwcompileError", "LazyModeError", "PatchError",
    "TORCH_COMPILE_KEYWORDS", "check_compile_mode", "check_eager_mode", "compile", "ensure_backend",
    "ensure_hpu_backend", "gaudi_mode", "hpu_backend_registered", "is_patched", "is_transformers_wrapper",
    "lazy_mode", "original_torch_compile", "own_backend", "patch_torch_compile", "reset_warnings",
    "route_backend", "routing_table", "routing_table_markdown", "torch_compile_function",
    "torch_compile_keywords", "training_arguments", "__version__",
]

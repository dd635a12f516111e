"""hwattn: the right attention backend and hub kernels for each device, with the reason. See README.md.

Importing hwattn imports neither torch, transformers nor kernels; nothing downloads.
"""

from .applied import kernelized_layers
from .causal import (
    CAUSAL_SDPA,
    causal_sdpa_mask,
    is_causal_sdpa_registered,
    register_causal_sdpa,
    unregister_causal_sdpa,
)
from .environment import (
    AttentionEnvironment,
    current_environment,
    flash_packages_installed,
    kernels_available,
)
from .errors import (
    AcceleratorTypeError,
    AttentionUnsupportedError,
    HwattnError,
    KernelMappingError,
    KernelsInternalsError,
    KernelsMissingError,
    KernelsUnsupportedError,
    KernelTrustError,
    KernelUnavailableError,
    KindNotCoveredError,
    ModelAttentionError,
    ShapeError,
    UnknownAttentionError,
)
from .gqa import native_gqa, native_gqa_reason
from .kernel_map import (
    TRUSTED_KERNEL_ORGS,
    check_trust,
    device_keys,
    kernel_mapping,
    registered_layers,
    validate_mapping,
)
from .loading import for_device, load_kernel, load_kwargs, local_kernel_hint
from .model_support import ModelSupport, model_support
from .names import FLASH_KERNEL_REPO, check_name, is_kernel_string, valid_names
from .plan import KernelPlan, LayerKernel, default_kernels, kernel_plan
from .resolve import AttentionChoice, resolve_attention
from .sdpa import eager_attention, repeat_kv, sdpa, uses_native_gqa
from .table import capability_table, decision_table, software_table

__version__ = "0.2.0"

__all__ = [
    "CAUSAL_SDPA", "causal_sdpa_mask", "is_causal_sdpa_registered", "register_causal_sdpa", "unregister_causal_sdpa",
    "AcceleratorTypeError", "AttentionChoice", "capability_table", "AttentionEnvironment", "AttentionUnsupportedError",
    "FLASH_KERNEL_REPO", "HwattnError", "KernelMappingError", "KernelPlan", "KernelTrustError", "KernelUnavailableError",
    "TRUSTED_KERNEL_ORGS", "check_trust",
    "KernelsInternalsError", "KernelsMissingError", "KernelsUnsupportedError", "KindNotCoveredError", "ModelAttentionError", "LayerKernel", "ShapeError", "UnknownAttentionError",
    "check_name", "current_environment", "decision_table", "default_kernels", "device_keys", "eager_attention",
    "flash_packages_installed", "for_device", "kernelized_layers", "is_kernel_string", "kernel_mapping", "kernel_plan", "kernels_available",
    "load_kernel", "load_kwargs", "ModelSupport", "model_support", "local_kernel_hint", "native_gqa", "native_gqa_reason", "registered_layers",
    "repeat_kv", "resolve_attention", "sdpa", "software_table", "uses_native_gqa", "valid_names",
    "validate_mapping", "__version__",
]

"""hwenv: which accelerator is here, how many, and which ones a run may use.

Installs and imports without torch; probes import torch lazily. See README.md.
"""

from .accelerator import OVERRIDE_VARIABLE, Accelerator, detect
from .affinity import AffinityEntry, format_affinity_mask, parse_affinity_mask
from .doctor import Problem, Report, diagnose
from .errors import (
    AffinityMaskError,
    DeviceOverrideError,
    GaudiGroupError,
    HlSmiParseError,
    HwenvError,
    PlatformConflictError,
    PlatformError,
    PluginMissingError,
    SelectionError,
)
from .gaudi import (
    SUPPORTED_PARTIAL_GROUPS,
    HlSmiRow,
    check_group,
    index_to_module,
    module_to_index,
    parse_hl_smi_csv,
    read_hl_smi,
)
from .platforms import Platform, get_platform, platforms, register_platform
from .probes import ProbeResult, run_probe
from .selection import Selection, current_selection, select
from .versions import (
    accelerate_sees_gaudi,
    at_least,
    installed_version,
    library_versions,
    parse_version,
)

__version__ = "0.1.0"


def __getattr__(name: str):
    """`DETECTION_ORDER` and `KINDS` are read from the platform registry (plug-ins included)."""
    if name in ("DETECTION_ORDER", "KINDS"):
        from . import kinds

        return getattr(kinds, name)
    raise AttributeError(f"module 'hwenv' has no attribute {name!r}")

__all__ = [
    "Accelerator", "AffinityEntry", "AffinityMaskError", "DETECTION_ORDER", "DeviceOverrideError",
    "GaudiGroupError", "HlSmiParseError", "HlSmiRow", "HwenvError", "KINDS", "OVERRIDE_VARIABLE",
    "Platform", "PlatformConflictError", "PlatformError", "PluginMissingError", "get_platform", "platforms",
    "register_platform", "Problem", "ProbeResult", "Report", "SUPPORTED_PARTIAL_GROUPS", "Selection",
    "SelectionError", "accelerate_sees_gaudi", "at_least", "check_group", "current_selection", "detect",
    "diagnose", "format_affinity_mask", "index_to_module", "installed_version", "module_to_index",
    "parse_affinity_mask", "parse_hl_smi_csv", "parse_version", "read_hl_smi", "run_probe", "select",
    "library_versions", "__version__",
]

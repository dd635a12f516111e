"""hwenv: which accelerator is here, how many, and which ones a run may use.

Installs and imports without torch; probes import torch lazily. Every public name is loaded on
first use (PEP 562), so `import hwenv` costs almost nothing. See README.md.
"""

from __future__ import annotations

import importlib

__version__ = "0.2.0"

#: Public name -> the submodule that defines it.
_EXPORTS: dict[str, str] = {
    # accelerator
    "Accelerator": "accelerator",
    "OVERRIDE_VARIABLE": "accelerator",
    "detect": "accelerator",
    # affinity
    "AffinityEntry": "affinity",
    "format_affinity_mask": "affinity",
    "parse_affinity_mask": "affinity",
    # doctor
    "Problem": "doctor",
    "Report": "doctor",
    "diagnose": "doctor",
    # environment a run needs (per platform: PT_ENABLE_INT64_SUPPORT on Gaudi where supported)
    "run_environment": "environment",
    # Hub kernels: when Transformers fetches them by itself, and offline (issue 41.9)
    "HubKernels": "hub_kernels",
    "hub_kernels_status": "hub_kernels",
    # errors
    "AcceleratorFieldError": "errors",
    "AffinityMaskError": "errors",
    "DeviceHierarchyError": "errors",
    "DeviceOverrideError": "errors",
    "GaudiFlagError": "errors",
    "GaudiGroupError": "errors",
    "GaudiModulePinError": "errors",
    "HlSmiParseError": "errors",
    "HwenvError": "errors",
    "PlatformConflictError": "errors",
    "PlatformError": "errors",
    "PluginMissingError": "errors",
    "SelectionError": "errors",
    # gaudi
    "GAUDI_GENERATIONS": "gaudi",
    "GaudiMode": "gaudi",
    "execution_mode": "gaudi",
    "int64_status": "gaudi",
    "modules_for_processes": "gaudi",
    "GaudiGeneration": "gaudi",
    "generation_of": "gaudi",
    "HlSmiRow": "gaudi",
    "SUPPORTED_PARTIAL_GROUPS": "gaudi",
    "check_group": "gaudi",
    "index_to_module": "gaudi",
    "module_to_index": "gaudi",
    "parse_hl_smi_csv": "gaudi",
    "read_hl_smi": "gaudi",
    "validate_gaudi_flags": "gaudi",
    # hierarchy (Level Zero, ZE_FLAT_DEVICE_HIERARCHY)
    "DeviceHierarchy": "hierarchy",
    "parse_hierarchy": "hierarchy",
    "read_hierarchy": "hierarchy",
    # platforms
    "Platform": "platforms",
    "get_platform": "platforms",
    "platforms": "platforms",
    "register_platform": "platforms",
    # probes
    "ProbeResult": "probes",
    "run_probe": "probes",
    # selection
    "Selection": "selection",
    "current_selection": "selection",
    "select": "selection",
    # validation (what hwrun plan refuses before work starts)
    "validate_selection": "validation",
    # versions
    "accelerate_sees_gaudi": "versions",
    "at_least": "versions",
    "installed_version": "versions",
    "library_versions": "versions",
    "parse_version": "versions",
    # the platform registry's kinds, in detection order (plug-ins included)
    "DETECTION_ORDER": "kinds",
    "KINDS": "kinds",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str) -> object:
    """Load a public name from its submodule on first use."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'hwenv' has no attribute {name!r}")
    loaded = importlib.import_module(f".{module}", __name__)
    # `hwenv.platforms` is the platforms package itself, which, called, lists the platforms
    value = loaded if name == "platforms" else getattr(loaded, name)
    if name not in ("DETECTION_ORDER", "KINDS"):  # those follow the registry; the rest never change
        globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))

"""Every error hwenv raises: one base class, one subclass per kind of bad input.

Each message names the bad value, the rule it breaks and what to do instead.
"""

from __future__ import annotations


class HwenvError(Exception):
    """Base of every hwenv error."""


class DeviceOverrideError(HwenvError, ValueError):
    """`HWENV_DEVICE` names an unknown kind, or a kind that is not usable here."""


class AcceleratorFieldError(HwenvError, ValueError):
    """An `Accelerator` built with a field of the wrong type or out of range (`count='2'`, `count=-1`)."""


class AffinityMaskError(HwenvError, ValueError):
    """A `ZE_AFFINITY_MASK` value that Level Zero would not accept."""


class GaudiGroupError(HwenvError, ValueError):
    """A Gaudi device group Intel does not support on part of a server (G8)."""


class HlSmiParseError(HwenvError, ValueError):
    """`hl-smi -Q index,module_id -f csv` output that cannot be read."""


class SelectionError(HwenvError, ValueError):
    """A device selection that cannot be built (bad list, wrong kind, conflicting variables)."""


class PluginMissingError(HwenvError, ImportError):
    """A device's PyTorch plugin (e.g. `habana_frameworks`) is not installed."""


class PlatformError(HwenvError, ValueError):
    """An unknown device kind, a duplicate or broken platform plug-in."""


class PlatformConflictError(HwenvError, RuntimeError):
    """Two accelerator platforms both claim this machine; `HWENV_DEVICE` must choose."""


class DeviceHierarchyError(HwenvError, ValueError):
    """A `ZE_FLAT_DEVICE_HIERARCHY` value Level Zero does not know (it is not FLAT, COMPOSITE or COMBINED)."""


class GaudiModulePinError(HwenvError, ValueError):
    """`HLS_MODULE_ID` (the Gaudi bridge's per-process module pin) is malformed or conflicts with the run."""


class GaudiFlagError(HwenvError, ValueError):
    """`PT_HPU_LAZY_MODE` / `PT_ENABLE_INT64_SUPPORT` set to a value the Gaudi bridge does not accept."""

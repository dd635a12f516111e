"""Every error hwattn raises: one base class, one subclass per kind of bad input.

Each message names the bad value, the rule it breaks and what to do instead. Errors also
subclass the builtin Transformers raises for the same input (`ValueError`, `ImportError`).
"""

from __future__ import annotations


class HwattnError(Exception):
    """Base of every hwattn error."""


class UnknownAttentionError(HwattnError, ValueError):
    """An `attn_implementation` name Transformers does not accept (typo, `None`, not a string)."""


class AttentionUnsupportedError(HwattnError, ValueError):
    """A valid attention implementation that cannot run on the given device (e.g. FA3 on XPU, X8)."""


class KernelsMissingError(HwattnError, ImportError):
    """The `kernels` package is needed (hub attention kernel or `use_kernels`) but is not usable."""


class KernelMappingError(HwattnError, ValueError):
    """A kernel mapping `KernelConfig` would reject: bad device key, repo id or layer name."""


class KernelTrustError(KernelMappingError):
    """A kernel mapping naming a repository outside the allowed organisations, or asking for `trust_remote_code`
    that the caller did not pass."""


class KernelUnavailableError(HwattnError, ValueError):
    """A hub kernel could not be loaded (offline, Hub unreachable, no build for this device)."""


class ShapeError(HwattnError, ValueError):
    """Query/key/value tensors whose shapes do not make an attention call."""


class AcceleratorTypeError(HwattnError, TypeError):
    """Something other than an `hwenv.Accelerator` was passed where one is needed."""


class KernelsUnsupportedError(HwattnError, ValueError):
    """`use_kernels` / a kernel mapping asked for on a device that hub kernels do not serve (Gaudi)."""


class KindNotCoveredError(HwattnError, ValueError):
    """A device kind (a plug-in platform) without a row in one of hwattn's capability tables."""


class KernelsInternalsError(HwattnError, ImportError):
    """The installed `kernels` no longer has an internal `kernel_plan` reads (it moved); names version and window."""


class ModelAttentionError(AttentionUnsupportedError):
    """An attention backend the model class does not declare (`_supports_sdpa`, ...), found before loading."""

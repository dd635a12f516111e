"""Device platforms: one frozen `Platform` per kind, a registry with plug-ins, and detection.

    >>> from hwenv.platforms import get_platform
    >>> get_platform("xpu").dist_backend
    'xccl'
"""

import sys
import types

from .base import GRAPH_APIS, SELECTION_GRAMMARS, Platform
from .registry import (
    ENTRY_POINT_GROUP,
    get_platform,
    kinds,
    origin_of,
    platforms,
    plugin_errors,
    register,
    reset,
    unregister,
)
from .registry import (
    register as register_platform,
)

__all__ = [
    "ENTRY_POINT_GROUP", "GRAPH_APIS", "Platform", "SELECTION_GRAMMARS", "get_platform", "kinds",
    "origin_of", "platforms", "plugin_errors", "register", "register_platform", "reset", "unregister",
]


class _CallablePackage(types.ModuleType):
    """`hwenv.platforms` is this package and, called, the registered platforms: `hwenv.platforms()`.

    Python binds a loaded subpackage over a parent attribute of the same name, so the package
    itself answers the call that `hwenv.platforms()` promises.
    """

    def __call__(self) -> tuple[Platform, ...]:
        return platforms()


sys.modules[__name__].__class__ = _CallablePackage

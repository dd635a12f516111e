"""`run_environment`: the variables a run on a device kind needs set, asked of its platform (`Platform.run_env`)."""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from .platforms import get_platform

if TYPE_CHECKING:
    from .accelerator import Accelerator

NONE_NEEDED = "no variables needed on this device"


def run_environment(accelerator: Accelerator | str, environ: Mapping[str, str] | None = None) -> tuple[dict[str, str], str]:
    """(variables, reason) a run on `accelerator` (an `Accelerator` or a kind) needs set, read in `environ`.

    The platform decides (`Platform.run_env`, "module:function"); a platform without one needs none.
    Gaudi: `PT_ENABLE_INT64_SUPPORT=1` only in eager mode on Gaudi 2 or newer (bridge `env_flags.yaml`).
    """
    kind = accelerator if isinstance(accelerator, str) else accelerator.kind
    names = () if isinstance(accelerator, str) else tuple(accelerator.names)
    platform = get_platform(kind)
    if platform.run_env is None:
        return {}, NONE_NEEDED
    module, _, function = platform.run_env.partition(":")
    decide = getattr(importlib.import_module(module), function)
    return decide(os.environ if environ is None else environ, names)

"""The Gaudi variables a run needs set, by the bridge's own rules (`Platform.run_env` of `hpu`).

`PT_ENABLE_INT64_SUPPORT` (gaudi-pytorch-bridge 1.19 `scripts/env_flags.yaml`: "supported only for
non-lazy mode (`PT_HPU_LAZY_MODE=0`) and Gaudi2 or newer") is written only where it is supported: in
eager mode on Gaudi 2 or newer (where eager mode turns it on by default anyway, so writing `1` only
makes Transformers' int64 token ids explicit, as its Gaudi CI does, G4). In lazy mode and on Gaudi 1
it is not written, and the reason says why (issue 41.5).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from .int64 import int64_status
from .mode import execution_mode
from .variables import INT64_VARIABLE


def run_env(environ: Mapping[str, str] | None = None, device_names: Sequence[str] = (),
            *, plugin_version: str | None = None) -> tuple[dict[str, str], str]:
    """(variables to set, reason) for a Gaudi run in `environ` (default `os.environ`) on `device_names`.

    The mode is read from `environ`'s `PT_HPU_LAZY_MODE` and the installed plugin's default
    (`execution_mode`); an unknown generation (no names) gets the newest generation's rules.
    """
    env = os.environ if environ is None else environ
    mode = execution_mode(env, plugin_version=plugin_version)
    status = int64_status(env, device_name=device_names[0] if device_names else None, mode=mode)
    if status.supported:
        return {INT64_VARIABLE: "1"}, f"{INT64_VARIABLE}=1: token ids are int64 (G4); {status.reason}"
    return {}, f"{INT64_VARIABLE} not set: {status.reason}"

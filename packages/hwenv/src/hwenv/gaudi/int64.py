"""`PT_ENABLE_INT64_SUPPORT` as the bridge reads it (gaudi-pytorch-bridge 1.19, INTEL.md S8; FACTS.md G4).

- `scripts/env_flags.yaml`: "supported only for non-lazy mode (`PT_HPU_LAZY_MODE=0`) and Gaudi2
  or newer"; default false in lazy mode, true in eager mode.
- `common/eager/utils.cpp` `IsInt64Supported`: true by default, false on a device named "GAUDI";
  a set flag wins. `common/lazy/utils.cpp`: the flag's value (default false).
- `backend/synapse_helpers/env_flags.cpp` `parse_env_bool`: "1"/"true"/"0"/"false" in any case;
  an empty value is unset; anything else stops the process ("couldn't be converted properly").

Without int64, int64 tensors are cast to int32 on the device (the yaml's words); Transformers'
token ids are int64 (G4).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from .generations import GaudiGeneration, generation_of
from .mode import GaudiMode, execution_mode
from .variables import INT64_VARIABLE

_TRUE = ("1", "true")
_FALSE = ("0", "false")


@dataclass(frozen=True)
class Int64Status:
    """What int64 on Gaudi will be for a run: `supported` here, `enabled` by the bridge, and why.

    `value` is `PT_ENABLE_INT64_SUPPORT` as found (None when unset or empty); `malformed` is True
    when the bridge would refuse it. `problem` is True only where int64 is supported, needed
    and switched off.
    """

    supported: bool
    enabled: bool
    value: str | None
    malformed: bool
    reason: str

    @property
    def problem(self) -> bool:
        """Int64 is supported here but off (explicitly), so Transformers' int64 ids are cast to int32."""
        return self.supported and not self.enabled and not self.malformed


def parse_flag(value: str | None) -> bool | None:
    """The bridge's bool parsing: True/False, None when unset/empty; `ValueError` for anything else."""
    if value is None or value == "":
        return None
    lowered = value.lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ValueError(value)


def int64_status(
    environ: Mapping[str, str] | None = None,
    *,
    device_name: str | None = None,
    mode: GaudiMode | None = None,
    plugin_version: str | None = None,
) -> Int64Status:
    """Whether int64 is supported and on for `environ` (default `os.environ`) on `device_name`.

    `mode` defaults to `execution_mode(environ, plugin_version=...)`. An unknown device name
    (None included) gets the newest generation's rules (Gaudi2 or newer: supported in eager mode).
    """
    env = os.environ if environ is None else environ
    mode = mode if mode is not None else execution_mode(env, plugin_version=plugin_version)
    generation: GaudiGeneration = generation_of(device_name)
    raw = env.get(INT64_VARIABLE)
    try:
        flag = parse_flag(raw)
    except ValueError:
        return Int64Status(
            False, False, raw, True,
            f"{INT64_VARIABLE}={raw!r} is not 1/true/0/false; the bridge stops with \"couldn't be converted "
            f"properly\" when it reads it",
        )
    value = raw if flag is not None else None
    shown = f"{INT64_VARIABLE}={raw!r}" if flag is not None else f"{INT64_VARIABLE} unset"
    if mode.lazy:
        return Int64Status(
            False, bool(flag), value, False,
            f"int64 is not supported in lazy mode ({mode.reason}): Intel supports {INT64_VARIABLE} only in eager mode "
            f"on Gaudi2 or newer, so int64 tensors are cast to int32 on the device ({shown}); for int64 use eager "
            f"mode ({mode_fix()})",
        )
    if not generation.int64:
        return Int64Status(
            False, bool(flag), value, False,
            f"int64 is not supported on {generation.display_name}: Intel supports {INT64_VARIABLE} only on Gaudi2 "
            f"or newer, so int64 tensors are cast to int32 on the device ({shown})",
        )
    enabled = True if flag is None else flag
    if enabled:
        why = "on by default in eager mode on Gaudi2 or newer" if flag is None else f"on ({shown})"
        return Int64Status(True, True, value, False, f"int64 is {why}")
    return Int64Status(
        True, False, value, False,
        f"{shown} switches int64 off in eager mode on {generation.display_name}, where it is supported and on by "
        f"default: int64 tensors (Transformers' token ids, G4) are cast to int32 on the device",
    )


def mode_fix() -> str:
    """How to choose eager mode."""
    return "PT_HPU_LAZY_MODE=0"

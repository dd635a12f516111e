"""`validate_gaudi_flags`: `PT_HPU_LAZY_MODE` and `PT_ENABLE_INT64_SUPPORT` as the Gaudi bridge accepts them.

Read from gaudi-pytorch-bridge 1.19 (INTEL.md S8), the newest public source:
- `PT_HPU_LAZY_MODE` is read three ways. `torch/utils/internal.py` `is_lazy()` compares the string
  (`!= "0"` -> lazy) and picks the lazy or the eager library; `torch/distributed/hccl/__init__.py`,
  imported by `import habana_frameworks.torch`, runs `int(os.environ.get("PT_HPU_LAZY_MODE", "1"))`
  (so a value that is not an integer, `""` included, fails the plugin import with a ValueError); the
  C++ flag (`scripts/env_flags.yaml`: unsigned, `env_flags.cpp` strtoul) stops the process on a
  syntax error, and reads `2` / `3` as bridge-internal lazy variants (`lazy_kernels.cpp`: flush after
  every op, random flush) that `hpu/graphs.py` and `autoload` (`== "1"`) do not count as lazy. Only
  `"0"` (eager) and `"1"` (lazy) mean the same to all three; `" 0"` or `"00"` load the lazy library
  while hccl and C++ read eager (`device.cpp` then asserts "Wrong PT plugin library loaded").
- `PT_ENABLE_INT64_SUPPORT` is a C++ bool (`env_flags.cpp` `parse_env_bool`): `1`/`true`/`0`/`false`
  in any case; an empty value is the same as unset; anything else stops the process ("couldn't be
  converted properly").
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from ..errors import GaudiFlagError
from .int64 import parse_flag
from .mode import WELL_FORMED_LAZY_VALUES, GaudiMode, execution_mode
from .variables import INT64_VARIABLE, LAZY_MODE_VARIABLE

#: How the accepted values are named in messages.
LAZY_MODE_ACCEPTED = "'0' (eager) or '1' (lazy), or unset for the plugin's default (lazy up to 1.20, eager from 1.21.0)"
INT64_ACCEPTED = "1, true, 0 or false (any case), or unset (eager mode turns int64 on by default on Gaudi2+)"
LAZY_MODE_FIX = f"set {LAZY_MODE_VARIABLE}=0 (eager, needed for torch.compile) or {LAZY_MODE_VARIABLE}=1 (lazy), or unset it"
INT64_FIX = f"set {INT64_VARIABLE}=1 (or true), {INT64_VARIABLE}=0 (or false), or unset it"


def _as_int(value: str) -> int | None:
    try:
        return int(value)  # what hccl/__init__.py does with the value
    except ValueError:
        return None


def lazy_mode_problem(value: str | None) -> str | None:
    """Why the bridge would misread `PT_HPU_LAZY_MODE=value` (None when it is unset, '0' or '1')."""
    if value is None or value in WELL_FORMED_LAZY_VALUES:
        return None
    shown = f"{LAZY_MODE_VARIABLE}={value!r}"
    number = _as_int(value)
    if number is None:
        why = ("`import habana_frameworks.torch` fails: its hccl module runs int() on the value (ValueError), and "
               "the bridge's C++ flag parser stops on it as a syntax error")
        if value == "":
            why = "it is empty, and " + why
    elif number == 0:
        why = ("the bridge reads it two ways: its Python side compares the string (not '0', so it loads the lazy "
               "library) while hccl and the C++ flag read the number 0 (eager), and the plugin stops with 'Wrong PT "
               "plugin library loaded'")
    elif number == 1:
        why = ("the bridge reads it two ways: most of it reads lazy mode, but hpu/graphs.py and autoload compare the "
               "string with '1' and treat the run as not lazy")
    else:
        why = (f"{number} is not a mode: the C++ bridge reads 2 and 3 as internal lazy debugging variants (flush "
               f"after every op, random flush) and anything else as neither mode, while hpu/graphs.py and autoload "
               f"treat every value but '1' as not lazy")
    return f"{shown} is not one the Gaudi bridge accepts ({LAZY_MODE_ACCEPTED}): {why} (gaudi-pytorch-bridge 1.19)"


def int64_problem(value: str | None) -> str | None:
    """Why the bridge would stop on `PT_ENABLE_INT64_SUPPORT=value` (None when accepted, empty or unset)."""
    try:
        parse_flag(value)
    except ValueError:
        return (f"{INT64_VARIABLE}={value!r} is not one the Gaudi bridge accepts ({INT64_ACCEPTED}): its C++ flag "
                f"parser stops the process with \"couldn't be converted properly\" when it reads it "
                f"(gaudi-pytorch-bridge 1.19 env_flags.cpp)")
    return None


def validate_gaudi_flags(environ: Mapping[str, str] | None = None, *, plugin_version: str | None = None) -> GaudiMode:
    """The Gaudi execution mode of `environ` (default `os.environ`); `GaudiFlagError` for a malformed
    `PT_HPU_LAZY_MODE` or `PT_ENABLE_INT64_SUPPORT`, naming the value, the accepted values and the fix.

    An empty `PT_ENABLE_INT64_SUPPORT` is accepted (the bridge reads it as unset); an empty
    `PT_HPU_LAZY_MODE` is not (the plugin import fails on it).
    """
    env = os.environ if environ is None else environ
    problems = []
    lazy = lazy_mode_problem(env.get(LAZY_MODE_VARIABLE))
    if lazy:
        problems.append(f"{lazy}. Fix: {LAZY_MODE_FIX}.")
    int64 = int64_problem(env.get(INT64_VARIABLE))
    if int64:
        problems.append(f"{int64}. Fix: {INT64_FIX}.")
    if problems:
        raise GaudiFlagError(" Also: ".join(problems))
    return execution_mode(env, plugin_version=plugin_version)


__all__ = ["INT64_ACCEPTED", "INT64_FIX", "LAZY_MODE_ACCEPTED", "LAZY_MODE_FIX", "int64_problem",
           "lazy_mode_problem", "validate_gaudi_flags"]

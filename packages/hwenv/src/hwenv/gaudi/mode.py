"""Gaudi lazy vs eager mode, as the installed bridge decides it (INTEL.md S8, S12; FACTS.md G2).

- `PT_HPU_LAZY_MODE` set: the bridge parses it once, at plugin import, as `value != "0"` ->
  lazy. So `"1"`, `"true"`, `" 0"` and `""` all mean lazy; only exactly `"0"` is eager.
- unset: the default of the installed plugin: lazy (1) in Gaudi software 1.20 and older, eager
  (0) from 1.21.0 (HabanaAI/Gaudi-tutorials PR 131, 2025-05-23: "Lazy mode is no longer the
  default execution mode ... since 1.21.0"; huggingface/optimum-habana PRs 1889 and 1921, March-April
  2025, add an explicit `PT_HPU_LAZY_MODE=1` to every lazy example for that release; the public 1.19
  bridge's `scripts/env_flags.yaml` has `default: 1`; Intel's current "Runtime Environment
  Variables" page lists `0`). 1.20.x is still lazy: treating it as eager would compile, turn HPU
  graphs off and export int64 while the bridge runs lazy (issue 41.2).
- the version is read from the `habana-torch-plugin` distribution's metadata
  (`hwenv.versions.installed_version`); when it is unknown (not installed), the current
  default, eager, is assumed and the reason says so.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from ..versions import format_version, installed_version, parse_version
from .variables import LAZY_MODE_VARIABLE, PLUGIN_DISTRIBUTION

#: The newest Gaudi software whose default is lazy mode (PT_HPU_LAZY_MODE=1); later ones default to eager.
LAST_LAZY_DEFAULT = (1, 20)
#: The values hwenv accepts without a doctor warning: the bridge itself treats every value but "0" as lazy.
WELL_FORMED_LAZY_VALUES = ("0", "1")


@dataclass(frozen=True)
class GaudiMode:
    """Gaudi's execution mode: `lazy` (True = lazy, False = eager) and why.

    `value` is `PT_HPU_LAZY_MODE` as found (None when unset); `plugin_version` the
    habana-torch-plugin version the default was read from (None when unknown or not needed).
    """

    lazy: bool
    reason: str
    value: str | None = None
    plugin_version: str | None = None

    @property
    def name(self) -> str:
        """`"lazy"` or `"eager"`."""
        return "lazy" if self.lazy else "eager"

    @property
    def malformed(self) -> bool:
        """True when `PT_HPU_LAZY_MODE` is set to something other than "0" or "1" (the bridge reads it as lazy)."""
        return self.value is not None and self.value not in WELL_FORMED_LAZY_VALUES


def default_lazy(plugin_version: str | None) -> bool | None:
    """The plugin's default for an unset `PT_HPU_LAZY_MODE`: True (lazy) up to 1.20, False from 1.21, None if unknown."""
    parsed = parse_version(plugin_version)
    if parsed is None:
        return None
    return parsed[:2] <= LAST_LAZY_DEFAULT


def execution_mode(environ: Mapping[str, str] | None = None, *, plugin_version: str | None = None) -> GaudiMode:
    """Lazy or eager, as the Gaudi bridge would decide it for `environ` (default `os.environ`).

    `plugin_version` defaults to the installed `habana-torch-plugin` version.
    """
    env = os.environ if environ is None else environ
    value = env.get(LAZY_MODE_VARIABLE)
    if value is not None:
        lazy = value != "0"
        if value in WELL_FORMED_LAZY_VALUES:
            why = f"{LAZY_MODE_VARIABLE}={value!r}"
        else:
            why = (f"{LAZY_MODE_VARIABLE}={value!r} is not '0' or '1'; the bridge treats every value but '0' as "
                   f"lazy")
        return GaudiMode(lazy, f"{why} (read once when habana_frameworks.torch is imported)", value)
    if plugin_version is None:
        plugin_version = installed_version(PLUGIN_DISTRIBUTION)
    lazy_default = default_lazy(plugin_version)
    last = format_version(LAST_LAZY_DEFAULT)
    if lazy_default is None:
        return GaudiMode(
            False,
            f"{LAZY_MODE_VARIABLE} is unset and the {PLUGIN_DISTRIBUTION} version is unknown "
            f"({plugin_version or 'not installed'}); assumed a current release, whose default is eager "
            f"(lazy was the default up to {last})",
            None, plugin_version,
        )
    if lazy_default:
        reason = f"{LAZY_MODE_VARIABLE} is unset and {PLUGIN_DISTRIBUTION} {plugin_version} defaults to lazy (<= {last})"
    else:
        reason = f"{LAZY_MODE_VARIABLE} is unset and {PLUGIN_DISTRIBUTION} {plugin_version} defaults to eager (> {last})"
    return GaudiMode(lazy_default, reason, None, plugin_version)

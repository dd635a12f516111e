"""A compile cache that survives reboots: torch's inductor, FX-graph, AOTAutograd and Triton caches under the
user's cache folder instead of torch's default in /tmp (`/tmp/torchinductor_<user>`, cleared on reboot).

torch reads `TORCHINDUCTOR_CACHE_DIR` each time it needs the folder (`torch._inductor.runtime.cache_dir_utils.
cache_dir`), and the FX-graph and AOTAutograd caches are on by default, so pointing that variable at a
persistent folder before the first compile is all it takes. `enable_persistent_cache()` does that explicitly
(never at import), leaves a folder the user chose alone, is idempotent, and `undo()` restores the variables.
"""

from __future__ import annotations

import logging
import os
from collections.abc import MutableMapping
from dataclasses import dataclass, field
from pathlib import Path

logger = logging.getLogger(__name__)

#: Variables torch and Triton read for their cache folders.
INDUCTOR_VARIABLE = "TORCHINDUCTOR_CACHE_DIR"
TRITON_VARIABLE = "TRITON_CACHE_DIR"
#: hwstack's own override of the cache root (else $XDG_CACHE_HOME/hwstack, else ~/.cache/hwstack).
ROOT_VARIABLE = "HWSTACK_CACHE_DIR"
#: The opt-out: `HWSTACK_COMPILE_CACHE=0` (or off/false/no) leaves torch's cache folders as they are.
SWITCH_VARIABLE = "HWSTACK_COMPILE_CACHE"
_OFF = ("0", "off", "false", "no")
_ON = ("", "1", "on", "true", "yes")


def cache_switch(environ: MutableMapping[str, str] | None = None) -> bool:
    """Whether hwstack may move torch's compile caches: False where `HWSTACK_COMPILE_CACHE` is 0/off/false/no;
    `CompileArgumentError` for a value that is neither on nor off."""
    env = os.environ if environ is None else environ
    value = env.get(SWITCH_VARIABLE, "").strip().lower()
    if value in _OFF:
        return False
    if value in _ON:
        return True
    from .errors import CompileArgumentError

    raise CompileArgumentError(f"{SWITCH_VARIABLE}={env[SWITCH_VARIABLE]!r} is neither on nor off: set it to 0 to keep "
                               "torch's default compile cache folder (in /tmp), or unset it for the persistent one.")


def cache_root(environ: MutableMapping[str, str] | None = None) -> Path:
    """hwstack's cache folder: $HWSTACK_CACHE_DIR, else $XDG_CACHE_HOME/hwstack, else ~/.cache/hwstack."""
    env = os.environ if environ is None else environ
    if env.get(ROOT_VARIABLE):
        return Path(env[ROOT_VARIABLE]).expanduser()
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "hwstack"


def compile_cache_dir(torch_version: str, environ: MutableMapping[str, str] | None = None) -> Path:
    """The compile cache of one torch version (artifacts of another version are never reused)."""
    safe = "".join(ch if ch.isalnum() or ch in ".-_" else "_" for ch in torch_version)
    return cache_root(environ) / "compile" / f"torch-{safe}"


@dataclass
class PersistentCache:
    """What `enable_persistent_cache` decided: the folder, whether it already held compiled graphs, why."""

    folder: Path
    warm: bool
    reason: str
    on: bool = True  # False: HWSTACK_COMPILE_CACHE opted out, torch's folders left as they were
    _previous: dict[str, str | None] = field(default_factory=dict, repr=False)
    _environ: MutableMapping[str, str] | None = field(default=None, repr=False)

    def undo(self) -> None:
        """Restore the variables this call set (idempotent: a second call does nothing)."""
        env = os.environ if self._environ is None else self._environ
        while self._previous:
            name, value = self._previous.popitem()
            if value is None:
                env.pop(name, None)
            else:
                env[name] = value


def torch_default_dir() -> Path:
    """torch's own default inductor folder (`<tmp>/torchinductor_<user>`), from torch's own function."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    return Path(default_cache_dir())


def _holds_graphs(folder: Path) -> bool:
    for sub in ("fxgraph", "aotautograd"):
        path = folder / sub
        if path.is_dir() and any(path.iterdir()):
            return True
    return False


def _compile_folder(torch_version: str | None,
                    environ: MutableMapping[str, str]) -> tuple[Path, str, Path | None]:
    """The folder a compile will read, how it was chosen ("off", "yours" or "ours") and hwstack's folder (None
    when off). The one rule `compile_read_dir`, `persistent_cache_warm` and `enable_persistent_cache` share."""
    chosen = environ.get(INDUCTOR_VARIABLE)
    if not cache_switch(environ):  # opted out: torch reads the variable as it is, else its /tmp default
        return (Path(chosen).expanduser() if chosen else torch_default_dir()), "off", None
    if torch_version is None:
        import torch

        torch_version = torch.__version__
    ours = compile_cache_dir(torch_version, environ)
    if chosen and Path(chosen).expanduser() == torch_default_dir():
        chosen = None  # torch writes its /tmp default into the variable on first use: not the user's choice
    if chosen:
        return Path(chosen).expanduser(), "yours", ours
    return ours, "ours", ours


def compile_read_dir(torch_version: str | None = None, environ: MutableMapping[str, str] | None = None) -> Path:
    """The inductor folder a compile will read once `enable_persistent_cache()` has run: under
    `HWSTACK_COMPILE_CACHE=0` torch's own (TORCHINDUCTOR_CACHE_DIR as set, else `<tmp>/torchinductor_<user>`); else
    yours in TORCHINDUCTOR_CACHE_DIR (torch's /tmp default written there counts as unset), else
    `compile_cache_dir()`. Changes nothing."""
    return _compile_folder(torch_version, os.environ if environ is None else environ)[0]


def persistent_cache_warm(torch_version: str | None = None,
                          environ: MutableMapping[str, str] | None = None) -> bool:
    """Whether the folder a compile would read (`compile_read_dir()`, the one `enable_persistent_cache()` picks)
    already holds compiled graphs; changes nothing."""
    return _holds_graphs(compile_read_dir(torch_version, environ))


def enable_persistent_cache(torch_version: str | None = None,
                            environ: MutableMapping[str, str] | None = None) -> PersistentCache:
    """Point torch's inductor and Triton caches at `compile_cache_dir()` unless the user set them already.

    Call it before the first `torch.compile` of the process; `warm` says whether compiled graphs from an
    earlier run are there (then compiling mostly reads them back). The folder is created (mode 0700). A second call
    changes nothing (its `undo` neither); `HWSTACK_COMPILE_CACHE=0` opts out (`on` False, nothing changed, logged).
    The folder is `compile_read_dir()`'s, so `persistent_cache_warm()` looks where this call points.
    """
    env = os.environ if environ is None else environ
    folder, how, ours = _compile_folder(torch_version, env)
    if how == "off":
        reason = f"off: {SWITCH_VARIABLE}={env[SWITCH_VARIABLE]} (torch's folder {folder} kept)"
        logger.info("compile cache %s", reason)
        return PersistentCache(folder, _holds_graphs(folder), reason, on=False, _environ=environ)
    chosen = env.get(INDUCTOR_VARIABLE) if how == "yours" else None
    if how == "yours" and folder == ours:  # an earlier call of this process set it: already on
        warm = _holds_graphs(ours)
        return PersistentCache(ours, warm, f"{ours} (already on in this process; "
                               f"{'warm' if warm else 'cold'})", _environ=environ)
    if how == "yours":
        return PersistentCache(folder, _holds_graphs(folder), f"{INDUCTOR_VARIABLE}={chosen} (yours, kept)",
                               _environ=environ)
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        logger.warning("compile cache: cannot create %s (%s); torch keeps its default folder in /tmp", folder, exc)
        return PersistentCache(folder, False, f"torch's default (could not create {folder}: {exc})",
                               _environ=environ)
    previous: dict[str, str | None] = {INDUCTOR_VARIABLE: env.get(INDUCTOR_VARIABLE)}
    env[INDUCTOR_VARIABLE] = str(folder)
    if not env.get(TRITON_VARIABLE):
        previous[TRITON_VARIABLE] = env.get(TRITON_VARIABLE)
        env[TRITON_VARIABLE] = str(folder / "triton")
    warm = _holds_graphs(folder)
    reason = (f"{folder} ({'warm: compiled graphs from an earlier run are reused' if warm else 'cold: first compile of this torch version here'})")
    return PersistentCache(folder, warm, reason, _previous=previous, _environ=environ)


__all__ = ["INDUCTOR_VARIABLE", "PersistentCache", "ROOT_VARIABLE", "SWITCH_VARIABLE", "TRITON_VARIABLE",
           "cache_root", "cache_switch", "compile_cache_dir", "compile_read_dir", "enable_persistent_cache",
           "persistent_cache_warm"]

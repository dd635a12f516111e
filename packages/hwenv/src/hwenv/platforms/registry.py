"""The registry of platforms: built-in kinds register themselves, installed plug-ins add more.

A plug-in is a distribution with an entry point in the `hwstack.platforms` group whose object
is a `Platform` (or a no-argument callable returning one), as vLLM's `vllm.platform_plugins`:

    [project.entry-points."hwstack.platforms"]
    npu = "hwstack_npu.platform:PLATFORM"

The registry is built on first use (never at import) and refuses two platforms of one kind.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterable

from ..errors import PlatformError
from .base import Platform

ENTRY_POINT_GROUP = "hwstack.platforms"
#: The built-in platform modules, one per kind; each defines `PLATFORM` and `probe()`.
BUILTIN_MODULES = (
    "hwenv.platforms.hpu", "hwenv.platforms.xpu", "hwenv.platforms.rocm",
    "hwenv.platforms.cuda", "hwenv.platforms.mps", "hwenv.platforms.cpu",
)

_registered: dict[str, tuple[Platform, str]] = {}
_plugin_errors: list[str] = []
_loaded = False
_plugins_loaded = False


def _add(platform: Platform, origin: str) -> None:
    if not isinstance(platform, Platform):
        raise PlatformError(f"{origin} gave {platform!r}, not an hwenv.platforms.Platform.")
    if platform.kind in _registered:
        _, first = _registered[platform.kind]
        raise PlatformError(
            f"Two platforms claim the kind {platform.kind!r}: {first} and {origin}. "
            f"Uninstall one of them, or give the plug-in another kind name."
        )
    _registered[platform.kind] = (platform, origin)


def _group_may_be_declared() -> bool:
    """False only when no distribution on `sys.path` declares the entry-point group.

    A scan of the `*.dist-info` / `*.egg-info` `entry_points.txt` files (about 2 ms) that spares
    importing `importlib.metadata` (about 30 ms with its scan) when no plug-in is installed. Where
    distributions could come from elsewhere (a zip or egg on the path, a finder with its own
    `find_distributions`), it answers True and `importlib.metadata` decides.
    """
    for finder in sys.meta_path:
        if hasattr(finder, "find_distributions") and getattr(finder, "__name__", "") != "PathFinder":
            return True
    marker = f"[{ENTRY_POINT_GROUP}]".encode()
    for entry in sys.path:
        folder = entry or "."
        if not os.path.isdir(folder):
            if os.path.exists(folder):  # a zip or an egg file: only importlib.metadata reads those
                return True
            continue
        if folder.lower().endswith(".egg"):
            return True
        try:
            children = os.listdir(folder)
        except OSError:
            continue
        for name in children:
            if not name.lower().endswith((".dist-info", ".egg-info")):
                continue
            try:
                with open(os.path.join(folder, name, "entry_points.txt"), "rb") as handle:
                    if marker in handle.read():
                        return True
            except OSError:
                continue
    return False


def _entry_points() -> Iterable:
    if not _group_may_be_declared():
        return ()
    from importlib.metadata import entry_points

    return entry_points(group=ENTRY_POINT_GROUP)


def _load_plugins() -> None:
    for entry in _entry_points():
        origin = f"plug-in {entry.name!r} ({entry.value}, group {ENTRY_POINT_GROUP})"
        try:
            loaded = entry.load()
            platform = loaded() if callable(loaded) and not isinstance(loaded, Platform) else loaded
        except Exception as error:  # a broken plug-in is reported, never a crash of every hwenv call
            message = f"{origin} failed to load: {type(error).__name__}: {error}"
            import logging  # only for a broken plug-in: logging is not imported at start-up

            logging.getLogger("hwenv.platforms").warning("%s; it is skipped", message)
            _plugin_errors.append(message)
            continue
        _add(platform, origin)


def _ensure_loaded(*, plugins: bool = True) -> None:
    """Register the built-ins on first use, and the plug-ins when `plugins` (an entry-point scan: ~2 ms when no
    distribution declares the group, ~30-50 ms through importlib.metadata when one may)."""
    global _loaded, _plugins_loaded
    if not _loaded:
        _loaded = True
        try:
            for name in BUILTIN_MODULES:
                _add(importlib.import_module(name).PLATFORM, f"built-in {name}")
        except Exception:
            reset()
            raise
    if plugins and not _plugins_loaded:
        _plugins_loaded = True
        _load_plugins()


def register(platform: Platform, *, origin: str = "register()") -> Platform:
    """Add `platform` at run time (tests, notebooks); a second platform of one kind is refused."""
    _ensure_loaded()
    _add(platform, origin)
    return platform


def unregister(kind: str) -> None:
    """Remove a platform added with `register` (built-ins too; use only in tests)."""
    _ensure_loaded()
    _registered.pop(kind, None)


def reset() -> None:
    """Forget every platform and plug-in error; the next use loads built-ins and plug-ins again."""
    global _loaded, _plugins_loaded
    _registered.clear()
    _plugin_errors.clear()
    _loaded = _plugins_loaded = False


def platforms() -> tuple[Platform, ...]:
    """Every registered platform, in detection order (lowest `priority` first; CPU last)."""
    _ensure_loaded()
    return tuple(sorted((p for p, _ in _registered.values()), key=lambda p: (p.priority, p.kind)))


def kinds() -> tuple[str, ...]:
    """The registered kinds, in detection order."""
    return tuple(p.kind for p in platforms())


def get_platform(kind: str) -> Platform:
    """The platform of `kind`; an unknown kind is a `PlatformError` naming the known ones.

    A built-in kind is answered without scanning plug-ins (import stays fast); any other kind
    loads the plug-ins first.
    """
    _ensure_loaded(plugins=False)
    entry = _registered.get(kind) if isinstance(kind, str) else None
    if entry is None:
        _ensure_loaded()
        entry = _registered.get(kind) if isinstance(kind, str) else None
    if entry is None:
        raise PlatformError(
            f"{kind!r} is not a device kind hwenv knows; known kinds are {', '.join(kinds())} "
            f"(a new kind is a plug-in: an entry point in the {ENTRY_POINT_GROUP!r} group)."
        )
    return entry[0]


def origin_of(kind: str) -> str:
    """Where the platform of `kind` came from (`built-in hwenv.platforms.xpu`, a plug-in)."""
    get_platform(kind)
    return _registered[kind][1]


def plugin_errors() -> tuple[str, ...]:
    """Plug-ins that failed to load (reported by `hwenv doctor`)."""
    _ensure_loaded()
    return tuple(_plugin_errors)

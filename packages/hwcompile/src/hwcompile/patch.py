"""`patch_torch_compile()`: route every later `torch.compile` call on Gaudi, ours and everyone else's (G13).

It replaces the `torch.compile` attribute of the `torch` module with a routing wrapper, so it
reaches every call that looks `torch.compile` up when it runs: direct calls, `@torch.compile`
and `@torch.compile(...)` decorators evaluated after patching (in modules imported before or
after), `nn.Module.compile()` and `torch.compiler.compile()` (both call `torch.compile`), and
accelerate/Trainer compiles. It cannot reach what was compiled before patching, nor names
bound with `from torch import compile` before patching unless they are listed in `modules`
(README "What the patch reaches").

Explicit (never at import), idempotent (patching twice wraps once; handles are counted),
reversible (`.undo()` or `with`), thread-safe (one lock), and a no-op where the platform has no
compile backend of its own (everywhere but Gaudi) unless `accel` forces a Gaudi for tests.
It stacks with Transformers' own Gaudi wrapper in either order (`transformers_wrapper`).
"""

from __future__ import annotations

import functools
import logging
import sys
import threading
import types
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import hwenv

from .errors import PatchError
from .layers import is_hwcompile_wrapper, layers
from .routing import AcceleratorLike, _route, _warn_once, own_backend, resolve_accelerator
from .transformers_wrapper import (
    PATCH_MARKER,
    TRANSFORMERS_WRAPPER_NAME,
    FoldTransformersWarning,
    add_fold,
    is_transformers_wrapper,
    remove_fold,
)

logger = logging.getLogger(__name__)

_lock = threading.RLock()

__all__ = ["CompilePatch", "TRANSFORMERS_WRAPPER_NAME", "is_patched", "is_patched_wrapper",
           "is_transformers_wrapper", "patch_torch_compile", "unpatched"]


@dataclass
class _Installed:
    """The one active patch: what was replaced, the wrapper, and how many handles hold it."""

    original: Any
    wrapper: Any
    accel: hwenv.Accelerator
    over_transformers: bool
    fold: FoldTransformersWarning | None = None
    handles: int = 0
    active: bool = True


_installed: _Installed | None = None


def _routed_kwargs(acc: hwenv.Accelerator, kwargs: dict[str, Any]) -> dict[str, Any]:
    from .gaudi import translate_kwargs

    backend = kwargs.get("backend")
    if not (backend is None or isinstance(backend, str) or callable(backend)):
        return kwargs  # let torch.compile raise its own error for a bad backend
    decision = _route(acc, backend, _warn_once)
    out = translate_kwargs(decision.backend, kwargs)
    out["backend"] = decision.backend
    return out


def _make_wrapper(state_box: list[_Installed], original: Any) -> Any:
    @functools.wraps(original)
    def compile(model: Any = None, *args: Any, **kwargs: Any) -> Any:
        state = state_box[0]
        if state.active:
            kwargs = _routed_kwargs(state.accel, kwargs)
        return original(model, *args, **kwargs)

    setattr(compile, PATCH_MARKER, compile)
    return compile


def is_patched_wrapper(function: Any) -> bool:
    """True for a `torch.compile` replacement made by hwcompile."""
    return is_hwcompile_wrapper(function)


def unpatched(function: Any) -> Any:
    """The function under hwcompile's wrapper while that wrapper is active, else `function` itself."""
    with _lock:
        if _installed is not None and function is _installed.wrapper:
            return _installed.original
    return function


def is_patched() -> bool:
    """Whether hwcompile's routing wrapper is active in `torch.compile` now: on top, or under a wrapper
    installed later (Transformers' Gaudi wrapper), so that every call still goes through it.
    """
    import torch

    with _lock:
        return _installed is not None and _installed.active and _installed.wrapper in layers(torch.compile)


@dataclass
class CompilePatch:
    """A handle on the `torch.compile` patch: `.undo()` or leave the `with` block to release it.

    `active` is False when patching was a no-op (off Gaudi); `reason` says what happened.
    """

    active: bool
    reason: str
    accel: hwenv.Accelerator
    over_transformers: bool = False
    _modules: list[tuple[types.ModuleType, Any]] = field(default_factory=list, repr=False)
    _released: bool = field(default=False, repr=False)

    @property
    def original(self) -> Any:
        """The `torch.compile` object the patch replaced (None when the patch is a no-op or released)."""
        with _lock:
            return _installed.original if (self.active and not self._released and _installed) else None

    def undo(self) -> None:
        """Release this handle; the last one restores the very `torch.compile` object that was replaced."""
        global _installed

        with _lock:
            if self._released or not self.active:
                self._released = True
                return
            self._released = True
            state = _installed
            assert state is not None, "a held CompilePatch always has an installed patch"
            for module, previous in reversed(self._modules):
                if getattr(module, "compile", None) is state.wrapper:
                    module.compile = previous
            self._modules.clear()
            state.handles -= 1
            if state.handles > 0:
                return
            state.active = False
            _installed = None
            if state.fold is not None:
                remove_fold(state.fold)
            _restore(state)

    def __enter__(self) -> CompilePatch:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.undo()


def _restore(state: _Installed) -> None:
    """Put back what the patch replaced, only where hwcompile's wrapper is still on top of `torch.compile`."""
    import torch

    if torch.compile is state.wrapper:
        torch.compile = state.original
        logger.info("hwcompile: torch.compile restored to %r", state.original)
        return
    stack = layers(torch.compile)
    if state.wrapper in stack and all(is_transformers_wrapper(layer) for layer in stack[:stack.index(state.wrapper)]):
        logger.info(
            "hwcompile: Transformers' Gaudi wrapper was installed over hwcompile's patch; it is left in place "
            "(it cannot be put back under it) and reroutes by itself again, warning on every call. "
            "hwcompile's wrapper under it now passes every call through unchanged."
        )
        return
    logger.warning(
        "hwcompile: torch.compile was replaced after hwcompile patched it (now %r); left in place. "
        "hwcompile's wrapper under it now passes every call through unchanged.", torch.compile,
    )


def _module(item: types.ModuleType | str) -> types.ModuleType:
    if isinstance(item, types.ModuleType):
        return item
    if isinstance(item, str) and item in sys.modules:
        return sys.modules[item]
    raise PatchError(
        f"modules entry {item!r} is not an imported module; pass module objects or names in sys.modules."
    )


def _rebind(handle: CompilePatch, state: _Installed, items: Iterable[types.ModuleType | str]) -> None:
    targets = [_module(item) for item in items]
    for module in targets:  # check all before changing any
        bound = getattr(module, "compile", None)
        if bound is not state.wrapper and bound is not state.original and not is_transformers_wrapper(bound):
            raise PatchError(
                f"module {module.__name__!r} has compile={bound!r}, which is not torch.compile; only names bound "
                f"with `from torch import compile` can be rebound. Remove it from modules=."
            )
    for module in targets:
        bound = module.compile
        if bound is not state.wrapper:
            handle._modules.append((module, bound))
            module.compile = state.wrapper


def patch_torch_compile(accel: AcceleratorLike = None, *,
                        modules: Iterable[types.ModuleType | str] = ()) -> CompilePatch:
    """Make every later `torch.compile` call route like `hwcompile.compile` (Gaudi only; see module doc).

    `accel=None` detects; pass `Accelerator("hpu")` (or `"hpu"`) to force the patch for tests.
    `modules` lists modules that did `from torch import compile` whose binding should be routed too.
    Raises `LazyModeError` when Gaudi runs lazy and `HpuBackendMissingError` when `hpu_backend`
    cannot be registered. While held, Transformers' per-call Gaudi warning is folded into
    hwcompile's once-per-backend one.
    """
    global _installed
    import torch

    from .gaudi import check_compile_mode, ensure_backend

    acc = resolve_accelerator(accel)
    platform = acc.platform
    modules = list(modules)
    if own_backend(platform) is None:
        reason = (f"{acc.kind}: {platform.display_name} runs torch's backends, torch.compile left as it is "
                  f"(routing applies only where the platform has its own compile backend, such as Gaudi, G13).")
        logger.info("hwcompile.patch_torch_compile: %s", reason)
        return CompilePatch(active=False, reason=reason, accel=acc)
    check_compile_mode(platform)
    ensure_backend(platform)
    with _lock:
        state = _installed
        if state is None:
            original = torch.compile
            box: list[_Installed] = []
            wrapper = _make_wrapper(box, original)
            over = any(is_transformers_wrapper(layer) for layer in layers(original))
            state = _Installed(original, wrapper, acc, over)
            state.fold = FoldTransformersWarning(lambda backend: _warn_once(backend, platform))
            box.append(state)
            torch.compile = wrapper
            add_fold(state.fold)
            _installed = state
            how = "patched torch.compile"
            if state.over_transformers:
                how += (" over Transformers' Gaudi wrapper (hwcompile routes first and passes "
                        f"backend={platform.compile_backend!r}, so Transformers neither reroutes nor warns again)")
        else:
            how = "torch.compile already patched; reusing the same wrapper"
            if torch.compile is state.original:  # someone put the original back under our feet
                torch.compile = state.wrapper
                logger.warning("hwcompile: torch.compile had been reset to the original behind the patch; "
                               "re-installed the routing wrapper")
                how += " (re-installed: torch.compile had been reset to the original)"
        handle = CompilePatch(active=True, reason=f"{acc.kind}: {how} (G13).", accel=acc,
                              over_transformers=state.over_transformers)
        try:
            _rebind(handle, state, modules)
        except PatchError:
            if state.handles == 0:  # this call installed the patch: take it back out
                state.active = False
                torch.compile = state.original
                if state.fold is not None:
                    remove_fold(state.fold)
                _installed = None
            raise
        state.handles += 1
    logger.info("hwcompile.patch_torch_compile: %s", handle.reason)
    return handle

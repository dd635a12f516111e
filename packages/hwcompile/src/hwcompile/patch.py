"""`patch_torch_compile()`: route every later `torch.compile` call on Gaudi, ours and everyone else's (G13).

It replaces the `torch.compile` attribute of the `torch` module with a routing wrapper, so it
reaches every call that looks `torch.compile` up when it runs: direct calls, `@torch.compile`
and `@torch.compile(...)` decorators evaluated after patching (in modules imported before or
after), `nn.Module.compile()` and `torch.compiler.compile()` (both call `torch.compile`), and
accelerate/Trainer compiles. It cannot reach what was compiled before patching, nor names
bound with `from torch import compile` before patching unless they are listed in `modules`
(README "What the patch reaches").

Explicit (never at import), idempotent (patching twice wraps once; handles are counted),
reversible (`.undo()` or `with`), thread-safe (one lock), and a no-op off Gaudi unless
`accel` forces a Gaudi for tests.
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
from .routing import AcceleratorLike, _route, _warn_once, resolve_accelerator

logger = logging.getLogger(__name__)

_lock = threading.RLock()

#: transformers' Gaudi wrapper: `is_torch_hpu_available()` replaces `torch.compile` with a function
#: of this name (transformers/utils/import_utils.py) that reroutes and warns on every call.
TRANSFORMERS_WRAPPER_NAME = "hpu_backend_compile"


def is_transformers_wrapper(function: Any) -> bool:
    """True for the `torch.compile` replacement transformers installs on Gaudi."""
    return (getattr(function, "__name__", None) == TRANSFORMERS_WRAPPER_NAME
            and str(getattr(function, "__module__", "")).startswith("transformers"))


@dataclass
class _Installed:
    """The one active patch: what was replaced, the wrapper, and how many handles hold it."""

    original: Any
    wrapper: Any
    accel: hwenv.Accelerator
    over_transformers: bool
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

    compile.__hwcompile_patch__ = True  # type: ignore[attr-defined]
    return compile


def is_patched_wrapper(function: Any) -> bool:
    """True for a `torch.compile` replacement made by hwcompile."""
    return getattr(function, "__hwcompile_patch__", False) is True


def unpatched(function: Any) -> Any:
    """The function under hwcompile's wrapper while that wrapper is active, else `function` itself."""
    with _lock:
        if _installed is not None and function is _installed.wrapper:
            return _installed.original
    return function


def is_patched() -> bool:
    """Whether hwcompile's routing wrapper is installed as `torch.compile` now."""
    import torch

    with _lock:
        return _installed is not None and torch.compile is _installed.wrapper


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
        import torch

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
            if torch.compile is state.wrapper:
                torch.compile = state.original
                logger.info("hwcompile: torch.compile restored to %r", state.original)
            else:
                logger.warning(
                    "hwcompile: torch.compile was replaced after hwcompile patched it (now %r); left in place. "
                    "hwcompile's wrapper under it now passes every call through unchanged.", torch.compile,
                )

    def __enter__(self) -> CompilePatch:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.undo()


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
    Raises `LazyModeError` under `PT_HPU_LAZY_MODE=1` and `HpuBackendMissingError` when
    `hpu_backend` cannot be registered.
    """
    global _installed
    import torch

    acc = resolve_accelerator(accel)
    modules = list(modules)
    if acc.kind != "hpu":
        reason = f"{acc.kind}: not a Gaudi, torch.compile left as it is (routing applies only on Gaudi, G13)."
        logger.info("hwcompile.patch_torch_compile: %s", reason)
        return CompilePatch(active=False, reason=reason, accel=acc)
    from .gaudi import check_eager_mode, ensure_hpu_backend

    check_eager_mode()
    ensure_hpu_backend()
    with _lock:
        state = _installed
        if state is None:
            original = torch.compile
            box: list[_Installed] = []
            wrapper = _make_wrapper(box, original)
            state = _Installed(original, wrapper, acc, is_transformers_wrapper(original))
            box.append(state)
            torch.compile = wrapper
            _installed = state
            how = "patched torch.compile"
            if state.over_transformers:
                how += (" over transformers' Gaudi wrapper (hwcompile routes first and passes "
                        "backend='hpu_backend', so transformers neither reroutes nor warns again)")
        else:
            how = "torch.compile already patched; reusing the same wrapper"
            if torch.compile is state.original:  # someone put the original back under our feet
                torch.compile = state.wrapper
                logger.warning("hwcompile: torch.compile had been reset to the original behind the patch; "
                               "re-installed the routing wrapper")
                how += " (re-installed: torch.compile had been reset to the original)"
        handle = CompilePatch(active=True, reason=f"hpu: {how} (G13).", accel=acc,
                              over_transformers=state.over_transformers)
        try:
            _rebind(handle, state, modules)
        except PatchError:
            if state.handles == 0:  # this call installed the patch: take it back out
                state.active = False
                torch.compile = state.original
                _installed = None
            raise
        state.handles += 1
    logger.info("hwcompile.patch_torch_compile: %s", handle.reason)
    return handle

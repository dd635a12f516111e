"""What sits at `torch.compile`: the wrappers stacked on it, top first, down to torch's own function.

Several libraries replace `torch.compile` (hwcompile's patch, Transformers' Gaudi wrapper,
anything using `functools.wraps`), in any order. Whatever is on top, torch's own function keeps
the real signature (`fullgraph`, `dynamic`, `mode`, `options`, ...), and each hwcompile wrapper
is found where it is in the stack.
"""

from __future__ import annotations

from typing import Any

from .transformers_wrapper import is_marked, is_transformers_wrapper, under_transformers_wrapper

#: How deep to look; a deeper stack of wrappers is treated as unreadable.
MAX_LAYERS = 32


def is_hwcompile_wrapper(function: Any) -> bool:
    """True for a `torch.compile` replacement made by hwcompile's patch."""
    return is_marked(function)


def is_torch_function(function: Any) -> bool:
    """True for torch's own `torch.compile` (defined in `torch/__init__.py`, wrapping nothing)."""
    return (callable(function) and not is_hwcompile_wrapper(function)
            and getattr(function, "__module__", None) == "torch"
            and getattr(function, "__qualname__", None) == "compile"
            and not hasattr(function, "__wrapped__"))


def below(function: Any) -> Any | None:
    """The function `function` calls in turn, when it says so: `__wrapped__`, or Transformers' closure."""
    wrapped = getattr(function, "__wrapped__", None)
    if wrapped is not None:
        return wrapped
    if is_transformers_wrapper(function):
        return under_transformers_wrapper(function)
    return None


def layers(function: Any) -> list[Any]:
    """`function` and every function under it, top first (stops where a layer does not say what it wraps)."""
    stack = [function]
    while len(stack) < MAX_LAYERS and (under := below(stack[-1])) is not None and under not in stack:
        stack.append(under)
    return stack


def torch_function(function: Any) -> Any | None:
    """torch's own `torch.compile` under `function`'s wrappers, or None when a layer hides it."""
    return next((layer for layer in layers(function) if is_torch_function(layer)), None)

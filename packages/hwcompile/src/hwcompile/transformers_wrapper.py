"""Transformers' own Gaudi wrapper of `torch.compile`: recognise it, look under it, fold its warning.

The first time `transformers.utils.import_utils.is_torch_hpu_available()` returns True it sets
`torch.compile = hpu_backend_compile(*args, **kwargs)`, a closure over `original_compile` (what
`torch.compile` was then). Once per process, never undone; every backend but `hpu_backend`/`eager`
(None and callables too) becomes `hpu_backend`, and it logs a warning on **every** such call
(transformers 5.22.2, src/transformers/utils/import_utils.py).
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Callable
from typing import Any

#: The name of the function transformers installs as `torch.compile` on Gaudi.
TRANSFORMERS_WRAPPER_NAME = "hpu_backend_compile"
#: Its closure variable holding the `torch.compile` it replaced.
TRANSFORMERS_ORIGINAL_NAME = "original_compile"
#: The logger its warning goes to, and the text of that warning.
TRANSFORMERS_LOGGER = "transformers.utils.import_utils"
TRANSFORMERS_WARNING_TEXT = "on a Gaudi device is not supported"
#: Marks hwcompile's own wrapper (functools.wraps copies the wrapped function's name and module onto it).
#: The attribute holds the wrapper itself, so a third party's `functools.wraps` over it (which copies
#: `__dict__`) is not taken for hwcompile's.
PATCH_MARKER = "__hwcompile_patch__"


def is_marked(function: Any) -> bool:
    """True for a function hwcompile marked as its own wrapper (see `PATCH_MARKER`)."""
    return function is not None and getattr(function, PATCH_MARKER, None) is function

_ASKED = re.compile(r"backend=(.*?) on a Gaudi device")


def is_transformers_wrapper(function: Any) -> bool:
    """True for the `torch.compile` replacement transformers installs on Gaudi (never for hwcompile's)."""
    return (not is_marked(function)
            and getattr(function, "__name__", None) == TRANSFORMERS_WRAPPER_NAME
            and str(getattr(function, "__module__", "")).startswith("transformers"))


def under_transformers_wrapper(function: Any) -> Any | None:
    """What transformers' wrapper calls (its closure's `original_compile`), or None if that cannot be read."""
    code, cells = getattr(function, "__code__", None), getattr(function, "__closure__", None) or ()
    names = getattr(code, "co_freevars", ())
    for name, cell in zip(names, cells, strict=False):
        if name == TRANSFORMERS_ORIGINAL_NAME:
            try:
                return cell.cell_contents
            except ValueError:  # an empty cell
                return None
    return None


def asked_backend(record: logging.LogRecord) -> Any:
    """The backend transformers' wrapper was called with, for its warning `record`.

    Read from the wrapper's own `kwargs` (the warning is logged before it rewrites them), so a
    callable is the same object hwcompile keys its once-per-backend warning on; else from the text.
    """
    frame = sys._getframe(1)
    for _ in range(32):
        if frame is None:
            break
        if (frame.f_code.co_name == TRANSFORMERS_WRAPPER_NAME
                and str(frame.f_globals.get("__name__", "")).startswith("transformers")):
            kwargs = frame.f_locals.get("kwargs")
            if isinstance(kwargs, dict):
                return kwargs.get("backend")
        frame = frame.f_back
    match = _ASKED.search(record.getMessage())
    text = match.group(1) if match else None
    return None if text in (None, "None") else text


class FoldTransformersWarning(logging.Filter):
    """Drops transformers' per-call Gaudi `torch.compile` warning and reports the backend to `on_backend`.

    `on_backend(backend)` logs hwcompile's own warning, once per backend. Added to transformers'
    logger only while a `patch_torch_compile` handle is held.
    """

    def __init__(self, on_backend: Callable[[Any], None]) -> None:
        super().__init__("hwcompile: fold transformers' Gaudi torch.compile warning")
        self.on_backend = on_backend

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING or TRANSFORMERS_WARNING_TEXT not in record.getMessage():
            return True
        self.on_backend(asked_backend(record))
        return False


def add_fold(fold: FoldTransformersWarning) -> None:
    """Attach `fold` to transformers' logger (imports nothing; the logger object is shared by name)."""
    logging.getLogger(TRANSFORMERS_LOGGER).addFilter(fold)


def remove_fold(fold: FoldTransformersWarning) -> None:
    """Detach `fold` from transformers' logger."""
    logging.getLogger(TRANSFORMERS_LOGGER).removeFilter(fold)

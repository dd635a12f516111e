"""Which `torch.compile` backend a call gets on a given accelerator, and why (G2, G13).

The rule is read from the platform (`hwenv.Platform.compile_backend`), not from kind names: a
platform whose compile backend is its own (Gaudi: `hpu_backend`) runs only that backend and
`eager`, so any other backend (the default `inductor`, `aot_eager`, a callable, a misspelling)
is switched to it, with one warning per distinct original backend. A platform whose compile
backend is torch's `inductor` (XPU, ROCm, CUDA, MPS, CPU) keeps the requested backend.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import hwenv

logger = logging.getLogger(__name__)

HPU_BACKEND = "hpu_backend"
#: torch's own default backend; a platform whose `compile_backend` is this one keeps every backend.
DEFAULT_BACKEND = "inductor"
#: Runs everywhere (no compiler, only dynamo's graph capture): never rerouted.
EAGER_BACKEND = "eager"
#: Backends that work on Gaudi as they are (G13): everything else becomes `hpu_backend`.
GAUDI_BACKENDS = (HPU_BACKEND, EAGER_BACKEND)

Backend = str | Callable[..., Any]
AcceleratorLike = hwenv.Accelerator | str | None

_lock = threading.RLock()
_warned: set[Any] = set()


@dataclass(frozen=True)
class CompileDecision:
    """The backend a `torch.compile` call will use, why, and whether this decision logged a warning."""

    backend: Backend
    reason: str
    warned: bool
    requested: Backend | None
    kind: str = "cpu"

    @property
    def rerouted(self) -> bool:
        """True when the backend differs from the one asked for (None = the default); only ever on Gaudi."""
        asked = default_backend_name() if self.requested is None else self.requested
        return self.backend is not asked and not (isinstance(asked, str) and self.backend == asked)


def own_backend(platform: hwenv.Platform) -> str | None:
    """The platform's own compile backend, which every other backend is switched to (Gaudi's
    `hpu_backend`), or None where torch's backends run as asked (`compile_backend` is `inductor`).
    """
    return None if platform.compile_backend == DEFAULT_BACKEND else platform.compile_backend


def resolve_accelerator(accel: AcceleratorLike) -> hwenv.Accelerator:
    """`None` -> `hwenv.detect()`; a kind string (`"hpu"`) -> `Accelerator(kind)`; an Accelerator as is."""
    if accel is None:
        return hwenv.detect()
    if isinstance(accel, str):
        return hwenv.Accelerator(accel)
    if isinstance(accel, hwenv.Accelerator):
        return accel
    from .errors import CompileArgumentError

    raise CompileArgumentError(
        f"accel={accel!r} is not an accelerator: pass an hwenv.Accelerator (hwenv.detect()), "
        f"a kind such as 'hpu', or None to detect."
    )


def describe_backend(backend: Backend | None) -> str:
    """A readable name for a backend: `'inductor'`, `None (default inductor)`, or a callable's name."""
    if backend is None:
        return f"None (default {default_backend_name()})"
    if isinstance(backend, str):
        return repr(backend)
    name = getattr(backend, "__qualname__", None) or getattr(backend, "__name__", None)
    return f"callable {name}" if name else f"callable {backend!r}"


def default_backend_name() -> str:
    """torch's current default backend (`inductor` unless `set_default_backend` changed it)."""
    registry = sys.modules.get("torch._dynamo.backends.registry")
    getter = getattr(registry, "get_default_backend", None)
    if getter is not None:
        value = getter()
        return value if isinstance(value, str) else getattr(value, "__name__", repr(value))
    return DEFAULT_BACKEND


def warning_key(backend: Backend | None) -> Any:
    """What "the same original backend" means for the once-per-backend warning.

    `None` and the default backend's name are the same backend; a callable is keyed by identity.
    """
    if backend is None:
        return default_backend_name()
    if isinstance(backend, str):
        return backend
    return ("callable", id(backend))


def validate_backend(backend: Any) -> None:
    """Reject a backend that is neither None, a non-empty string nor a callable (before any work)."""
    from .errors import CompileArgumentError

    if backend is None or callable(backend):
        return
    if isinstance(backend, str):
        if backend.strip():
            return
        raise CompileArgumentError(
            "backend='' is empty: pass a backend name such as 'inductor' or 'hpu_backend', or None for the default."
        )
    raise CompileArgumentError(
        f"backend={backend!r} ({type(backend).__name__}) is not a torch.compile backend: pass a name "
        f"(see torch._dynamo.list_backends()), a callable (gm, example_inputs) -> callable, or None."
    )


def _warn_once(backend: Backend | None, platform: hwenv.Platform) -> bool:
    key = warning_key(backend)
    with _lock:
        if key in _warned:
            return False
        _warned.add(key)
    target = own_backend(platform)
    logger.warning(
        "torch.compile backend=%s is not supported on %s; using %r instead (G13). "
        "Pass backend=%r (or 'eager') to silence this; it is logged once per backend.",
        describe_backend(backend), platform.display_name, target, target,
    )
    return True


def reset_warnings() -> None:
    """Forget which backends were already warned about (for tests and long-lived processes)."""
    with _lock:
        _warned.clear()


def route_backend(accel: AcceleratorLike, backend: Backend | None = None) -> CompileDecision:
    """Decide the `torch.compile` backend for `accel`: the platform's own backend where it has one
    (Gaudi: `hpu_backend`) unless that or `eager` was asked for (G13, one warning per distinct
    original backend); elsewhere the requested one. `accel` is an Accelerator, a kind, or None.
    """
    validate_backend(backend)
    acc = resolve_accelerator(accel)
    if isinstance(backend, str) and own_backend(acc.platform) is None:
        check_backend_name(backend)  # kept as asked here, so torch.compile itself would get the name
    return _route(acc, backend, _warn_once)


#: Names that need no look-up in torch's registry (its default, eager, and those it always registers).
_ALWAYS_KNOWN = frozenset({DEFAULT_BACKEND, EAGER_BACKEND, "aot_eager", "cudagraphs"})


def check_backend_name(backend: str) -> None:
    """Refuse a backend name torch.compile does not know here (`torch._dynamo.list_backends(exclude_tags=())`,
    plus every platform's own backend), naming the closest one: torch would refuse it only at the compile call,
    and `TrainingArguments(torch_compile_backend=...)` after the model loaded (issue 42.8)."""
    known = _ALWAYS_KNOWN | {platform.compile_backend for platform in hwenv.platforms()}
    if backend in known:
        return
    import difflib

    from torch._dynamo import list_backends

    common = known | set(list_backends())
    every = common | set(list_backends(exclude_tags=()))
    if backend in every:
        return
    from .errors import CompileArgumentError

    close = difflib.get_close_matches(backend, sorted(every), n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise CompileArgumentError(
        f"backend={backend!r} is not a torch.compile backend here; {hint}common ones: {', '.join(sorted(common))} "
        f"(torch._dynamo.list_backends()). Register your own with torch._dynamo.register_backend first, or pass a "
        f"callable.")


def _route(acc: hwenv.Accelerator, backend: Backend | None,
           warn: Callable[[Backend | None, hwenv.Platform], bool]) -> CompileDecision:
    platform = acc.platform
    target = own_backend(platform)
    if target is None:
        chosen = default_backend_name() if backend is None else backend
        how = "the default" if backend is None else "as requested"
        return CompileDecision(
            backend=chosen,
            reason=f"{acc.kind}: torch.compile backend {describe_backend(chosen)} kept ({how}); "
                   f"{platform.display_name} runs torch's backends (only a platform with its own compile "
                   f"backend, such as Gaudi's 'hpu_backend', reroutes, G13).",
            warned=False, requested=backend, kind=acc.kind,
        )
    if isinstance(backend, str) and backend in (target, EAGER_BACKEND):
        return CompileDecision(
            backend=backend,
            reason=f"{acc.kind}: backend {backend!r} runs on {platform.display_name} as asked (G13).",
            warned=False, requested=backend, kind=acc.kind,
        )
    warned = warn(backend, platform)
    return CompileDecision(
        backend=target,
        reason=f"{acc.kind}: backend {describe_backend(backend)} does not run on {platform.display_name}; "
               f"switched to {target!r} (G13).",
        warned=warned, requested=backend, kind=acc.kind,
    )


def _table_backend(gm: Any, example_inputs: Any) -> Any:
    """A stand-in callable backend for the README table."""
    return gm.forward


#: (accelerator kind, requested backend) examples shown in the README's routing table. Every
#: registered kind has at least one row (a test checks it against `hwenv.platforms()`).
TABLE_CASES: tuple[tuple[str, Backend | None], ...] = (
    ("hpu", None), ("hpu", "inductor"), ("hpu", "aot_eager"), ("hpu", _table_backend), ("hpu", "indcutor"),
    ("hpu", "hpu_backend"), ("hpu", "eager"),
    ("xpu", None), ("xpu", "eager"),
    ("rocm", None), ("rocm", "aot_eager"),
    ("cuda", None), ("cuda", "inductor"), ("cuda", "aot_eager"),
    ("mps", None),
    ("cpu", None), ("cpu", _table_backend),
)


def _shown(backend: Backend | None) -> str:
    if backend is None:
        return "None (default)"
    return f"`{backend!r}`" if isinstance(backend, str) else "a callable"


def routing_table() -> list[tuple[str, str, str, str]]:
    """Rows (accelerator, asked for, used, warning) computed by the routing code itself, logging nothing."""
    rows = []
    for kind, requested in TABLE_CASES:
        decision = _route(hwenv.Accelerator(kind), requested, lambda backend, platform: True)
        warning = "yes, once per backend" if decision.warned else "no"
        rows.append((kind, _shown(requested), _shown(decision.backend), warning))
    return rows


def missing_table_kinds() -> tuple[str, ...]:
    """Registered kinds (`hwenv.platforms()`, plug-ins included) without a row in `TABLE_CASES`."""
    shown = {kind for kind, _ in TABLE_CASES}
    return tuple(platform.kind for platform in hwenv.platforms() if platform.kind not in shown)


def routing_table_markdown() -> str:
    """The routing table as Markdown (the README embeds exactly this; a test keeps them in sync)."""
    lines = ["| accelerator | backend asked for | backend used | warning logged |", "|---|---|---|---|"]
    lines += [f"| {kind} | {asked} | {used} | {warning} |" for kind, asked, used, warning in routing_table()]
    return "\n".join(lines)

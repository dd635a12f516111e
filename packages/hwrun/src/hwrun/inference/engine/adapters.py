"""Per-request LoRA adapters in hwrun's engine: the adapters loaded once over the base model with PEFT, and each
slot's adapter name, which the model step passes as PEFT's mixed-batch `adapter_names` so rows with different
adapters (and base rows, "__base__") decode in one step.

Where it runs: the model's own forward (`ModelStep`) only, eagerly. The fused Llama step reads the base weights as
fused matrices (no LoRA), and PEFT's mixed batch groups the rows by adapter on the host (Python lists of row
indices: shapes that change with the mix), which no device graph or static-shape compile can hold; an engine with
adapters therefore refuses `step="fused"`, `use_graphs=True` and `compile_backend`, and picks the model step and
eager steps itself under "auto" / None (logged).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from ...errors import FastDecodeError

logger = logging.getLogger(__name__)

#: The adapter name of a row that runs the base model (PEFT's own).
BASE = "__base__"
#: Why an engine with adapters steps eagerly over the model's own forward.
EAGER_REASON = ("per-request LoRA adapters run through PEFT's mixed-batch forward, which groups rows by adapter on "
                "the host (shapes change with the mix: no graph or static compile holds them) over the model's own "
                "layers (the fused step reads the base weights only)")


def plan_adapters(adapters: Sequence[tuple[str, str]] | None, step: str, use_graphs: bool | None,
                  compile_backend: Any) -> tuple[str, bool | None]:
    """(step, use_graphs) an engine with `adapters` runs: the model step, eagerly; `FastDecodeError` when the caller
    asked for the fused step, graphs or a compile, which cannot run them."""
    if not adapters:
        return step, use_graphs
    asked = [what for what, bad in (("step='fused'", step == "fused"), ("use_graphs=True", use_graphs is True),
                                    (f"compile_backend={compile_backend!r}", compile_backend is not None)) if bad]
    if asked:
        raise FastDecodeError(f"{', '.join(asked)} cannot serve LoRA adapters per request: {EAGER_REASON}. Leave "
                              "them at their defaults (the model step, eager), or merge the adapter into the model.")
    logger.info("engine with %d LoRA adapter(s): model step, eager steps (%s)", len(adapters), EAGER_REASON)
    return "model", False


def check_adapter(rows: AdapterRows | None, name: str | None) -> None:
    """Refuse (FastDecodeError) an adapter name the engine (its `rows`, None without adapters) did not load."""
    if name is not None and rows is None:
        raise FastDecodeError(f"adapter={name!r}: this engine loaded no LoRA adapters (EngineCore(adapters=...)).")
    if rows is not None:
        rows.check(name)


class AdapterRows:
    """LoRA `adapters` ((name, folder) pairs) loaded with PEFT over `model` (changed in place: its LoRA layers run
    each row's adapter by name), and the adapter each of `slots` rows runs."""

    def __init__(self, model: Any, adapters: Sequence[tuple[str, str]], slots: int) -> None:
        from peft import PeftModel

        names = [name for name, _ in adapters]
        if len(set(names)) != len(names) or any(not n or n == BASE for n in names):
            raise FastDecodeError(f"adapter names {names!r} must be unique, non-empty and not {BASE!r}.")
        (first, path), *rest = adapters
        self.model = PeftModel.from_pretrained(model, path, adapter_name=first, is_trainable=False)
        for name, folder in rest:
            self.model.load_adapter(folder, adapter_name=name, is_trainable=False)
        self.model.eval()
        self.available = tuple(names)
        self._slots = [BASE] * slots

    def check(self, name: str | None) -> None:
        """Refuse (FastDecodeError) an adapter name this engine did not load."""
        if name is not None and name not in self.available:
            raise FastDecodeError(f"adapter={name!r} is not loaded in this engine; it has {list(self.available)} "
                                  "(or None: the base model).")

    def set(self, slot: int, name: str | None) -> None:
        """Row `slot` runs adapter `name` (None: the base model)."""
        self._slots[slot] = BASE if name is None else name

    def move(self, source: int, target: int) -> None:
        """Row `target` runs row `source`'s adapter."""
        self._slots[target] = self._slots[source]

    def names(self, slots: Any) -> list[str]:
        """The adapter names of `slots`, in order (PEFT's `adapter_names`)."""
        return [self._slots[s] for s in slots]

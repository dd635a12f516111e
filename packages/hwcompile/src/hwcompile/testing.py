"""Test helpers: a stand-in `hpu_backend` for machines without Gaudi (pair it with `hwenv.testing.fake_gaudi`).

    with fake_gaudi(), stand_in_hpu_backend() as backend:
        hwcompile.compile(model, backend="inductor")(x)
        assert backend.graphs            # the graphs it received, run eagerly

Importing this module does not import torch.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from .routing import HPU_BACKEND
from .transformers_wrapper import TRANSFORMERS_WARNING_TEXT

__all__ = ["ROUTING_WARNING_TEXT", "RecordingBackend", "TRANSFORMERS_WARNING_TEXT", "routing_warnings",
           "stand_in_hpu_backend", "tiny_llama", "transformers_warnings"]


@dataclass(eq=False)  # hashable by identity: torch 2.11 keeps backends in a set
class RecordingBackend:
    """A torch.compile backend that records each graph (and the keywords it got) and runs it eagerly."""

    name: str = HPU_BACKEND
    graphs: list[Any] = field(default_factory=list)
    calls: list[dict[str, Any]] = field(default_factory=list)

    def __call__(self, graph_module: Any, example_inputs: list[Any], **kwargs: Any) -> Any:
        self.graphs.append(graph_module)
        self.calls.append(dict(kwargs))
        return graph_module.forward


@contextlib.contextmanager
def stand_in_hpu_backend(name: str = HPU_BACKEND) -> Iterator[RecordingBackend]:
    """Register a `RecordingBackend` with torch._dynamo under `name` for the duration, then remove it.

    Refuses to shadow a backend that is already registered (e.g. the real Gaudi plugin's).
    """
    import torch._dynamo
    from torch._dynamo.backends import registry

    if name in torch._dynamo.list_backends(exclude_tags=()):
        raise RuntimeError(f"a torch.compile backend named {name!r} is already registered; not replacing it")
    backend = RecordingBackend(name)
    torch._dynamo.register_backend(compiler_fn=backend, name=name)
    try:
        yield backend
    finally:
        for table in ("_COMPILER_FNS", "_BACKENDS", "_BACKEND_TAGS"):  # _BACKEND_TAGS is newer than 2.8
            getattr(registry, table, {}).pop(name, None)
        torch._dynamo.reset()


#: Text of hwcompile's routing warning (logged by `hwcompile.routing`).
ROUTING_WARNING_TEXT = "is not supported on"


def routing_warnings(records: Iterable[logging.LogRecord]) -> list[logging.LogRecord]:
    """hwcompile's once-per-backend routing warnings among `records` (e.g. `caplog.records`)."""
    return [r for r in records if r.levelno == logging.WARNING and r.name == "hwcompile.routing"
            and ROUTING_WARNING_TEXT in r.getMessage()]


def transformers_warnings(records: Iterable[logging.LogRecord]) -> list[logging.LogRecord]:
    """transformers' `hpu_backend_compile` warnings among `records`."""
    return [r for r in records if TRANSFORMERS_WARNING_TEXT in r.getMessage()]


def tiny_llama(seed: int = 0) -> Any:
    """A 2-layer Llama built from a config (no download), in eval mode, with weights fixed by `seed`."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=256)
    return LlamaForCausalLM(config).eval()

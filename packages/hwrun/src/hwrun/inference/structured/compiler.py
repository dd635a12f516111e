"""One grammar compiler per engine: reads the tokenizer once, picks the grammar engine (xgrammar or llguidance, the
measured one for "auto"), compiles each `StructuredOutput` once (cached) and hands every request its own `Matcher`."""

from __future__ import annotations

import importlib.util
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from ...errors import GrammarBackendError, StructuredOutputError
from .matcher import Matcher
from .schema_check import check_schema
from .spec import StructuredOutput
from .vocab import VocabInfo, vocab_info

logger = logging.getLogger(__name__)

BACKENDS = ("xgrammar", "llguidance")
#: What "auto" picks when both are installed, and why (docs/benchmarks/structured_output.md has the figures).
AUTO_ORDER = ("llguidance", "xgrammar")
AUTO_REASON = ("llguidance: it refuses the schema keywords it does not enforce where xgrammar 0.2.9 compiles several "
               "without enforcing them, compiles a schema in 0.6-28 ms where xgrammar takes 63-1,249 ms at a 128k "
               "vocabulary, and its mask costs 20-117 us a token there against xgrammar's 19-253 "
               "(docs/benchmarks/structured_output.md)")
#: Compiled grammars kept per engine (least recently used dropped first).
CACHE_SIZE = 256
_INSTALL = "pip install 'hwrun[structured]'"


def _installed(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def choose_backend(backend: str = "auto") -> tuple[str, str]:
    """(the grammar engine to use, why) for `backend` "xgrammar", "llguidance" or "auto"."""
    if backend not in (*BACKENDS, "auto"):
        raise StructuredOutputError(f"structured-output backend={backend!r} is not one of auto, "
                                    f"{', '.join(BACKENDS)}.")
    if backend != "auto":
        if not _installed(backend):
            raise GrammarBackendError(f"the grammar engine {backend!r} is not installed: {_INSTALL} (or pip install "
                                      f"{backend}), or use backend='auto'.")
        return backend, f"{backend}: asked for"
    first, second = AUTO_ORDER
    if _installed(first):
        return first, AUTO_REASON
    if _installed(second):
        reason = f"{second}: {first} (auto's first choice) is not installed"
        logger.warning("structured output: %s", reason)
        return second, reason
    raise GrammarBackendError(f"structured output needs a grammar engine and neither {first} nor {second} is "
                              f"installed: {_INSTALL}.")


class StructuredCompiler:
    """Turns `StructuredOutput`s into `Matcher`s for one tokenizer; thread-safe; `backend` and `reason` say which
    grammar engine runs and why."""

    def __init__(self, engine: Any, vocab: VocabInfo, reason: str) -> None:
        import torch

        self.vocab, self.backend, self.reason = vocab, engine.name, reason
        self._engine = engine
        self._cache: OrderedDict[StructuredOutput, Any] = OrderedDict()
        self._lock = threading.Lock()
        self._stop_row = torch.zeros(((vocab.vocab_size + 31) // 32,), dtype=torch.int32)
        for token in vocab.stop_token_ids:
            word, bit = divmod(token, 32)
            self._stop_row[word] |= (1 << bit) if bit < 31 else -(1 << 31)

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        """The ids a finished grammar allows (the tokenizer's eos unless the engine said otherwise)."""
        return self.vocab.stop_token_ids

    def compiled(self, spec: StructuredOutput) -> Any:
        """`spec`'s compiled grammar, from the cache when compiled before; raises `StructuredOutputError`."""
        if not isinstance(spec, StructuredOutput):
            raise StructuredOutputError(f"expected a StructuredOutput, got {type(spec).__name__}.")
        with self._lock:
            hit = self._cache.get(spec)
            if hit is not None:
                self._cache.move_to_end(spec)
                return hit
        if spec.schema is not None:
            check_schema(spec.schema_dict())
        compiled = self._engine.compile(spec)
        with self._lock:
            self._cache[spec] = compiled
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return compiled

    def fill(self, bitmask: Any, rows: Sequence[tuple[int, Matcher]]) -> None:
        """Fill `bitmask[row]` for every (row, matcher) of this compiler at once, on the grammar engine's own threads
        (both release the GIL while they work, so the engine may run this beside the model's forward pass)."""
        live = []
        for row, matcher in rows:
            if matcher.vocab is not self.vocab:
                raise StructuredOutputError("compiler.fill got a matcher made by another compiler: fill each "
                                            "compiler's matchers through that compiler.")
            matcher.check_bitmask(bitmask, row)
            if matcher.stopped:
                bitmask[row].copy_(self._stop_row)
            else:
                live.append((row, matcher))
        if live:
            self._engine.fill_many(bitmask, live)

    def matcher(self, spec: StructuredOutput) -> Matcher:
        """A new `Matcher` for one request under `spec` (compiled once per spec); `StructuredOutputError` names a
        schema that cannot be enforced, before the request starts."""
        return self._engine.matcher(self.compiled(spec), self._stop_row)


def _threads() -> int:
    return max(1, min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))


def structured_compiler(tokenizer: Any, vocab_size: int, *, backend: str = "auto",
                        stop_token_ids: Sequence[int] | None = None) -> StructuredCompiler:
    """The structured-output compiler for one engine: `tokenizer` (a Transformers fast tokenizer), the model's
    `vocab_size` (its logits width), `backend` "xgrammar", "llguidance" or "auto"; stop ids default to the eos."""
    name, reason = choose_backend(backend)
    vocab = vocab_info(tokenizer, vocab_size, stop_token_ids)
    logger.info("structured output: grammar engine %s (%s)", name, reason)
    return StructuredCompiler(_engine(name, tokenizer, vocab), vocab, reason)


def _engine(name: str, tokenizer: Any, vocab: VocabInfo) -> Any:
    if name == "xgrammar":
        from .xgrammar_engine import XGrammarCompiler

        return XGrammarCompiler(tokenizer, vocab, _threads())
    from .llguidance_engine import LLGuidanceCompiler

    return LLGuidanceCompiler(tokenizer, vocab, _threads())

"""The llguidance grammar engine behind `Matcher`: an `LLTokenizer` per engine, a validated prototype `LLMatcher` per
grammar, and a copy of it per request."""

from __future__ import annotations

import copy
from typing import Any

from ...errors import StructuredOutputError
from .matcher import Matcher
from .spec import SEPARATORS, StructuredOutput
from .vocab import VocabInfo

NAME = "llguidance"
_OBJECT = '{"type": "object"}'


def ll_tokenizer(tokenizer: Any, vocab: VocabInfo) -> Any:
    """llguidance's `LLTokenizer` for `tokenizer` (its Rust tokenizer serialized, padding and truncation off), sized to
    the model's vocabulary, stopping on the stop ids."""
    import llguidance

    backend = copy.copy(tokenizer.backend_tokenizer)
    backend.no_padding()
    backend.no_truncation()
    return llguidance.LLTokenizer(backend.to_str(), n_vocab=vocab.vocab_size, eos_token=list(vocab.stop_token_ids))


class LLGuidanceCompiler:
    """Compiles a `StructuredOutput` into a validated llguidance matcher that each request copies."""

    name = NAME

    def __init__(self, tokenizer: Any, vocab: VocabInfo, threads: int) -> None:
        import llguidance

        self.vocab = vocab
        self._tokenizer = ll_tokenizer(tokenizer, vocab)
        self._executor = llguidance.LLExecutor(threads)

    def compile(self, spec: StructuredOutput) -> Any:
        """A prototype `LLMatcher` at the start of `spec`'s grammar; `StructuredOutputError` names the schema problem."""
        import llguidance

        grammar = llguidance.LLMatcher.grammar_from_json_schema(
            spec.schema if spec.schema is not None else _OBJECT,
            overrides={"whitespace_flexible": False, "item_separator": SEPARATORS[0], "key_separator": SEPARATORS[1]})
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, self._tokenizer)
        if is_error:
            raise StructuredOutputError(f"the JSON schema cannot be compiled for structured output (llguidance): "
                                        f"{'; '.join(messages)}")
        prototype = llguidance.LLMatcher(self._tokenizer, grammar, log_level=0)
        if prototype.is_error():
            raise StructuredOutputError(f"the JSON schema cannot be compiled for structured output (llguidance): "
                                        f"{prototype.get_error()}")
        return prototype

    def matcher(self, compiled: Any, stop_row: Any) -> Matcher:
        """A fresh matcher at the start of `compiled`'s grammar (a copy of the prototype)."""
        return LLGuidanceMatcher(self.vocab, stop_row, compiled.deep_copy())

    def fill_many(self, bitmask: Any, rows: list[tuple[int, Any]]) -> None:
        """Fill each (row, matcher)'s row of `bitmask` in parallel (llguidance's `LLExecutor`)."""
        self._executor.unsafe_compute_mask_ptr([(matcher._matcher, row) for row, matcher in rows],
                                               bitmask.data_ptr(), bitmask.shape[1] * 4, bitmask.shape[0])


class LLGuidanceMatcher(Matcher):
    """`Matcher` over llguidance's `LLMatcher`."""

    def __init__(self, vocab: VocabInfo, stop_row: Any, matcher: Any) -> None:
        super().__init__(vocab, stop_row)
        self._matcher = matcher

    def _fill(self, bitmask: Any, row: int) -> None:
        target = bitmask[row]
        self._matcher.unsafe_compute_mask_ptr(target.data_ptr(), target.numel() * 4)

    def _accept(self, token_id: int) -> bool:
        return bool(self._matcher.consume_token(token_id))

    def _terminated(self) -> bool:
        return bool(self._matcher.is_stopped()) and not self._matcher.is_error()

    def _accepting(self) -> bool:
        return bool(self._matcher.is_accepting())

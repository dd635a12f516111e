"""The xgrammar grammar engine behind `Matcher`: a `GrammarCompiler` per engine, a `GrammarMatcher` per request."""

from __future__ import annotations

import re
from typing import Any

from ...errors import StructuredOutputError
from .matcher import Matcher
from .schema_check import check_schema
from .spec import SEPARATORS, StructuredOutput
from .vocab import VocabInfo

NAME = "xgrammar"
#: xgrammar's C++ messages start with "[hh:mm:ss] /path/file.cc:line: "; the schema problem is what follows.
_CPP_PREFIX = re.compile(r"^\s*\[[\d:]+\]\s+\S+:\d+:\s*")
_LENGTH_BUG = ("lets raw control characters into strings bounded by minLength/maxLength and drops their escapes, "
               "so the text would not be valid JSON (mlc-ai/xgrammar#800)")


def schema_problem(node: dict[str, Any]) -> str | None:
    """What xgrammar 0.2.9 compiles without enforcing in this subschema (found by driving its matchers with random
    allowed tokens and validating the JSON), or None."""
    why = None
    if "minLength" in node or "maxLength" in node:
        why = _LENGTH_BUG
    elif isinstance(node.get("allOf"), list) and len(node["allOf"]) > 1:
        why = "compiles allOf with several subschemas to a grammar that allows values outside the schema"
    elif "oneOf" in node:
        why = "treats oneOf as anyOf (a value valid under two branches is allowed); use anyOf if that is meant"
    elif "multipleOf" in node and (node.get("type") != "integer" or not isinstance(node["multipleOf"], int)):
        why = "enforces multipleOf only as an integer multiple of an integer"
    elif isinstance(node.get("required"), list) and any(
            key not in (node.get("properties") or {}) for key in node["required"]):
        why = "allows no property outside properties (strict mode), so a required key missing from them never comes"
    return None if why is None else f"the xgrammar backend {why}: use backend llguidance, or change the schema."


def tokenizer_info(tokenizer: Any, vocab: VocabInfo) -> Any:
    """xgrammar's `TokenizerInfo` for `tokenizer`, with every special id blanked (xgrammar then never allows it inside
    the text: it would otherwise allow `<s>` in a string as if it were those 3 characters) and the stop ids set."""
    import xgrammar

    stops = list(vocab.stop_token_ids)
    detected = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab.vocab_size, stop_token_ids=stops)
    encoded = [""] * vocab.vocab_size
    for token, index in tokenizer.get_vocab().items():
        if index not in vocab.special_token_ids:
            encoded[index] = token
    return xgrammar.TokenizerInfo(encoded, detected.vocab_type, vocab_size=vocab.vocab_size, stop_token_ids=stops,
                                  add_prefix_space=detected.add_prefix_space)


class XGrammarCompiler:
    """Compiles a `StructuredOutput` into an xgrammar `CompiledGrammar` for one tokenizer."""

    name = NAME

    def __init__(self, tokenizer: Any, vocab: VocabInfo, threads: int) -> None:
        import xgrammar

        self.vocab = vocab
        self._batch = xgrammar.BatchGrammarMatcher(threads)
        self._compiler = xgrammar.GrammarCompiler(tokenizer_info(tokenizer, vocab), max_threads=threads,
                                                  cache_enabled=False)

    def compile(self, spec: StructuredOutput) -> Any:
        """The compiled grammar for `spec`; `StructuredOutputError` names the schema problem."""
        if spec.schema is not None:
            check_schema(spec.schema_dict(), schema_problem)
        try:
            if spec.kind == "json_object":
                return self._compiler.compile_json_schema('{"type": "object"}', strict_mode=False,
                                                          any_whitespace=False, separators=SEPARATORS)
            return self._compiler.compile_json_schema(spec.schema, strict_mode=True, any_whitespace=False,
                                                      separators=SEPARATORS)
        except (RuntimeError, ValueError) as error:
            problem = _CPP_PREFIX.sub("", str(error)).strip()
            raise StructuredOutputError(f"the JSON schema cannot be compiled for structured output (xgrammar): "
                                        f"{problem}") from error

    def matcher(self, compiled: Any, stop_row: Any) -> Matcher:
        """A fresh matcher at the start of `compiled`'s grammar."""
        return XGrammarMatcher(self.vocab, stop_row, compiled)

    def fill_many(self, bitmask: Any, rows: list[tuple[int, Any]]) -> None:
        """Fill each (row, matcher)'s row of `bitmask` in parallel (xgrammar's `BatchGrammarMatcher`)."""
        self._batch.batch_fill_next_token_bitmask([matcher._matcher for _, matcher in rows], bitmask,
                                                  [row for row, _ in rows])


class XGrammarMatcher(Matcher):
    """`Matcher` over xgrammar's `GrammarMatcher`."""

    def __init__(self, vocab: VocabInfo, stop_row: Any, compiled: Any) -> None:
        import xgrammar

        super().__init__(vocab, stop_row)
        self._matcher = xgrammar.GrammarMatcher(compiled, override_stop_tokens=list(vocab.stop_token_ids))

    def _fill(self, bitmask: Any, row: int) -> None:
        self._matcher.fill_next_token_bitmask(bitmask, row)

    def _accept(self, token_id: int) -> bool:
        return bool(self._matcher.accept_token(token_id))

    def _terminated(self) -> bool:
        return bool(self._matcher.is_terminated())

    def _accepting(self) -> bool:
        return bool(self._matcher.is_completed())

"""Structured output: what a request constrains its text to (`StructuredOutput`), and the grammar engine that
turns that into a token mask per step.

The engine makes one `structured_compiler(tokenizer, vocab_size)`; each constrained request gets a
`compiler.matcher(spec)` (a schema that cannot be enforced raises `StructuredOutputError` there, before the request
starts); each step the matcher fills its row of a CPU bitmask (`allocate_bitmask`), the bitmask is copied to the
device and `apply_bitmask` sets the disallowed logits to -inf; the sampled token goes to `matcher.accept`, and
`matcher.finished` ends the request with finish_reason "stop". No grammar engine is imported until a compiler is made.
"""

from .bitmask import allocate_bitmask, apply_bitmask, bitmask_words
from .compiler import BACKENDS, StructuredCompiler, choose_backend, structured_compiler
from .matcher import Matcher
from .schema_check import check_schema
from .spec import StructuredOutput
from .vocab import VocabInfo, vocab_info

__all__ = [
    "BACKENDS", "Matcher", "StructuredCompiler", "StructuredOutput", "VocabInfo", "allocate_bitmask", "apply_bitmask",
    "bitmask_words", "check_schema", "choose_backend", "structured_compiler", "vocab_info",
]

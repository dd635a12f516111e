"""Structured output: what a request constrains its text to (`StructuredOutput`), and the grammar engine that
turns that into a token mask per step."""

from .spec import StructuredOutput

__all__ = ["StructuredOutput"]

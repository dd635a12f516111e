"""Which tool-call format a model writes, read from its chat template (or `--tool-parser`), and whether the
template renders `tools` at all (a probe tool is rendered once at start-up and looked for)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from .parsers import PARSERS

logger = logging.getLogger(__name__)

#: The markers in a chat template that name its tool-call format, in the order they are looked for.
TEMPLATE_MARKERS = (("<tool_call>", "hermes"), ("[TOOL_CALLS]", "mistral"), ("<|python_tag|>", "llama3_json"))
#: Text each format needs to see that a tokenizer may mark special (and so drop from the text).
PARSER_TOKENS = {"hermes": ("<tool_call>", "</tool_call>"), "mistral": ("[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"),
                 "llama3_json": ("<|python_tag|>",)}
PROBE_TOOL = "hwrun_probe_tool_3f9c"


@dataclass(frozen=True)
class ToolSupport:
    """How this server reads tool calls: `parser` (one of `PARSERS`, None: requests with tools are refused, `why`
    says why), whether the template renders tools, and the special-token ids kept in the text for the parser."""

    parser: str | None
    renders: bool
    why: str
    keep_token_ids: tuple[int, ...] = ()


def template_text(tokenizer: Any) -> str:
    """The chat template a request with tools renders through (a tokenizer's `tool_use` template when it has
    named ones), or ''."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        template = template.get("tool_use") or template.get("default") or ""
    return template if isinstance(template, str) else ""


def renders_tools(tokenizer: Any) -> bool:
    """Whether the chat template shows the model a tool it is given (a probe tool's name appears)."""
    tool = {"type": "function", "function": {"name": PROBE_TOOL, "description": "probe",
                                             "parameters": {"type": "object", "properties": {}}}}
    try:
        text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tools=[tool],
                                             add_generation_prompt=True, tokenize=False)
    except Exception as exc:  # noqa: BLE001 - a template that fails on tools cannot serve them
        logger.info("the chat template failed to render a probe tool: %s", exc)
        return False
    return PROBE_TOOL in str(text)


def choose_tool_support(tokenizer: Any, requested: str = "auto") -> ToolSupport:
    """The tool-call format of `tokenizer`'s model: `requested` (a `--tool-parser` name) or read from the chat
    template; `renders` from a probe."""
    template = template_text(tokenizer)
    if not template:
        return ToolSupport(None, False, "the model has no chat template, so it is never shown tools")
    renders = renders_tools(tokenizer)
    if not renders:
        return ToolSupport(None, False, "the model's chat template does not render `tools` (a probe tool given to it "
                                        "never appears in the prompt), so the model would never see them")
    if requested != "auto":
        parser, why = requested, f"{requested} (--tool-parser)"
    else:
        found = [(template.find(marker), marker, name) for marker, name in TEMPLATE_MARKERS if marker in template]
        if not found:
            return ToolSupport(None, True, "the chat template renders tools, but in none of the formats hwrun reads "
                                           f"({', '.join(PARSERS)}: no {', '.join(m for m, _ in TEMPLATE_MARKERS)} in "
                                           "it); start the server with --tool-parser NAME if the model writes one")
        _, marker, parser = min(found)
        why = f"{parser} ({marker} in the chat template)"
    return ToolSupport(parser, True, why, keep_ids(tokenizer, PARSER_TOKENS.get(parser, ())))


def keep_ids(tokenizer: Any, texts: tuple[str, ...]) -> tuple[int, ...]:
    """Ids of the special tokens among `texts` (the detokenizer would drop them; the parser needs them)."""
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    return tuple(sorted(int(i) for i, token in decoder.items()
                        if getattr(token, "special", False) and str(token) in texts))

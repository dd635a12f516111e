"""Tool calling for `hwrun serve`: the request's tools and choice (`spec`), the format a model writes its calls
in (`choice`), and the parsers that read them out of its text as it streams (`parsers`)."""

from .choice import ToolSupport, choose_tool_support
from .parsers import PARSERS, CallDelta, NamedParser, ToolCall, ToolParser, make_parser
from .spec import NO_TOOLS, Tool, ToolSetup, check_schema, parse_tool_setup, parse_tools

__all__ = ["NO_TOOLS", "PARSERS", "CallDelta", "NamedParser", "Tool", "ToolCall", "ToolParser", "ToolSetup",
           "ToolSupport", "check_schema", "choose_tool_support", "make_parser", "parse_tool_setup", "parse_tools"]

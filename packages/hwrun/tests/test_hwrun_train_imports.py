"""`hwrun.training` has no import circle, counting the imports inside functions (issue 38: options imported lora at
the top while lora imported options.check_booleans inside a function). The graph is built by the helpers of
test_hwrun_engine_rooms.py, loaded from its file so both tests count imports the same way."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOMS = Path(__file__).with_name("test_hwrun_engine_rooms.py")


def _rooms():
    spec = importlib.util.spec_from_file_location("_engine_rooms_helpers", ROOMS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _circles(package: str) -> list[str]:
    rooms = _rooms()
    modules = rooms._modules()
    scope = {m: p for m, p in modules.items() if m.startswith(package)}
    graph = {m: {t for t in rooms._imports(m, *scope[m], modules) if t in scope} for m in scope}
    state: dict[str, int] = {}
    circles: list[str] = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                circles.append(" -> ".join(stack[stack.index(nxt):] + [node, nxt]) if nxt in stack else f"{node}->{nxt}")
            elif nxt not in state:
                visit(nxt, stack + [node])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [])
    return circles


def test_training_has_no_import_circle_counting_imports_inside_functions():
    assert not _circles("hwrun.training"), "import circles:\n" + "\n".join(_circles("hwrun.training"))


def test_options_and_lora_share_the_boolean_check_from_a_lower_module():
    from hwrun.training import booleans, lora, options

    assert options.check_booleans is booleans.check_booleans
    assert lora.check_booleans is booleans.check_booleans

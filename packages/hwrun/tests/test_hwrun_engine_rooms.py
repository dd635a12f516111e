"""hwrun's engine keeps its rooms (issue 35 point 1): each module of `hwrun.inference.engine` says its one job and
stays short, the scheduler is host bookkeeping (no torch), and hwrun has no import circle (checked per package for
clear messages, then over all of hwrun), counting the imports inside functions, under TYPE_CHECKING, and the packages
a submodule import runs."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
ENGINE = SRC / "hwrun" / "inference" / "engine"


def _modules() -> dict[str, tuple[Path, bool]]:
    found = {}
    for path in sorted((SRC / "hwrun").rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if package else parts)] = (path, package)
    return found


def _imports(module: str, path: Path, package: bool, modules: dict) -> set[str]:
    """hwrun modules `module` imports anywhere in its file, with the packages above each (importing runs them)."""
    targets = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if package else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names = [f"{target}.{alias.name}" for alias in node.names if f"{target}.{alias.name}" in modules]
            found = [*names, target]
        elif isinstance(node, ast.Import):
            found = [alias.name for alias in node.names]
        else:
            continue
        for name in found:
            if name in modules:
                parts = name.split(".")
                targets |= {".".join(parts[:i]) for i in range(2, len(parts) + 1)} & set(modules)
    # a module importing its own package runs nothing new (the package ran before it)
    return {t for t in targets if t != module and not module.startswith(t + ".")}


@pytest.mark.parametrize("package", ["hwrun.inference", "hwrun.model", "hwrun.serve", "hwrun"])
def test_no_import_circle_counting_imports_inside_functions(package):
    # hwrun.model had model/plan -> adapters -> load -> plan until adapter loading moved into load.py; hwrun.serve had
    # core -> engine -> core (run_thread) and core -> startup -> backend_* -> engine -> core until the shared types
    # moved to serve/backend.py and the process entry to serve/core_process.py, and state -> request -> state
    modules = _modules()
    scope = {m: p for m, p in modules.items() if m.startswith(package)}
    graph = {m: {t for t in _imports(m, *scope[m], modules) if t in scope} for m in scope}
    state: dict[str, int] = {}
    circles = []

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
    assert not circles, "import circles:\n" + "\n".join(circles)


def test_every_engine_module_says_its_job_and_stays_short():
    for path in sorted(ENGINE.glob("*.py")):
        tree = ast.parse(path.read_text())
        assert ast.get_docstring(tree), f"{path.name} has no docstring saying its job"
        assert len(path.read_text().splitlines()) <= 280, f"{path.name} is past ~250 lines: split it"
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
                assert ast.get_docstring(node), f"{path.name}: {node.name} has no docstring"


def test_the_scheduler_is_host_bookkeeping():
    source = (ENGINE / "scheduler.py").read_text()
    assert "torch" not in source.replace("no torch", "")
    code = ("import sys; import hwrun.inference.engine.scheduler, hwrun.inference.engine.kv_cache, "
            "hwrun.inference.engine; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False"  # and importing the engine imports no torch either


def test_the_plan_carries_its_resolved_source_so_a_run_reads_it_once(monkeypatch):
    import dataclasses

    import hwrun
    from hwrun.model import load as load_module
    from hwrun.model import plan as plan_module
    from hwrun.model import source as source_module

    calls = []
    real = source_module.resolve_source

    def counting(reference):
        calls.append(reference)
        return real(reference)

    for module in (source_module, plan_module, load_module):
        if hasattr(module, "resolve_source"):
            monkeypatch.setattr(module, "resolve_source", counting)
    plan = hwrun.plan()
    assert len(calls) == 1 and plan.model_source() is plan.source
    result = hwrun.generate(plan, "The king said", 3)  # check, load, tokenizer: all from the plan's source
    assert result.new_tokens == [3] and len(calls) == 1
    other = dataclasses.replace(plan, model=str(plan.source.path.parent))  # a replaced model is resolved again
    with pytest.raises(hwrun.errors.ModelSourceError):
        other.model_source()
    assert len(calls) == 2

"""hwrun's rooms (issue 26): every import points down, no module-level import circle, `import hwrun` stays light,
and no public function hides the module it lives in."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

#: Which rooms each room may import from. Lower rooms never import higher ones.
ALLOWED = {
    "errors": set(),
    "devices": {"errors"},
    "parallel": {"errors", "devices"},  # tensor parallelism: checks, rank launch, lockstep (under model: plan uses it)
    "model": {"errors", "devices", "parallel"},
    "inference": {"errors", "devices", "parallel", "model"},
    "training": {"errors", "devices", "parallel", "model"},
    "serve": {"errors", "devices", "parallel", "model", "inference"},
    "cli": {"errors", "devices", "parallel", "model", "inference", "training", "serve"},
    "testing": {"errors", "devices", "parallel", "model", "inference", "training", "__init__"},
    "__init__": {"errors", "devices", "parallel", "model", "inference", "training"},
}


def _modules() -> dict[str, tuple[Path, bool]]:
    found = {}
    for path in sorted((SRC / "hwrun").rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        found[".".join(parts)] = (path, is_package)
    return found


def _imports(module: str, path: Path, is_package: bool, top_level_only: bool) -> set[str]:
    """hwrun modules that `module` imports (names resolved to modules where they are modules)."""
    modules = _modules()
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    targets = set()
    for node in nodes:
        if isinstance(node, ast.If) and top_level_only:  # `if TYPE_CHECKING:` imports do not run
            continue
        if isinstance(node, ast.Import):
            targets |= {alias.name for alias in node.names if alias.name.startswith("hwrun")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("hwrun"):
                continue
            names = [f"{target}.{alias.name}" for alias in node.names]
            as_modules = [name for name in names if name in modules]
            targets |= set(as_modules) if as_modules else {target}
    return targets


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_every_import_points_down_into_a_lower_room():
    wrong = []
    for module, (path, is_package) in _modules().items():
        room = _room(module)
        for target in _imports(module, path, is_package, top_level_only=False):
            other = _room(target)
            if other != room and other not in ALLOWED[room]:
                wrong.append(f"{module} imports {target} ({room} -> {other})")
    assert not wrong, "imports that point up or sideways:\n" + "\n".join(wrong)


def test_every_room_is_in_the_table():
    rooms = {_room(module) for module in _modules()}
    assert rooms <= set(ALLOWED), f"rooms without a rule: {rooms - set(ALLOWED)}"


def test_no_module_level_import_circle():
    modules = _modules()
    graph = {m: {t for t in _imports(m, p, pkg, top_level_only=True) if t in modules and t != m}
             for m, (p, pkg) in modules.items()}
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in graph[node]:
            # a package's own __init__ importing its children is not a circle back to the child
            if state.get(nxt) == 1 and not node.startswith(nxt + "."):
                pytest.fail("import circle: " + " -> ".join(stack[stack.index(nxt):] + [node, nxt]))
            if nxt not in state:
                visit(nxt, stack + [node])
        state[node] = 2

    for module in graph:
        if module not in state:
            visit(module, [])


def test_import_hwrun_imports_no_torch_and_no_training_module():
    code = ("import sys, hwrun; print(sorted(m for m in sys.modules if m.startswith('hwrun.training')));"
            "print('torch' in sys.modules, 'transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[0] == "[]", f"import hwrun imported training modules: {out[0]}"
    assert out[1] == "False False"


def test_public_functions_do_not_hide_their_modules():
    import importlib

    import hwrun

    for name in ("plan", "load", "generate", "pipeline", "train"):
        assert callable(getattr(hwrun, name))
    # the README's module paths resolve to modules that hold what it says
    load_module = importlib.import_module("hwrun.model.load")
    assert callable(load_module.load_tokenizer)
    for module in _modules():
        if module.count(".") == 1:
            leaf = module.split(".")[1]
            value = getattr(hwrun, leaf, None)
            assert value is None or not callable(value) or isinstance(value, type(hwrun)), (
                f"hwrun.{leaf} is a function that hides the module {module}")


def test_hwrun_help_imports_no_torch():
    """issue 29 point 4: `hwrun --help` (every subcommand's parser, train/serve/chat included) stays light."""
    code = ("import sys, contextlib, io, hwrun.cli.main as cli\n"
            "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
            "    try:\n        cli.main(['--help'])\n    except SystemExit:\n        pass\n"
            "heavy = [m for m in ('torch', 'transformers', 'starlette', 'uvicorn', 'openai') if m in sys.modules]\n"
            "print(heavy, 'serve' in out.getvalue(), 'train' in out.getvalue())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[] True True", out


def test_every_error_is_exported_from_hwrun():
    import inspect

    import hwrun
    import hwrun.errors as errors

    classes = {name for name, value in inspect.getmembers(errors, inspect.isclass)
               if issubclass(value, errors.HwrunError)}
    assert classes <= set(hwrun.__all__), f"errors missing from hwrun.__all__: {classes - set(hwrun.__all__)}"
    assert classes <= set(errors.__all__), f"errors missing from hwrun.errors.__all__: {classes - set(errors.__all__)}"
    assert all(getattr(hwrun, name) is getattr(errors, name) for name in classes)

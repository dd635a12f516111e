"""The attention flags a Transformers model class declares, read from its source file without importing it.

`model_support` needs four class attributes of the model class a config names (`_supports_sdpa`,
`_supports_flash_attn`, `_supports_flex_attn`, `_compatible_flash_implementations`). Importing the class
imports `transformers.modeling_utils` and with it most of torch's compiler stack (5-15 s on a 2-core host,
issue 40), which `hwrun plan` pays before printing a line. The flags are literal class attributes in the
modeling files, so this module parses the file of the class (and of the bases it inherits them from) with
`ast` and reads them, following Python's method resolution order.

Any case it does not understand makes `declared_flags` return None and the caller imports the class as
before: a class it cannot find in the expected files, a base it cannot place, a flag that is not a literal
(a property, a computed value), a flag assigned outside the class body, or an MRO that does not linearize.
Nothing here imports transformers or torch. `tests/test_hwattn_declared.py` checks the result against the
imported classes for every causal LM in the installed Transformers.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

#: The class attributes read, and `PreTrainedModel`'s own values of them (Transformers 5.22-5.25,
#: `modeling_utils.PreTrainedModel`; a test compares them with the installed class).
FLAGS: tuple[str, ...] = ("_supports_sdpa", "_supports_flash_attn", "_supports_flex_attn",
                          "_compatible_flash_implementations")
PRETRAINED_DEFAULTS: dict[str, object] = {"_supports_sdpa": False, "_supports_flash_attn": False,
                                          "_supports_flex_attn": False, "_compatible_flash_implementations": None}
#: Bases in Transformers that declare none of the flags and inherit none (checked by the same test), so their
#: large files (generation/utils.py) are not parsed.
NO_FLAG_BASES: frozenset[tuple[str, str]] = frozenset({
    ("transformers.generation", "GenerationMixin"), ("transformers.generation.utils", "GenerationMixin"),
})
_PRETRAINED = ("transformers.modeling_utils", "PreTrainedModel")


class _Unknown(Exception):
    """A case this reader does not understand: the caller imports the class instead."""


@dataclass
class _Module:
    name: str  # dotted, e.g. transformers.models.llama.modeling_llama
    is_package: bool
    classes: dict[str, ast.ClassDef]
    imports: dict[str, tuple[str, str | None]]  # local name -> (module, attribute or None for `import x`)


def transformers_root() -> Path | None:
    """The installed `transformers` package folder, found without importing it (None if not installed)."""
    try:
        spec = importlib.util.find_spec("transformers")
    except (ImportError, ValueError):
        return None
    locations = list(spec.submodule_search_locations or ()) if spec is not None else []
    return Path(locations[0]) if locations else None


def source_constant(module: str, name: str) -> str | None:
    """The string a module-level `NAME = "..."` of a Transformers module assigns, read from its source without
    importing it (e.g. `transformers.utils.import_utils`, `KERNELS_MIN_VERSION`); None when not found once."""
    root = transformers_root()
    if root is None or not module.startswith("transformers."):
        return None
    path = root.joinpath(*module.split(".")[1:]).with_suffix(".py")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return None
    found = re.findall(rf'^{re.escape(name)}(?:\s*:\s*str)?\s*=\s*"([^"\n]*)"\s*(?:#.*)?$', text, flags=re.MULTILINE)
    return found[0] if len(found) == 1 else None


def declared_flags(class_name: str, model_type: str | None = None) -> dict[str, object] | None:
    """`{flag: value}` for the Transformers class `class_name` (e.g. "LlamaForCausalLM"), read from source;
    None when the class is not found where `model_type` says (`models/<type>/modeling_<type>.py` or a folder
    whose name starts or ends that type) or when any step is not understood (see the module docstring)."""
    root = transformers_root()
    if root is None or not class_name.isidentifier():
        return None
    reader = _Reader(root)
    try:
        for module in _candidate_modules(root, model_type, class_name):
            info = reader.module(module)
            if info is not None and class_name in info.classes:
                return reader.flags((module, class_name))
    except (_Unknown, OSError, SyntaxError, ValueError, RecursionError):
        return None
    return None


def _candidate_modules(root: Path, model_type: str | None, class_name: str = "") -> list[str]:
    """Modeling modules that may hold `class_name` of `model_type`: the type's own folder, folders whose name is a
    prefix of the type (gemma3_text -> gemma3), then the folder the class name spells (a type reusing another
    family's class: exaone -> LlamaForCausalLM -> llama)."""
    models = root / "models"
    if not models.is_dir():
        return []
    kind = (model_type or "").replace("-", "_")
    stem = class_name
    for suffix in ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration", "Model"):
        if stem.endswith(suffix) and len(stem) > len(suffix):
            stem = stem[: -len(suffix)]
            break
    folders = [d.name for d in models.iterdir() if d.is_dir()]
    ordered = [kind] if kind in folders else []
    ordered += sorted((f for f in folders if kind and f != kind and kind.startswith(f)), key=len, reverse=True)
    ordered += [f for f in folders if f.replace("_", "") == stem.lower() and f not in ordered]
    found = []
    for folder in ordered:
        for file in dict.fromkeys((folder, kind, folder.replace("_", ""))):
            if file and (models / folder / f"modeling_{file}.py").is_file():
                found.append(f"transformers.models.{folder}.modeling_{file}")
    return found


class _Reader:
    """Parses each module once and resolves classes across Transformers' modules."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.modules: dict[str, _Module | None] = {}

    def _file(self, module: str) -> tuple[Path, bool] | None:
        parts = module.split(".")
        if parts[0] != "transformers":
            return None
        base = self.root.joinpath(*parts[1:])
        if (base / "__init__.py").is_file():
            return base / "__init__.py", True
        path = base.with_suffix(".py")
        return (path, False) if path.is_file() else None

    def module(self, name: str) -> _Module | None:
        if name in self.modules:
            return self.modules[name]
        found = self._file(name)
        info = None if found is None else _parse(name, *found)
        self.modules[name] = info
        return info

    def resolve(self, module: _Module, base: ast.expr) -> tuple[str, str] | None:
        """(module, class) a base expression names; None for a class outside Transformers (declares no flag)."""
        dotted = _dotted(base)
        if dotted is None:
            raise _Unknown(f"base {ast.dump(base)} is not a name")
        head, _, rest = dotted.partition(".")
        if not rest and head in module.classes:
            return module.name, head
        if head not in module.imports:
            if not rest and head in {"object", "ABC", "Generic"}:
                return None
            raise _Unknown(f"base {dotted} is not defined or imported in {module.name}")
        source, attribute = module.imports[head]
        if not source.startswith("transformers"):
            return None  # torch.nn.Module and the like: no Transformers attention flags
        if attribute is None or rest:
            raise _Unknown(f"base {dotted} is a module attribute")
        return self.locate(source, attribute)

    def locate(self, source: str, attribute: str, depth: int = 0) -> tuple[str, str]:
        """Where class `attribute` imported from module `source` is defined (following re-exports)."""
        if (source, attribute) == _PRETRAINED or (source, attribute) in NO_FLAG_BASES:
            return source, attribute
        target = self.module(source)
        if target is None or depth > 10:
            raise _Unknown(f"{attribute} from {source} not found")
        if attribute in target.classes:
            return source, attribute
        again, name = target.imports.get(attribute, ("", None))
        if name is None or not again.startswith("transformers"):
            raise _Unknown(f"{attribute} not found in {source}")
        return self.locate(again, name, depth + 1)

    def bases(self, key: tuple[str, str]) -> list[tuple[str, str]]:
        if key == _PRETRAINED or key in NO_FLAG_BASES:
            return []
        module = self.module(key[0])
        if module is None:
            raise _Unknown(f"module {key[0]} not found")
        node = module.classes[key[1]]
        if node.keywords:
            raise _Unknown(f"{key[1]} has class keywords (a metaclass)")
        return [found for found in (self.resolve(module, b) for b in node.bases) if found is not None]

    def mro(self, key: tuple[str, str], depth: int = 0) -> list[tuple[str, str]]:
        """C3 linearization of the Transformers classes `key` inherits from (outside classes left out)."""
        if depth > 50:
            raise _Unknown("inheritance too deep")
        bases = self.bases(key)
        sequences = [self.mro(b, depth + 1) for b in bases] + [list(bases)]
        result = [key]
        while any(sequences):
            for seq in sequences:
                if seq and not any(seq[0] in other[1:] for other in sequences):
                    head = seq[0]
                    break
            else:
                raise _Unknown(f"no consistent MRO for {key[1]}")
            result.append(head)
            sequences = [s[1:] if s and s[0] == head else s for s in sequences]
        return result

    def own_flags(self, key: tuple[str, str]) -> dict[str, object]:
        if key == _PRETRAINED:
            return dict(PRETRAINED_DEFAULTS)
        if key in NO_FLAG_BASES:
            return {}
        module = self.module(key[0])
        assert module is not None
        found: dict[str, object] = {}
        for stmt in module.classes[key[1]].body:
            if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                for name in {t.id for t in targets if isinstance(t, ast.Name)} & set(FLAGS):
                    if stmt.value is None:
                        continue  # a bare annotation binds nothing
                    found[name] = ast.literal_eval(stmt.value)  # ValueError (not a literal) -> None overall
            elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                if stmt.name in FLAGS:  # a property or method of that name
                    raise _Unknown(f"{key[1]}.{stmt.name} is not a plain class attribute")
            elif any(isinstance(n, ast.Name) and n.id in FLAGS and isinstance(n.ctx, ast.Store) for n in ast.walk(stmt)):
                raise _Unknown(f"{key[1]} sets a flag conditionally")
        return found

    def flags(self, key: tuple[str, str]) -> dict[str, object]:
        values: dict[str, object] = {}
        for cls in self.mro(key):
            for flag, value in self.own_flags(cls).items():
                values.setdefault(flag, value)
        if set(values) != set(FLAGS):
            raise _Unknown(f"{key[1]} does not inherit PreTrainedModel's flags")
        return values


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return None if inner is None else f"{inner}.{node.attr}"
    return None


def _parse(name: str, path: Path, is_package: bool) -> _Module:
    """The top-level classes and imports of one module; `_Unknown` when a flag is assigned outside a class body
    (`Model._supports_sdpa = False` at module level) or a name is bound twice in ways that disagree."""
    text = path.read_text(encoding="utf-8")
    tree = ast.parse(text, filename=str(path))
    classes: dict[str, ast.ClassDef] = {}
    imports: dict[str, tuple[str, str | None]] = {}
    ambiguous: set[str] = set()
    package = name if is_package else name.rpartition(".")[0]
    for node in _top_level(tree.body):
        if isinstance(node, ast.ClassDef):
            if node.name in classes or node.name in imports:  # e.g. defined in both arms of an `if`
                ambiguous.add(node.name)
            classes[node.name] = node
        elif isinstance(node, ast.ImportFrom):
            source = _absolute(package, node.module, node.level)
            for alias in node.names:
                imports[alias.asname or alias.name] = (source, alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                imports[alias.asname or alias.name.partition(".")[0]] = (alias.name if alias.asname else
                                                                         alias.name.partition(".")[0], None)
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and any(flag in text for flag in FLAGS):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Attribute) and t.attr in FLAGS for target in targets for t in ast.walk(target)):
                raise _Unknown(f"a flag is set at module level in {name}")
    for doubled in ambiguous:  # which binding wins depends on the run: resolving it is refused
        classes.pop(doubled, None)
        imports.pop(doubled, None)
    return _Module(name, is_package, classes, imports)


def _top_level(body: list[ast.stmt]):
    """Module-level statements, with those inside `if`/`try` blocks (optional imports) flattened in."""
    for node in body:
        if isinstance(node, ast.If):
            yield from _top_level(node.body)
            yield from _top_level(node.orelse)
        elif isinstance(node, ast.Try):
            yield from _top_level(node.body)
            for handler in node.handlers:
                yield from _top_level(handler.body)
            yield from _top_level(node.orelse)
            yield from _top_level(node.finalbody)
        else:
            yield node


def _absolute(package: str, module: str | None, level: int) -> str:
    if level == 0:
        return module or ""
    parts = package.split(".")
    if level > 1:
        parts = parts[: len(parts) - (level - 1)]
    return ".".join(parts + ([module] if module else []))

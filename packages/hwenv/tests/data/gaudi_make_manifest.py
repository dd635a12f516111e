"""Write `gaudi_bridge_1.19_manifest.json`: the *whole* public Python surface of the Gaudi bridge's modules that
hwstack and the libraries it drives touch, read from the bridge's source (not imported: it needs the Gaudi stack).

    python packages/hwenv/tests/data/gaudi_make_manifest.py /path/to/gaudi-pytorch-bridge.git [COMMIT]

The git directory is a clone of https://github.com/HabanaAI/gaudi-pytorch-bridge; COMMIT defaults to HEAD (the
1.19.0 publication, 5a56187, is the newest public source). Issue 41.8: the list is generated, never written by
hand, so "the fake has exactly the bridge's names" is not circular.

What counts as a module's public surface, statement by statement at the top level of its file (also inside
top-level `if`/`try` blocks; a name bound only under `if is_lazy():` is recorded as lazy-only):
- `def NAME` / `class NAME` (no leading underscore): a function or class defined there, with its signature;
  a class also with every public method's signature.
- `NAME = ...`: a value (constant, alias, tensor-type class made by a factory).
- `from .x import a, b` / `from habana_frameworks.torch... import a`: a re-export of the bridge's own name `a`
  (its entry comes from where it is defined); a name that is a module of the bridge is a submodule, skipped.
- `from .x import *`: every public name of `x` by these same rules (its `__all__` where it has one).
- Names bound only by importing *other* packages (`torch`, `typing`, the standard library) are not the bridge's
  API, even though a star import without `__all__` would pass them along; they are left out.
The test `tests/test_hwenv_gaudi_fake_drift.py` compares `hwenv.testing.fake_gaudi` with the file and the waivers
in `gaudi_fake_waivers.py` (each name the fake does not provide, with its reason).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = "python_packages/habana_frameworks/torch"
PACKAGE = "habana_frameworks.torch"

#: The modules whose surface is recorded: the ones issue 41.8 names (`hpu`, `hpu.graphs`, `core`, `utils`,
#: `dynamo`) and every other one the fake provides (`hpu.random`, `utils.internal`, `distributed.hccl`).
MODULES = (
    "habana_frameworks.torch.hpu",
    "habana_frameworks.torch.hpu.graphs",
    "habana_frameworks.torch.hpu.random",
    "habana_frameworks.torch.core",
    "habana_frameworks.torch.utils",
    "habana_frameworks.torch.utils.internal",
    "habana_frameworks.torch.dynamo",
    "habana_frameworks.torch.distributed.hccl",
)


def parameters(function: ast.FunctionDef | ast.AsyncFunctionDef, *, drop_first: bool = False) -> list[list]:
    """[[name, inspect kind name, default source or None], ...] as `inspect.signature` would order them."""
    args = function.args
    positional = [*args.posonlyargs, *args.args]
    defaults = [None] * (len(positional) - len(args.defaults)) + [ast.unparse(d) for d in args.defaults]
    out = []
    for index, (arg, default) in enumerate(zip(positional, defaults, strict=True)):
        kind = "POSITIONAL_ONLY" if index < len(args.posonlyargs) else "POSITIONAL_OR_KEYWORD"
        out.append([arg.arg, kind, default])
    if args.vararg:
        out.append([args.vararg.arg, "VAR_POSITIONAL", None])
    for arg, default in zip(args.kwonlyargs, args.kw_defaults, strict=True):
        out.append([arg.arg, "KEYWORD_ONLY", ast.unparse(default) if default is not None else None])
    if args.kwarg:
        out.append([args.kwarg.arg, "VAR_KEYWORD", None])
    return out[1:] if drop_first else out


def _is_static(function: ast.FunctionDef) -> bool:
    return any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in function.decorator_list)


@dataclass
class Surface:
    """One module's public names: name -> entry (without `module`), and the names bound only when lazy."""

    entries: dict[str, dict] = field(default_factory=dict)
    lazy_only: set[str] = field(default_factory=set)


class Reader:
    """Reads modules of the bridge from a git commit and resolves their public surfaces (cached)."""

    def __init__(self, git_dir: str, commit: str) -> None:
        self.git_dir, self.commit = git_dir, commit
        self.files = set(self._git("ls-tree", "-r", "--name-only", commit, "--", ROOT).split())
        self.cache: dict[str, Surface] = {}
        self.in_progress: set[str] = set()

    def _git(self, *args: str) -> str:
        return subprocess.run(["git", f"--git-dir={self.git_dir}", *args], check=True, capture_output=True,
                              text=True).stdout

    def path_of(self, module: str) -> str | None:
        """The file of a bridge module (`pkg/__init__.py` or `pkg.py`), or None when it has none."""
        if not (module == PACKAGE or module.startswith(PACKAGE + ".")):
            return None
        relative = module[len(PACKAGE):].lstrip(".").replace(".", "/")
        base = f"{ROOT}/{relative}" if relative else ROOT
        for candidate in (f"{base}/__init__.py", f"{base}.py"):
            if candidate in self.files:
                return candidate
        return None

    def is_package(self, module: str) -> bool:
        return (self.path_of(module) or "").endswith("__init__.py")

    def absolute(self, module: str, node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        parts = module.split(".")
        base = parts if self.is_package(module) else parts[:-1]
        base = base[: len(base) - (node.level - 1)]
        return ".".join(base + ([node.module] if node.module else []))

    def surface(self, module: str) -> Surface:
        if module in self.cache:
            return self.cache[module]
        if module in self.in_progress:  # an import cycle: what is known so far
            return Surface()
        self.in_progress.add(module)
        path = self.path_of(module)
        found = Surface()
        if path is not None:
            tree = ast.parse(self._git("show", f"{self.commit}:{path}"))
            explicit_all = self._all(tree)
            self._statements(module, path, tree.body, found, lazy=False)
            if explicit_all is not None:
                found.entries = {n: e for n, e in found.entries.items() if n in explicit_all}
                found.lazy_only &= set(found.entries)
        self.in_progress.discard(module)
        self.cache[module] = found
        return found

    @staticmethod
    def _all(tree: ast.Module) -> set[str] | None:
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
                return {elt.value for elt in node.value.elts if isinstance(elt, ast.Constant)}
        return None

    def _add(self, found: Surface, name: str, entry: dict, lazy: bool) -> None:
        """Bind `name`; a name bound only under `if is_lazy():` is lazy-only, any unconditional binding is not."""
        if name.startswith("_"):
            return
        known_always = name in found.entries and name not in found.lazy_only
        found.entries[name] = entry
        if not lazy:
            found.lazy_only.discard(name)
        elif not known_always:
            found.lazy_only.add(name)

    def _statements(self, module: str, path: str, body: list[ast.stmt], found: Surface, lazy: bool) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self._add(found, node.name, {"name": node.name, "kind": "function", "source": path,
                                             "line": node.lineno, "parameters": parameters(node)}, lazy)
            elif isinstance(node, ast.ClassDef):
                methods = {item.name: parameters(item, drop_first=not _is_static(item)) for item in node.body
                           if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and not item.name.startswith("_")}
                body_functions = {item.name: item for item in node.body if isinstance(item, ast.FunctionDef)}
                constructor = body_functions.get("__new__") or body_functions.get("__init__")
                self._add(found, node.name, {
                    "name": node.name, "kind": "class", "source": path, "line": node.lineno,
                    "constructor": constructor.name if constructor else None,
                    "parameters": parameters(constructor, drop_first=True) if constructor else None,
                    "methods": methods}, lazy)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Name) and target.id != "__all__":
                        entry = {"name": target.id, "kind": "value", "source": path, "line": node.lineno}
                        try:  # a literal (a variable name, a number) is recorded with its value
                            entry["value"] = ast.literal_eval(node.value) if node.value is not None else None
                        except ValueError:
                            pass
                        self._add(found, target.id, entry, lazy)
            elif isinstance(node, ast.ImportFrom):
                self._import_from(module, node, found, lazy)
            elif isinstance(node, ast.If):
                lazy_branch = "is_lazy" in ast.unparse(node.test)
                self._statements(module, path, node.body, found, lazy or lazy_branch)
                self._statements(module, path, node.orelse, found, lazy)
            elif isinstance(node, ast.Try):
                for block in (node.body, *(h.body for h in node.handlers), node.orelse, node.finalbody):
                    self._statements(module, path, block, found, lazy)

    def _import_from(self, module: str, node: ast.ImportFrom, found: Surface, lazy: bool) -> None:
        source = self.absolute(module, node)
        if self.path_of(source) is None:  # torch, typing, the standard library, a C extension: not bridge API
            return
        target = self.surface(source)
        for alias in node.names:
            if alias.name == "*":
                for name, entry in target.entries.items():
                    self._add(found, name, entry, lazy or name in target.lazy_only)
                continue
            bound = alias.asname or alias.name
            if self.path_of(f"{source}.{alias.name}") is not None:
                continue  # a submodule
            entry = target.entries.get(alias.name)
            if entry is not None:
                self._add(found, bound, entry, lazy)


def facts(reader: Reader) -> dict:
    """Behaviours the fake must share with the bridge, read from its source (issue 41.8: not only signatures).

    - `memory_stats_keys`: the dict `hpu/csrc/bindings.cpp` `get_mem_stats` returns (what `memory_stats()` and
      `mem_get_info()` read).
    - `lazy_mode_default`: `utils/internal.py` `is_lazy()`'s default for an unset `PT_HPU_LAZY_MODE`, and the
      C++ flag's default in `scripts/env_flags.yaml` (1.19: lazy; eager is the default only from 1.21.0).
    - `int64_default`: `PT_ENABLE_INT64_SUPPORT`'s default in `env_flags.yaml` (the lazy-mode default).
    - `python_reads`: every variable name the bridge's Python reads with `os.getenv` / `os.environ` in `hpu/` and
      `distributed/hccl/` (directly or through a module constant); `files_naming_habana_visible_devices`: every
      file of the bridge that names `HABANA_VISIBLE_DEVICES` (none: only the container runtime reads it).
    """
    import re

    bindings = reader._git("show", f"{reader.commit}:{ROOT}/hpu/csrc/bindings.cpp")
    block = bindings[bindings.index('m.def("get_mem_stats"'):]
    block = block[: block.index("return d;")]
    internal = reader._git("show", f"{reader.commit}:{ROOT}/utils/internal.py")
    lazy_default = re.search(r'os\.getenv\("PT_HPU_LAZY_MODE", "(\w+)"\)', internal).group(1)
    flags = reader._git("show", f"{reader.commit}:scripts/env_flags.yaml")

    def yaml_default(name: str) -> str:
        return re.search(rf"^{name}:\n(?:  .*\n)*?  default: (\S+)", flags, re.MULTILINE).group(1)

    reads: set[str] = set()
    for path in sorted(reader.files):
        if not path.endswith(".py") or not (path.startswith(f"{ROOT}/hpu/") or path.startswith(f"{ROOT}/distributed/hccl/")):
            continue
        text = reader._git("show", f"{reader.commit}:{path}")
        constants = dict(re.findall(r'^(\w+_VAR) = "(\w+)"', text, re.MULTILINE))
        constants.update({"HABANA_VISIBLE_MODULES_VAR": "HABANA_VISIBLE_MODULES", "HLS_MODULE_ID_VAR": "HLS_MODULE_ID"})
        for match in re.finditer(r'(?:os\.getenv|os\.environ\.get|os\.environ\[|environ\.get)\(?\s*"?(\w+)"?', text):
            name = match.group(1)
            reads.add(constants.get(name, name))
        reads.update(constants[n] for n in re.findall(r"(\w+_VAR) (?:not )?in os\.environ", text) if n in constants)
    naming = [line.split(":", 2)[1] for line in reader._git("grep", "-l", "HABANA_VISIBLE_DEVICES", reader.commit).splitlines()
              if line] if _grep_hits(reader, "HABANA_VISIBLE_DEVICES") else []
    return {
        "memory_stats_keys": re.findall(r'"(\w+)"_a', block),
        "lazy_mode_default": {"utils/internal.py is_lazy": lazy_default,
                              "scripts/env_flags.yaml PT_HPU_LAZY_MODE": yaml_default("PT_HPU_LAZY_MODE")},
        "int64_default": {"scripts/env_flags.yaml PT_ENABLE_INT64_SUPPORT": yaml_default("PT_ENABLE_INT64_SUPPORT")},
        "python_reads": sorted(n for n in reads if n.isupper()),
        "files_naming_habana_visible_devices": naming,
    }


def _grep_hits(reader: Reader, text: str) -> bool:
    result = subprocess.run(["git", f"--git-dir={reader.git_dir}", "grep", "-q", text, reader.commit])
    return result.returncode == 0


def build(git_dir: str, commit: str = "HEAD") -> dict:
    """The manifest of the bridge at `commit` (what `main` writes)."""
    reader = Reader(git_dir, commit)
    resolved = reader._git("rev-parse", commit).strip()
    subject = reader._git("log", "-1", "--format=%s", resolved).strip()
    entries, lazy_only = [], {}
    for module in MODULES:
        surface = reader.surface(module)
        for name in sorted(surface.entries):
            entries.append({"module": module, **surface.entries[name]})
        if surface.lazy_only:
            lazy_only[module] = sorted(surface.lazy_only)
    manifest = {
        "bridge": "HabanaAI/gaudi-pytorch-bridge",
        "bridge_version": "1.19.0",
        "commit": resolved,
        "commit_subject": subject,
        "generated_by": "packages/hwenv/tests/data/gaudi_make_manifest.py",
        "modules": list(MODULES),
        "lazy_only": lazy_only,
        "facts": facts(reader),
        "entries": entries,
    }
    return manifest


def main(git_dir: str, commit: str = "HEAD") -> None:
    manifest = build(git_dir, commit)
    out = Path(__file__).with_name("gaudi_bridge_1.19_manifest.json")
    out.write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"wrote {out} ({len(manifest['entries'])} entries from {manifest['commit'][:10]} "
          f"{manifest['commit_subject']!r})")


if __name__ == "__main__":
    main(*sys.argv[1:])

"""Write `gaudi_bridge_1.19_manifest.json`: the public gaudi-pytorch-bridge names the Gaudi fake provides,
with their signatures, read from the bridge's Python source (not imported: it needs the Gaudi stack).

    python packages/hwenv/tests/data/gaudi_make_manifest.py /path/to/gaudi-pytorch-bridge.git [COMMIT]

The git directory is a clone of https://github.com/HabanaAI/gaudi-pytorch-bridge; COMMIT defaults
to HEAD (the 1.19.0 publication, 5a56187, is the newest public source). A test
(`tests/test_hwenv_gaudi_fake_drift.py`) compares `hwenv.testing.fake_gaudi` with the file.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

ROOT = "python_packages/habana_frameworks/torch"

#: (module the fake provides it in, name, source file, methods to record for a class)
SURFACE: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    *(("habana_frameworks.torch.hpu", name, "hpu/__init__.py", ()) for name in (
        "init", "is_initialized", "is_available", "device_count", "get_device_name", "current_device",
        "synchronize", "is_bf16_supported", "get_device_properties", "set_device")),
    *(("habana_frameworks.torch.hpu", name, "hpu/memory.py", ()) for name in (
        "memory_stats", "mem_get_info", "memory_allocated", "max_memory_allocated", "reset_peak_memory_stats")),
    ("habana_frameworks.torch.hpu", "Stream", "hpu/streams.py", ("wait_stream",)),
    ("habana_frameworks.torch.hpu", "current_stream", "hpu/streams.py", ()),
    ("habana_frameworks.torch.hpu", "stream", "hpu/streams.py", ()),
    ("habana_frameworks.torch.hpu", "Event", "hpu/events.py", ()),
    ("habana_frameworks.torch.hpu.graphs", "HPUGraph", "hpu/graphs.py", ("capture_begin", "capture_end", "replay", "reset")),
    ("habana_frameworks.torch.hpu.graphs", "graph", "hpu/graphs.py", ()),
    ("habana_frameworks.torch.hpu.graphs", "wrap_in_hpu_graph", "hpu/graphs.py", ()),
    ("habana_frameworks.torch.core", "mark_step", "core/step_closure.py", ()),
    ("habana_frameworks.torch.utils.internal", "is_lazy", "utils/internal.py", ()),
    ("habana_frameworks.torch.distributed.hccl", "initialize_distributed_hpu", "distributed/hccl/__init__.py", ()),
)

#: Names `hpu/__init__.py` re-exports from `.graphs` only when `is_lazy()` ("if is_lazy(): from .graphs import *").
LAZY_ONLY = {"habana_frameworks.torch.hpu": ["HPUGraph", "graph", "wrap_in_hpu_graph"]}


def parameters(function: ast.FunctionDef, *, drop_first: bool = False) -> list[list]:
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


def entry(tree: ast.Module, module: str, name: str, source: str, methods: tuple[str, ...]) -> dict:
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return {"module": module, "name": name, "kind": "function", "source": source, "line": node.lineno,
                    "parameters": parameters(node)}
        if isinstance(node, ast.ClassDef) and node.name == name:
            body = {item.name: item for item in node.body if isinstance(item, ast.FunctionDef)}
            constructor = body.get("__new__") or body.get("__init__")
            return {
                "module": module, "name": name, "kind": "class", "source": source, "line": node.lineno,
                "constructor": constructor.name if constructor else None,
                "parameters": parameters(constructor, drop_first=True) if constructor else [],
                "methods": {method: parameters(body[method], drop_first=True) for method in methods},
            }
    raise SystemExit(f"{name} not found at the top level of {source}")


def main(git_dir: str, commit: str = "HEAD") -> None:
    def show(path: str) -> str:
        return subprocess.run(["git", f"--git-dir={git_dir}", "show", f"{commit}:{path}"], check=True,
                              capture_output=True, text=True).stdout

    resolved = subprocess.run(["git", f"--git-dir={git_dir}", "rev-parse", commit], check=True,
                              capture_output=True, text=True).stdout.strip()
    subject = subprocess.run(["git", f"--git-dir={git_dir}", "log", "-1", "--format=%s", resolved], check=True,
                             capture_output=True, text=True).stdout.strip()
    trees: dict[str, ast.Module] = {}
    entries = []
    for module, name, source, methods in SURFACE:
        path = f"{ROOT}/{source}"
        tree = trees.setdefault(path, ast.parse(show(path)))
        found = entry(tree, module, name, path, methods)
        entries.append(found)
    manifest = {
        "bridge": "HabanaAI/gaudi-pytorch-bridge",
        "bridge_version": "1.19.0",
        "commit": resolved,
        "commit_subject": subject,
        "generated_by": "packages/hwenv/tests/data/gaudi_make_manifest.py",
        "lazy_only": LAZY_ONLY,
        "entries": entries,
    }
    out = Path(__file__).with_name("gaudi_bridge_1.19_manifest.json")
    out.write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"wrote {out} ({len(entries)} entries from {resolved[:10]} {subject!r})")


if __name__ == "__main__":
    main(*sys.argv[1:])

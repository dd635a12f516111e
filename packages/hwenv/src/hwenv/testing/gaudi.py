"""`fake_gaudi` and `fake_hl_smi`: a fake `habana_frameworks` / `torch.hpu` and a fake `hl-smi` on PATH."""

from __future__ import annotations

import contextlib
import os
import stat
import sys
import tempfile
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .common import (
    DEVICE_VARIABLES,
    GiB,
    _fake_device_functions,
    _package,
    _Patches,
    clear_library_caches,
    override_versions,
)

#: Canned `hl-smi -Q index,module_id -f csv` output for an 8-Gaudi server, in the format of
#: Intel's multi-tenant guide (header `index, module_id`, a space after the comma, rows not
#: sorted by index). The mapping itself is made up for tests.
HL_SMI_CSV_8 = """index, module_id
3, 6
1, 4
2, 7
0, 5
7, 2
5, 0
6, 3
4, 1
"""

#: Environment variables that steer device selection; fakes clear them so tests start clean.

def write_fake_hl_smi(directory: str | os.PathLike, csv: str = HL_SMI_CSV_8, *, exit_code: int = 0) -> Path:
    """Write an executable `hl-smi` into `directory` that prints `csv` for `-Q index,module_id -f csv`."""
    path = Path(directory) / "hl-smi"
    path.write_text(
        f"#!{sys.executable}\n"
        "import sys\n"
        f"expected = ['-Q', 'index,module_id', '-f', 'csv']\n"
        "if sys.argv[1:] != expected:\n"
        "    print('fake hl-smi: unexpected arguments', sys.argv[1:], file=sys.stderr); sys.exit(64)\n"
        f"sys.stdout.write({csv!r})\n"
        f"sys.exit({exit_code})\n"
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


@contextlib.contextmanager
def fake_hl_smi(csv: str = HL_SMI_CSV_8, *, exit_code: int = 0) -> Iterator[Path]:
    """Put a fake `hl-smi` first on PATH for the duration."""
    patches = _Patches()
    with tempfile.TemporaryDirectory(prefix="fake-hl-smi-") as directory:
        path = write_fake_hl_smi(directory, csv, exit_code=exit_code)
        try:
            patches.setenv("PATH", f"{directory}{os.pathsep}{os.environ.get('PATH', '')}")
            yield path
        finally:
            patches.undo()


def _torch_globals_transformers_patches(torch: Any) -> list[tuple[Any, str]]:
    """The torch attributes transformers replaces on Gaudi (utils/import_utils.py, is_torch_hpu_available)."""
    return [(torch, "gather"), (torch.Tensor, "gather"), (torch, "take_along_dim"), (torch.linalg, "cholesky"),
            (torch, "scatter"), (torch.Tensor, "scatter"), (torch, "compile")]


@contextlib.contextmanager
def fake_gaudi(count: int = 8, *, name: str = "GAUDI2", memory: int = 96 * GiB, plugin_version: str = "1.22.0",
               accelerate_version: str | None = None, hl_smi: str | None = HL_SMI_CSV_8,
               lazy_mode: str | None = None) -> Iterator[types.SimpleNamespace]:
    """Install a fake `habana_frameworks` (with `.torch`, `.torch.core`, `.torch.hpu`,
    `.torch.distributed.hccl`) and `torch.hpu`, as the real plugin registers it, plus a fake
    `hl-smi` on PATH. `accelerate_version` overrides the version hwenv reads (G5 tests).
    """
    import torch

    patches = _Patches()
    names = [name] * count
    functions = _fake_device_functions(count, names, True, memory)
    # Stream/Event: torch._dynamo reads them from torch.hpu while tracing (_in_graph_classes).
    hpu = _package("habana_frameworks.torch.hpu", **functions, Stream=type("Stream", (), {}),
                   Event=type("Event", (), {}))
    core = _package("habana_frameworks.torch.core", mark_step=lambda *args, **kwargs: None)
    hccl = _package("habana_frameworks.torch.distributed.hccl")
    distributed = _package("habana_frameworks.torch.distributed", hccl=hccl)
    htorch = _package("habana_frameworks.torch", core=core, hpu=hpu, distributed=distributed)
    root = _package("habana_frameworks", torch=htorch, __version__=plugin_version)
    overrides = {"habana-torch-plugin": plugin_version}
    if accelerate_version is not None:
        overrides["accelerate"] = accelerate_version
    with contextlib.ExitStack() as stack:
        try:
            for variable in DEVICE_VARIABLES:
                patches.setenv(variable, None)
            if lazy_mode is not None:
                patches.setenv("PT_HPU_LAZY_MODE", lazy_mode)
            # transformers.is_torch_hpu_available() patches these torch globals when it first
            # returns True; save them so the fake leaves torch as it found it.
            for owner, attribute in _torch_globals_transformers_patches(torch):
                patches.setattr(owner, attribute, getattr(owner, attribute))
            for module in (root, htorch, core, hpu, distributed, hccl):
                patches.module(module.__name__, module)
            patches.setattr(torch, "hpu", hpu)
            stack.enter_context(override_versions(**overrides))
            hl_smi_path = stack.enter_context(fake_hl_smi(hl_smi)) if hl_smi is not None else None
            clear_library_caches()
            yield types.SimpleNamespace(count=count, names=names, memory=memory, hpu=hpu, modules=root,
                                        hl_smi=hl_smi_path, functions=functions)
        finally:
            patches.undo()
            clear_library_caches()



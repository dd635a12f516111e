"""What the benchmarks share: Transformers' own side kept offline, and the record every run's JSON carries.

    sys.path.insert(0, str(Path(__file__).parent))
    from bench_record import offline_transformers, stamp

    offline_transformers()            # before transformers is imported (or offline_transformers(env) for a subprocess)
    ...
    stamp(result, argv, libraries=("peft",))   # adds command, date, device, versions where the result lacks them

Nothing here imports torch or transformers at import time.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: Environment for Transformers' side of a benchmark (the anchors: plain from_pretrained, Trainer, generate,
#: `transformers serve`). transformers 5.25 turns Hub kernels on when from_pretrained gets no `use_kernels`
#: (USE_HUB_KERNELS defaults to YES; Trainer's model.train() kernelizes again) and fetches `kernels-community/...`
#: (rotary, activation, liger-kernels) from the Hub; the lent GPU machine has no network, and without this the
#: plain Trainer and `transformers serve` died offline on 2026-12-06 (hwenv.hub_kernels has the details). "NO"
#: keeps every layer's own code. hwrun passes use_kernels=False itself, so hwrun's side is the same either way.
OFFLINE_ENV = {"USE_HUB_KERNELS": "NO"}
#: Versions recorded by every run (beside the libraries a bench names).
CORE_LIBRARIES = ("torch", "transformers", "hwrun")
#: Module name -> distribution name, where they differ (for the installed-version fallback).
DISTRIBUTIONS = {"zmq": "pyzmq", "liger_kernel": "liger-kernel", "pynvml": "nvidia-ml-py", "flash_attn": "flash-attn"}
#: Environment variables worth seeing beside a result (only those set are recorded).
ENV_SHOWN = ("USE_HUB_KERNELS", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS",
             "TORCHINDUCTOR_CACHE_DIR", "NCCL_NVLS_ENABLE")


def offline_transformers(env: dict[str, str] | None = None) -> dict[str, str]:
    """Set OFFLINE_ENV (USE_HUB_KERNELS=NO) where not set already: in os.environ (call it before transformers is
    imported: Transformers reads the variable at load time, and subprocesses inherit it) or in `env`, the
    environment given to a subprocess. A value set by the caller wins. Returns the environment changed."""
    target = os.environ if env is None else env
    for name, value in OFFLINE_ENV.items():
        target.setdefault(name, value)
    return target


def command(argv: list[str] | None = None) -> list[str]:
    """The command line that ran: the interpreter, the script and its arguments (`argv` when main got one)."""
    return [sys.executable, sys.argv[0], *(sys.argv[1:] if argv is None else [str(a) for a in argv])]


def version(module: str) -> str | None:
    """`module`'s version: the imported module's __version__ (what ran), else the installed distribution's, else
    None (not installed). Imports nothing."""
    loaded = sys.modules.get(module)
    found = getattr(loaded, "__version__", None) if loaded is not None else None
    if found is not None:
        return str(found)
    try:
        return importlib.metadata.version(DISTRIBUTIONS.get(module, module))
    except importlib.metadata.PackageNotFoundError:
        return None


def device(accelerator: bool = True) -> dict:
    """The device of the run: {"kind": cuda/rocm/xpu/cpu, "name", "count"}, from torch (imported here if the bench
    did not), or the host's processor when torch is not installed or `accelerator` is False (a host-only bench:
    torch is then not imported)."""
    cpu = {"kind": "cpu", "name": platform.processor() or platform.machine(), "count": 1}
    if not accelerator:
        return cpu
    try:
        import torch
    except ImportError:
        return cpu
    try:
        if torch.cuda.is_available():  # platform-boundary: bench host record
            kind = "rocm" if getattr(torch.version, "hip", None) else "cuda"
            return {"kind": kind, "name": torch.cuda.get_device_name(0), "count": torch.cuda.device_count()}
        xpu = getattr(torch, "xpu", None)
        if xpu is not None and xpu.is_available():  # platform-boundary: bench host record
            return {"kind": "xpu", "name": xpu.get_device_name(0), "count": xpu.device_count()}
    except Exception as error:  # noqa: BLE001 - a name is nice to have, never a reason to fail
        return {**cpu, "error": f"{type(error).__name__}: {error}"}
    return cpu


def git_commit() -> str | None:
    """The checkout's commit (with "+dirty" when tracked files differ), or None outside a git tree."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return head.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def record(argv: list[str] | None = None, libraries: tuple[str, ...] = (), accelerator: bool = True) -> dict:
    """What one run's JSON says about the run: command, date (UTC, ISO), device_info (the machine's accelerator, or
    its CPU; a bench's own "device" key says where its rows ran, e.g. the CPU for --smoke), versions, host, env, git
    (`accelerator`: see device())."""
    return {
        "command": command(argv),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "device_info": device(accelerator),
        "versions": {"python": platform.python_version(),
                     **{name: version(name) for name in dict.fromkeys((*CORE_LIBRARIES, *libraries))}},
        "host": {"node": platform.node(), "machine": platform.machine(), "cpus": os.cpu_count()},
        "env": {name: os.environ[name] for name in ENV_SHOWN if name in os.environ},
        "git": git_commit(),
    }


def stamp(result: dict, argv: list[str] | None = None, libraries: tuple[str, ...] = (),
          accelerator: bool = True) -> dict:
    """Add record()'s keys to `result` where it has none of that name, in place; a bench's own keys win, and its own
    dict of that name (its "versions") gains only the entries it lacks."""
    for key, value in record(argv, libraries, accelerator).items():
        mine = result.setdefault(key, value)
        if mine is not value and isinstance(mine, dict) and isinstance(value, dict):
            for name, item in value.items():
                mine.setdefault(name, item)
    return result

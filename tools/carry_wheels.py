"""Download into .whl/ the wheels a lent GPU machine needs to run hwstack's gpu tests and benchmarks.

The GPU image (the device tool's KINDS.md) has torch, triton and CUDA but older transformers,
huggingface-hub, accelerate and peft, and no openai/starlette/uvicorn/fastapi/liger-kernel. This
script takes the versions from uv.lock (what CI tests), walks their dependencies there, keeps those the
image lacks or whose version matters, and downloads cp312 manylinux wheels for them with pip:

    python3 tools/carry_wheels.py            # then carry ".whl" in the device call
    python3 tools/carry_wheels.py --dry-run  # list what it would fetch

The device README's size limit (64 MiB per call, working tree included) is checked at the end.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.markers import Marker

ROOT = Path(__file__).resolve().parent.parent
#: What the gpu tests and the benchmarks import beyond the image's packages (uv.lock gives versions).
ROOTS = ("transformers", "kernels", "accelerate", "peft", "liger-kernel", "openai", "starlette", "uvicorn",
         "fastapi", "rich")
#: In the image already and not version-sensitive for us, or too large to carry (torch and CUDA libraries).
IMAGE_HAS = frozenset("""
torch triton numpy sympy mpmath networkx jinja2 markupsafe filelock fsspec setuptools typing-extensions pyyaml
packaging psutil tqdm certifi charset-normalizer urllib3 requests pygments markdown-it-py mdurl typing-inspection
annotated-types annotated-doc cuda-bindings cuda-pathfinder cuda-toolkit
""".split())
#: Carried even though the image has a version: ours must match uv.lock (the image's are older).
VERSION_SENSITIVE = frozenset({"transformers", "tokenizers", "safetensors", "huggingface-hub", "accelerate",
                               "peft", "hf-xet", "regex", "click", "anyio", "h11", "idna", "httpx2", "httpcore2"})
ENVIRONMENT = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
               "platform_system": "Linux", "platform_machine": "x86_64", "implementation_name": "cpython",
               "platform_python_implementation": "CPython", "os_name": "posix", "extra": ""}
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64")
LIMIT = 64 * 2**20


def locked_packages(lock: Path) -> dict[str, dict]:
    """uv.lock's packages by name (the first entry of a name: the lock resolves one version here)."""
    data = tomllib.loads(lock.read_text())
    packages: dict[str, dict] = {}
    for package in data["package"]:
        packages.setdefault(package["name"], package)
    return packages


def closure(packages: dict[str, dict], roots: tuple[str, ...]) -> list[str]:
    """Names reachable from `roots` through uv.lock's dependencies whose markers hold on the GPU machine."""
    seen: list[str] = []
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in seen or name not in packages:
            continue
        seen.append(name)
        for dep in packages[name].get("dependencies", []):
            marker = dep.get("marker")
            if marker is None or Marker(marker).evaluate(ENVIRONMENT):
                todo.append(dep["name"])
    return sorted(seen)


def to_carry(names: list[str]) -> list[str]:
    """The names worth carrying: missing from the image, or version-sensitive."""
    return [n for n in names if n in VERSION_SENSITIVE or (n not in IMAGE_HAS and not n.startswith("nvidia-"))]


def pip_python() -> str:
    """A Python that has pip: this one, its base interpreter, or `python3` on PATH (uv's venvs have no pip)."""
    import shutil

    for python in (sys.executable, getattr(sys, "_base_executable", None), shutil.which("python3")):
        if python and subprocess.run([python, "-m", "pip", "--version"], capture_output=True).returncode == 0:
            return python
    raise SystemExit("no Python with pip found: install pip, or run this script with a Python that has it")


def tree_bytes() -> int:
    """Bytes of the tracked files (they travel with every device call)."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True).stdout
    return sum((ROOT / f).stat().st_size for f in files.decode().split("\0") if f and (ROOT / f).is_file())


def main(argv: list[str] | None = None) -> int:
    """Fetch the wheels (or list them with --dry-run); exit 1 when they and the tree exceed the 64 MiB limit."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", type=Path, default=ROOT / ".whl")
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--extra", nargs="*", default=[], help="more root packages (e.g. bitsandbytes)")
    args = parser.parse_args(argv)
    packages = locked_packages(ROOT / "uv.lock")
    wanted = to_carry(closure(packages, ROOTS + tuple(args.extra)))
    pins = [f"{n}=={packages[n]['version']}" for n in wanted]
    print("\n".join(pins))
    if args.dry_run:
        return 0
    args.dest.mkdir(exist_ok=True)
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    for pin in pins:
        name = pin.split("==")[0].replace("-", "_")
        if any(args.dest.glob(f"{name}-{pin.split('==')[1]}-*.whl")):
            continue
        subprocess.run([pip_python(), "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                        "--python-version", "3.12", "--implementation", "cp", *platforms, "-d", str(args.dest), pin],
                       check=True)
    stale = [w for w in args.dest.glob("*.whl")
             if not any(w.name.lower().startswith(p.split("==")[0].replace("-", "_").lower() + "-" + p.split("==")[1])
                        for p in pins)]
    for wheel in stale:
        print(f"removing {wheel.name}: not in uv.lock's set (two versions of one package stop the install)")
        wheel.unlink()
    total = sum(w.stat().st_size for w in args.dest.glob("*.whl")) + tree_bytes()
    print(f"wheels + tracked tree: {total / 2**20:.1f} MiB of the {LIMIT // 2**20} MiB a device call carries")
    return 0 if total <= LIMIT else 1


if __name__ == "__main__":
    raise SystemExit(main())

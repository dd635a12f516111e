"""Download into .whl/ the wheels a lent GPU machine needs to run hwstack's gpu tests and benchmarks.

The GPU image (the device tool's KINDS.md) has torch, triton and CUDA but older transformers,
huggingface-hub, accelerate and peft, and no openai/starlette/uvicorn/fastapi/liger-kernel. This
script takes the versions from uv.lock (what CI tests), walks their dependencies there, keeps those the
image lacks or whose version matters, and downloads cp312 manylinux wheels for them with pip:

    python3 tools/carry_wheels.py            # then carry ".whl" in the device call
    python3 tools/carry_wheels.py --dry-run  # list what it would fetch
    python3 tools/carry_wheels.py --extra bitsandbytes  # QLoRA runs: bitsandbytes, slimmed to one CUDA build

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
         "fastapi", "rich", "httptools", "uvloop", "pyzmq", "msgspec")
#: In the image already and not version-sensitive for us, or too large to carry (torch and CUDA libraries).
#: (typing-inspection is not: the image's pydantic predates it, and the carried one failed to import without it;
#: nor annotated-types: KINDS.md's package list of the image lacks it, and `openai` failed to import on 2026-12-06.)
IMAGE_HAS = frozenset("""
torch triton numpy sympy mpmath networkx jinja2 markupsafe filelock fsspec setuptools typing-extensions pyyaml
packaging psutil tqdm certifi charset-normalizer urllib3 requests pygments markdown-it-py mdurl
annotated-doc cuda-bindings cuda-pathfinder cuda-toolkit
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
#: The CUDA build of torch in the GPU image (torch 2.11.0+cu130): the one bitsandbytes library to keep.
IMAGE_CUDA = "130"


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


def slim_bitsandbytes(wheel: Path, cuda: str = IMAGE_CUDA) -> int:
    """Rewrite bitsandbytes' wheel keeping only the native library for CUDA `cuda` and the CPU one (the wheel
    holds one per CUDA and ROCm version: 43 MB, over the carry limit beside transformers); bytes saved."""
    import zipfile

    keep = {f"libbitsandbytes_cuda{cuda}.so", "libbitsandbytes_cpu.so"}
    before = wheel.stat().st_size
    slim = wheel.with_suffix(".slim")
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(slim, "w", zipfile.ZIP_DEFLATED) as target:
        names = [n for n in source.namelist()
                 if not (Path(n).name.startswith("libbitsandbytes_") and Path(n).name not in keep)]
        if not any(Path(n).name == f"libbitsandbytes_cuda{cuda}.so" for n in names):
            raise SystemExit(f"{wheel.name} has no libbitsandbytes_cuda{cuda}.so: pick another --cuda")
        for name in names:
            data = source.read(name)
            if name.endswith(".dist-info/RECORD"):  # drop the removed files' lines
                data = b"\n".join(line for line in data.split(b"\n")
                                  if not line or line.split(b",")[0].decode() in names or line.startswith(name.encode()))
            target.writestr(name, data)
    slim.replace(wheel)
    return before - wheel.stat().st_size


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
    parser.add_argument("--cuda", default=IMAGE_CUDA, help="the CUDA build whose bitsandbytes library is kept")
    args = parser.parse_args(argv)
    packages = locked_packages(ROOT / "uv.lock")
    wanted = to_carry(closure(packages, ROOTS + tuple(args.extra)))
    pins = [f"{n}=={packages[n]['version']}" for n in wanted]
    # a wheel's file name starts with "<name with _>-<version>-" (how pip names what it downloads)
    prefixes = {pin: f"{pin.split('==')[0].replace('-', '_')}-{pin.split('==')[1]}-".lower() for pin in pins}
    print("\n".join(pins))
    if args.dry_run:
        return 0
    args.dest.mkdir(exist_ok=True)
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    for pin in pins:
        if any(w.name.lower().startswith(prefixes[pin]) for w in args.dest.glob("*.whl")):
            continue
        subprocess.run([pip_python(), "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                        "--python-version", "3.12", "--implementation", "cp", *platforms, "-d", str(args.dest), pin],
                       check=True)
    for wheel in args.dest.glob("bitsandbytes-*.whl"):
        if wheel.stat().st_size > 16 * 2**20:
            saved = slim_bitsandbytes(wheel, args.cuda)
            print(f"{wheel.name}: kept the CUDA {args.cuda} and CPU libraries only ({saved / 2**20:.0f} MiB less)")
    stale = [w for w in args.dest.glob("*.whl") if not w.name.lower().startswith(tuple(prefixes.values()))]
    for wheel in stale:
        print(f"removing {wheel.name}: not in uv.lock's set (two versions of one package stop the install)")
        wheel.unlink()
    total = sum(w.stat().st_size for w in args.dest.glob("*.whl")) + tree_bytes()
    print(f"wheels + tracked tree: {total / 2**20:.1f} MiB of the {LIMIT // 2**20} MiB a device call carries")
    return 0 if total <= LIMIT else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""Download into .whl/ the wheels a lent GPU machine needs to run hwstack's gpu tests and benchmarks.

The GPU image (the device tool's KINDS.md) has torch, triton and CUDA but older transformers,
huggingface-hub, accelerate and peft, and no openai/starlette/uvicorn/fastapi/liger-kernel. This
script takes the versions from uv.lock (what CI tests), walks their dependencies there, keeps those the
image lacks or whose version matters, and downloads cp312 manylinux wheels for them with pip:

    python3 tools/carry_wheels.py            # then carry ".whl" in the device call
    python3 tools/carry_wheels.py --dry-run  # list what it would fetch
    python3 tools/carry_wheels.py --extra bitsandbytes  # QLoRA runs: bitsandbytes, slimmed to one CUDA build
    python3 tools/carry_wheels.py --bench quantization  # also what that benchmark needs (BENCH_EXTRAS: torchao)
    python3 tools/carry_wheels.py --check    # every third-party import of tools/bench/*.py: carried or in the image?
    python3 tools/carry_wheels.py --probe tools/bench/train.py  # on the GPU machine: can its imports be found?

The device README's size limit (64 MiB per call, working tree included) is checked at the end. `--check` downloads
nothing: it parses the benchmarks' imports (ast), maps each top-level module to its distribution and reports those
neither carried (uv.lock's closure of ROOTS, plus the bench's BENCH_EXTRAS) nor in the image (IMAGE_PACKAGES); an
import guarded by `try: ... except ImportError` is reported as optional, not as missing. Exit 1 when one is missing.
"""

from __future__ import annotations

import argparse
import ast
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
#: What one benchmark needs beyond ROOTS (`--bench NAME` carries it; kept out of ROOTS for the 64 MiB a call
#: carries: torchao 3.4 MB, xgrammar 1.3 MB + apache-tvm-ffi 3.3 MB).
BENCH_EXTRAS: dict[str, tuple[str, ...]] = {
    "quantization": ("torchao",),
    "structured_output": ("xgrammar",),  # its engines' mask cost: xgrammar directly, llguidance through hwrun
    "structured_serve": ("xgrammar",),  # hwrun serve's grammar engine for response_format
}
#: The GPU image's Python packages (KINDS.md, "Python packages already there", read there on 2026-11-17): what a
#: benchmark may import without a carried wheel (IMAGE_HAS above is the part we also trust the version of).
IMAGE_PACKAGES = frozenset("""
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi
charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core cuda-pathfinder
cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools
formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna
imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver
lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe
matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals
networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime
nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13
nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft
pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments
pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist
python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image
scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six
sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile
tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm
transformers treescope triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel
wrapt xarray xxhash yarl zipp
""".split())
#: Top-level module -> distribution, where the name is not the module's with "_" as "-".
MODULE_DISTRIBUTIONS = {"zmq": "pyzmq", "pynvml": "nvidia-ml-py", "yaml": "pyyaml", "PIL": "pillow",
                        "sklearn": "scikit-learn", "cv2": "opencv-python-headless", "google": "protobuf",
                        "dateutil": "python-dateutil"}
#: The workspace's own packages: they travel as source (PYTHONPATH=packages/*/src), never as wheels.
WORKSPACE = frozenset({"hwenv", "hwattn", "hwcompile", "hwdist", "hwrun"})
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


def imports_of(path: Path) -> dict[str, bool]:
    """Top-level modules `path` imports (absolute imports only) -> whether every import of it is optional (inside a
    `try` whose handlers catch ImportError, ModuleNotFoundError, Exception or anything)."""
    optional_names = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}

    def catches_import_error(node: ast.Try) -> bool:
        for handler in node.handlers:
            kinds = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
            if any(k is None or (isinstance(k, ast.Name) and k.id in optional_names) for k in kinds):
                return True
        return False

    found: dict[str, bool] = {}

    def visit(node: ast.AST, guarded: bool) -> None:
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            names = []
        for name in names:
            top = name.split(".")[0]
            found[top] = found.get(top, True) and guarded
        if isinstance(node, ast.Try):
            inside = guarded or catches_import_error(node)
            for child in node.body:
                visit(child, inside)
            for child in [*node.handlers, *node.orelse, *node.finalbody]:
                visit(child, guarded)
            return
        for child in ast.iter_child_nodes(node):
            visit(child, guarded)

    visit(ast.parse(path.read_text(), filename=str(path)), False)
    return found


def distribution(module: str) -> str:
    """The distribution that provides top-level `module` (MODULE_DISTRIBUTIONS, else the name with "-")."""
    return MODULE_DISTRIBUTIONS.get(module, module.replace("_", "-").lower())


def check_benches(folder: Path, packages: dict[str, dict], extra: tuple[str, ...] = ()) -> list[dict]:
    """One row per (bench file, third-party module): {"bench", "module", "distribution", "optional", "status",
    "with_bench"}: status "carried" (a wheel of uv.lock's closure of ROOTS, `extra` and the bench's BENCH_EXTRAS),
    "image" (IMAGE_PACKAGES) or "missing"; with_bench: carried only with `--bench <that bench>`. The standard
    library, the workspace's packages and the folder's own modules are left out."""
    local = {p.stem for p in folder.glob("*.py")}
    base = set(closure(packages, ROOTS + tuple(extra)))
    rows = []
    for path in sorted(folder.glob("*.py")):
        carried = base | set(closure(packages, BENCH_EXTRAS.get(path.stem, ())))
        for module, optional in sorted(imports_of(path).items()):
            if module in sys.stdlib_module_names or module in WORKSPACE or module in local or module == "__future__":
                continue
            name = distribution(module)
            status = ("carried" if name in carried and to_carry([name]) else
                      "image" if name in IMAGE_PACKAGES or name in IMAGE_HAS else "missing")
            rows.append({"bench": path.name, "module": module, "distribution": name, "optional": optional,
                         "status": status, "with_bench": status == "carried" and name not in base})
    return rows


def probe(paths: list[Path]) -> list[str]:
    """The required (unguarded) third-party top-level modules of `paths` that this interpreter cannot find
    (importlib.util.find_spec; nothing is imported): run on the GPU machine before a benchmark."""
    import importlib.util

    missing = []
    for path in paths:
        local = {p.stem for p in path.parent.glob("*.py")}
        for module, optional in sorted(imports_of(path).items()):
            if optional or module in sys.stdlib_module_names or module in local or module == "__future__":
                continue
            if importlib.util.find_spec(module) is None and module not in missing:
                missing.append(module)
    return missing


def closure_gaps(packages: dict[str, dict], roots: tuple[str, ...]) -> list[str]:
    """Names in the closure of `roots` that are neither carried (to_carry) nor in the image (IMAGE_PACKAGES): a name
    in IMAGE_HAS that the image lacks (as annotated-types would have been). CUDA's nvidia-* come with torch."""
    names = closure(packages, roots)
    kept = set(to_carry(names))
    return [n for n in names if n not in kept and n not in IMAGE_PACKAGES and not n.startswith("nvidia-")]


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
    parser.add_argument("--bench", nargs="*", default=[], choices=sorted(BENCH_EXTRAS),
                        help="also carry what these benchmarks need (BENCH_EXTRAS)")
    parser.add_argument("--check", action="store_true",
                        help="report the benchmarks' third-party imports neither carried nor in the image; no download")
    parser.add_argument("--benches", type=Path, default=ROOT / "tools" / "bench", help="the folder --check reads")
    parser.add_argument("--probe", nargs="+", type=Path, metavar="SCRIPT",
                        help="list the scripts' required imports this Python cannot find; exit 1 if any (no uv.lock)")
    args = parser.parse_args(argv)
    if args.probe:
        missing = probe(args.probe)
        if missing:
            extras = sorted({b for p in args.probe for b in BENCH_EXTRAS if p.stem == b})
            hint = f" (carry_wheels.py --bench {' '.join(extras)})" if extras else ""
            print(f"not importable here: {', '.join(missing)}{hint}")
        return 1 if missing else 0
    packages = locked_packages(ROOT / "uv.lock")
    if args.check:
        rows = check_benches(args.benches, packages, tuple(args.extra))
        missing = [r for r in rows if r["status"] == "missing" and not r["optional"]]
        every = ROOTS + tuple(args.extra) + tuple(n for names in BENCH_EXTRAS.values() for n in names)
        gaps = closure_gaps(packages, every)
        for name in gaps:
            print(f"{name}: a dependency of the carried set, neither carried nor in the image (IMAGE_HAS lists it?)")
        for row in rows:
            how = row["status"] + (f" (with --bench {Path(row['bench']).stem})" if row["with_bench"] else "")
            flag = "" if row["status"] != "missing" else "optional" if row["optional"] else "MISSING"
            print(f"{row['bench']:28s} {row['module']:16s} {row['distribution']:20s} {how} {flag}".rstrip())
        print(f"{len(missing)} missing" + (": " + ", ".join(sorted({r['distribution'] for r in missing}))
                                           + " (add to ROOTS, BENCH_EXTRAS or IMAGE_PACKAGES)" if missing else ""))
        return 1 if missing or gaps else 0
    extras = tuple(args.extra) + tuple(name for bench in args.bench for name in BENCH_EXTRAS[bench])
    wanted = to_carry(closure(packages, ROOTS + extras))
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

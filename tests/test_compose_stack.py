"""Compose a custom stack from the wheels: hwenv, hwattn and hwcompile alone in a fresh venv (no hwrun,
no hwdist, no peft) run a plain PyTorch training step (examples/compose_custom_stack.py); and every
package keeps a CHANGELOG.md whose newest entry is its current version."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ["hwenv", "hwattn", "hwcompile", "hwdist", "hwrun"]
STACK = ["hwenv", "hwattn", "hwcompile"]
ABSENT = ["hwrun", "hwdist", "peft"]


def _version(package: str) -> str:
    return tomllib.loads((ROOT / "packages" / package / "pyproject.toml").read_text())["project"]["version"]


def _clean_env(**extra: str) -> dict[str, str]:
    """This environment without anything that would point uv or Python at the workspace venv."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("VIRTUAL_ENV", "UV_PROJECT_ENVIRONMENT", "PYTHONPATH", "PYTHONHOME", "CONDA_PREFIX")}
    env.update(extra)
    return env


def _run(argv: list[str], *, cwd: Path, env: dict[str, str], timeout: float) -> str:
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{argv} exited {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout + done.stderr


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[dict[str, Path]]:
    """Build the three wheels and install them, with only their locked dependencies, into a new venv.

    Everything is offline, from uv's cache (filled by `uv sync`): `uv pip install` of the wheels
    alone would need the index to resolve torch, so the exact versions and URLs come from the lock
    (`uv export --format pylock.toml` for hwattn + hwcompile, workspace members left out).
    """
    uv = shutil.which("uv")
    assert uv, "uv is needed to build the wheels and the venv (https://docs.astral.sh/uv/)"
    tmp = tmp_path_factory.mktemp("custom-stack")
    env = _clean_env()
    dist = tmp / "dist"
    for package in STACK:
        _run([uv, "build", "--offline", "--package", package, "--wheel", "-o", str(dist)], cwd=ROOT, env=env,
             timeout=180)
    lock = tmp / "pylock.toml"
    _run([uv, "export", "--frozen", "--offline", "--format", "pylock.toml", "--package", "hwattn", "--package",
          "hwcompile", "--no-dev", "--no-emit-workspace", "-o", str(lock)], cwd=ROOT, env=env, timeout=60)
    venv = tmp / "venv"
    _run([uv, "venv", "--offline", "--python", sys.executable, str(venv)], cwd=tmp, env=env, timeout=60)
    python = venv / "bin" / "python"
    _run([uv, "pip", "install", "--offline", "--python", str(python), "-r", str(lock)], cwd=tmp, env=env,
         timeout=600)
    wheels = sorted(dist.glob("*.whl"))
    _run([uv, "pip", "install", "--offline", "--python", str(python), *map(str, wheels)], cwd=tmp, env=env,
         timeout=120)
    yield {"uv": Path(uv), "python": python, "venv": venv, "dist": dist, "lock": lock, "tmp": tmp}
    shutil.rmtree(venv, ignore_errors=True)  # ~5 GB when uv has to copy instead of hardlinking from its cache


@pytest.mark.slow
@pytest.mark.facts("X6", "G13")
def test_three_wheels_alone_run_a_plain_pytorch_training_step(stack):
    wheels = sorted(p.name.split("-")[0] for p in stack["dist"].glob("*.whl"))
    assert wheels == sorted(STACK)
    locked = set(re.findall(r'^name = "([^"]+)"', stack["lock"].read_text(), flags=re.M))
    assert {"torch", "transformers"} <= locked and not locked & {*ABSENT, "accelerate", "bitsandbytes"}
    # transformers >= 5.25 requires kernels (0.19.1 <= v < 0.20) itself; before, it was hwattn's extra only
    transformers_version = re.search(r'name = "transformers"\nversion = "([^"]+)"', stack["lock"].read_text())
    assert ("kernels" in locked) == (tuple(int(p) for p in transformers_version.group(1).split(".")[:2]) >= (5, 25))

    env = _clean_env(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1",
                     PYTHONPYCACHEPREFIX=str(stack["tmp"] / "pycache"))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    probe = ("import importlib.util, json\n"
             f"names = {STACK + ABSENT!r}\n"
             "found = {n: (s.origin if (s := importlib.util.find_spec(n)) else None) for n in names}\n"
             "print(json.dumps(found))\n")
    found = json.loads(_run([str(stack["python"]), "-c", probe], cwd=stack["tmp"], env=env, timeout=60))
    for name in STACK:  # installed from the wheels into the new venv, not the workspace sources
        assert found[name] and found[name].startswith(str(stack["venv"])), (name, found[name])
    assert [name for name in ABSENT if found[name] is not None] == [], found
    for name in ABSENT:  # and really not importable
        done = subprocess.run([str(stack["python"]), "-c", f"import {name}"], cwd=stack["tmp"], env=env,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode != 0 and "ModuleNotFoundError" in done.stderr, (name, done.stderr[-500:])

    # The sibling ranges in the wheels' metadata admit the hwenv wheel next to them.
    checked = _run([str(stack["uv"]), "pip", "check", "--offline", "--python", str(stack["python"])],
                   cwd=stack["tmp"], env=env, timeout=60)
    assert "compatible" in checked
    metadata = _run([str(stack["python"]), "-c", "import importlib.metadata as m; "
                     "print(m.requires('hwattn')); print(m.requires('hwcompile'))"],
                    cwd=stack["tmp"], env=env, timeout=60)
    assert metadata.count("hwenv<0.3,>=0.2") == 2, metadata

    out = _run([str(stack["python"]), str(ROOT / "examples" / "compose_custom_stack.py"), "--steps", "3",
                "--compile", "on", "--backend", "aot_eager"], cwd=stack["tmp"], env=env, timeout=300)
    versions = ", ".join(f"{name} {_version(name)}" for name in STACK)  # as each pyproject.toml says
    assert f"installed: {versions}; not installed: hwrun, hwdist, peft" in out
    assert "device: cpu (CPU), dtype torch.float32" in out  # hwenv.detect()
    assert "attention: sdpa: auto -> sdpa" in out  # hwattn.resolve_attention / load_kwargs (X6)
    assert "compile: on; backend 'aot_eager': cpu: torch.compile backend 'aot_eager' kept" in out  # hwcompile (G13)
    losses = [float(x) for x in re.findall(r"^step \d+: loss (\S+)$", out, flags=re.M)]
    assert len(losses) == 3 and all(math.isfinite(loss) for loss in losses), out
    assert "losses finite: True" in out


def _version(package: str) -> str:
    return tomllib.loads((ROOT / "packages" / package / "pyproject.toml").read_text())["project"]["version"]


def test_every_package_keeps_a_changelog_starting_with_its_version():
    missing = [p for p in PACKAGES if not (ROOT / "packages" / p / "CHANGELOG.md").is_file()]
    assert not missing, f"packages without CHANGELOG.md: {missing}"
    for package in PACKAGES:
        text = (ROOT / "packages" / package / "CHANGELOG.md").read_text()
        headings = re.findall(r"^## (\S+)", text, flags=re.M)
        assert headings, f"{package}/CHANGELOG.md has no '## <version>' entry"
        assert headings[0] == _version(package), f"{package}: newest entry {headings[0]}, version {_version(package)}"
        assert len(text.split(f"## {headings[0]}", 1)[1].strip()) > 20, f"{package}: empty entry for {headings[0]}"


def test_every_package_reports_its_pyproject_version():
    import importlib

    for package in PACKAGES:
        assert importlib.import_module(package).__version__ == _version(package), package

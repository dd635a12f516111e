"""The Gaudi fake against the public bridge: names and signatures from a checked-in manifest.

`tests/data/gaudi_bridge_1.19_manifest.json` was read from HabanaAI/gaudi-pytorch-bridge 1.19.0
(commit 5a56187, the newest public source) by `tests/data/gaudi_make_manifest.py`; each entry
names its source file and line. This test fails when the fake gains a name the manifest lacks,
loses one it has, or a signature differs (parameter names, kinds, defaults).
"""

from __future__ import annotations

import inspect
import json
import sys
import types
from pathlib import Path

import pytest
from hwenv.testing import fake_gaudi

MANIFEST = json.loads((Path(__file__).parent / "data" / "gaudi_bridge_1.19_manifest.json").read_text())


def _parameters(callable_: object, *, drop_first: bool = False) -> list[list]:
    params = list(inspect.signature(callable_).parameters.values())
    params = params[1:] if drop_first else params
    return [[p.name, p.kind.name, None if p.default is inspect.Parameter.empty else repr(p.default)] for p in params]


def _provided() -> dict[tuple[str, str], object]:
    """Every public function and class in the fake's habana_frameworks modules."""
    out = {}
    for module_name, module in list(sys.modules.items()):
        if not module_name.startswith("habana_frameworks"):
            continue
        for name, value in vars(module).items():
            if name.startswith("_") or isinstance(value, types.ModuleType):
                continue
            if inspect.isfunction(value) or inspect.isclass(value):
                out[(module_name, name)] = value
    return out


def _expected(lazy: bool) -> dict[tuple[str, str], dict]:
    entries = {(e["module"], e["name"]): e for e in MANIFEST["entries"]}
    if lazy:  # hpu/__init__.py: "if is_lazy(): from .graphs import *"
        for module, names in MANIFEST["lazy_only"].items():
            for name in names:
                entries[(module, name)] = next(e for e in MANIFEST["entries"] if e["name"] == name)
    return entries


def test_manifest_records_the_bridge_version_and_each_source_file():
    assert MANIFEST["bridge"] == "HabanaAI/gaudi-pytorch-bridge" and MANIFEST["bridge_version"] == "1.19.0"
    assert len(MANIFEST["commit"]) == 40
    for entry in MANIFEST["entries"]:
        assert entry["source"].startswith("python_packages/habana_frameworks/torch/") and entry["line"] > 0, entry


@pytest.mark.parametrize("lazy_mode", ["0", "1"])
def test_fake_names_are_exactly_the_manifests(lazy_mode):
    with fake_gaudi(8, lazy_mode=lazy_mode) as fake:
        provided = _provided()
        assert fake.lazy is (lazy_mode == "1")
    expected = _expected(lazy_mode == "1")
    assert sorted(set(provided) - set(expected)) == [], "the fake provides names the bridge manifest lacks"
    assert sorted(set(expected) - set(provided)) == [], "the bridge manifest has names the fake lacks"


@pytest.mark.parametrize("lazy_mode", ["0", "1"])
def test_fake_signatures_match_the_bridge(lazy_mode):
    with fake_gaudi(8, lazy_mode=lazy_mode):
        provided = _provided()
    for key, entry in _expected(lazy_mode == "1").items():
        fake = provided[key]
        where = f"{key[0]}.{key[1]} ({entry['source']}:{entry['line']})"
        assert _parameters(fake) == entry["parameters"], where
        if entry["kind"] == "class":
            assert inspect.isclass(fake), where
            methods = {name for name, value in vars(fake).items() if inspect.isfunction(value) and not name.startswith("_")}
            assert methods == set(entry["methods"]), where
            for method, parameters in entry["methods"].items():
                assert _parameters(getattr(fake, method), drop_first=True) == parameters, f"{where}.{method}"
        else:
            assert inspect.isfunction(fake), where


def test_the_comparison_can_fail():
    # a fake with the old, wrong signatures would not pass: is_bf16_supported(including_emulation=True)
    def is_bf16_supported(including_emulation=True):
        return True

    entry = next(e for e in MANIFEST["entries"] if e["name"] == "is_bf16_supported")
    assert _parameters(is_bf16_supported) != entry["parameters"]

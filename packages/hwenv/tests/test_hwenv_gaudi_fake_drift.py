"""The Gaudi fake against the public bridge, generated from the bridge's source (issue 41.8).

`tests/data/gaudi_bridge_1.19_manifest.json` is written by `tests/data/gaudi_make_manifest.py` from
HabanaAI/gaudi-pytorch-bridge 1.19.0 (commit 5a56187, the newest public source): the whole public surface of
`habana_frameworks.torch.{hpu, hpu.graphs, hpu.random, core, utils, utils.internal, dynamo, distributed.hccl}`
(every public def, class, value and re-export, star imports followed, lazy-only names marked), and facts read
from the source (`memory_stats` keys from `hpu/csrc/bindings.cpp`, the lazy-mode and int64 defaults from
`utils/internal.py` and `scripts/env_flags.yaml`, the variables the bridge's Python reads). The fake must
provide each name with the bridge's signature, or `tests/data/gaudi_fake_waivers.py` must list it with a reason;
a waived name that Transformers, Accelerate, PEFT, torch's Dynamo or hwstack calls fails the test, and so does a
stale waiver, a name the bridge lacks, or a signature or behaviour that differs.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import re
import sys
import types
from pathlib import Path

import pytest
from hwenv.testing import fake_gaudi

DATA = Path(__file__).parent / "data"
MANIFEST = json.loads((DATA / "gaudi_bridge_1.19_manifest.json").read_text())
_spec = importlib.util.spec_from_file_location("gaudi_fake_waivers", DATA / "gaudi_fake_waivers.py")
waivers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(waivers)
WAIVED = waivers.waived()
#: Where a clone of the bridge may be, to check that the manifest is the generator's output (else skipped).
BRIDGE_GIT = os.environ.get("HWSTACK_GAUDI_BRIDGE_GIT", "/work/.mirror/HabanaAI+gaudi-pytorch-bridge/repo")


def _parameters(callable_: object, *, drop_first: bool = False) -> list[list]:
    params = list(inspect.signature(callable_).parameters.values())
    params = params[1:] if drop_first else params
    return [[p.name, p.kind.name, None if p.default is inspect.Parameter.empty else repr(p.default)] for p in params]


def provided() -> dict[tuple[str, str], object]:
    """Every public attribute (not a submodule) of the fake's habana_frameworks modules, now."""
    out = {}
    for module_name, module in list(sys.modules.items()):
        if not module_name.startswith("habana_frameworks"):
            continue
        for name, value in vars(module).items():
            if not name.startswith("_") and not isinstance(value, types.ModuleType):
                out[(module_name, name)] = value
    return out


def expected(lazy: bool, manifest: dict = MANIFEST) -> dict[tuple[str, str], dict]:
    """The bridge's names in this mode: `hpu/__init__.py` star-imports `.graphs` only `if is_lazy()`."""
    out = {}
    for entry in manifest["entries"]:
        if not lazy and entry["name"] in manifest["lazy_only"].get(entry["module"], ()):
            continue
        out[(entry["module"], entry["name"])] = entry
    return out


def differences(fake: dict[tuple[str, str], object], bridge: dict[tuple[str, str], dict],
                waived: dict[str, str]) -> list[str]:
    """Every way the fake differs from the bridge: missing (unwaived) names and methods, names and methods the
    bridge lacks, signatures that differ. Empty when the fake is true to the bridge."""
    found = []
    for key, entry in sorted(bridge.items()):
        dotted = ".".join(key)
        where = f"{dotted} ({entry['source']}:{entry['line']})"
        if key not in fake:
            if dotted not in waived:
                found.append(f"missing: {where} is in the bridge, not in the fake, and not waived")
            continue
        value = fake[key]
        if entry["kind"] == "function":
            if not callable(value) or _parameters(value) != entry["parameters"]:
                found.append(f"signature: {where} is {entry['parameters']} in the bridge")
        elif entry["kind"] == "class":
            if not inspect.isclass(value):
                found.append(f"kind: {where} is a class in the bridge")
                continue
            if entry["parameters"] is not None and _parameters(value) != entry["parameters"]:
                found.append(f"signature: {where} constructor is {entry['parameters']} in the bridge")
            methods = {n for n, v in vars(value).items() if inspect.isfunction(v) and not n.startswith("_")}
            for method in sorted(methods - set(entry["methods"])):
                found.append(f"extra: {dotted}.{method} is not a method of the bridge's class")
            for method, parameters in sorted(entry["methods"].items()):
                if method not in methods:
                    if f"{dotted}.{method}" not in waived:
                        found.append(f"missing: {dotted}.{method} is a method of the bridge's class, not waived")
                elif _parameters(getattr(value, method), drop_first=True) != parameters:
                    found.append(f"signature: {dotted}.{method} is {parameters} in the bridge")
        elif "value" in entry and value != entry["value"]:
            found.append(f"value: {where} is {entry['value']!r} in the bridge, {value!r} in the fake")
    for key in sorted(set(fake) - set(bridge)):
        found.append(f"extra: {'.'.join(key)} is in the fake but not a public name of the bridge")
    return found


def test_manifest_records_the_bridge_version_and_each_source_file():
    assert MANIFEST["bridge"] == "HabanaAI/gaudi-pytorch-bridge" and MANIFEST["bridge_version"] == "1.19.0"
    assert len(MANIFEST["commit"]) == 40 and MANIFEST["commit_subject"] == "Publish 1.19.0"
    for entry in MANIFEST["entries"]:
        assert entry["source"].startswith("python_packages/habana_frameworks/torch/") and entry["line"] > 0, entry
    modules = {entry["module"] for entry in MANIFEST["entries"]}
    for asked in ("hpu", "hpu.graphs", "core", "dynamo"):  # issue 41.8's list (utils has no public name)
        assert f"habana_frameworks.torch.{asked}" in modules
    assert "habana_frameworks.torch.utils" in MANIFEST["modules"]
    assert len(MANIFEST["entries"]) > 150  # the whole surface, not a hand-picked list


def test_manifest_is_the_generators_output_for_the_recorded_commit():
    """Regenerated from a clone of the bridge, the manifest is byte-for-byte the checked-in one (not hand-edited)."""
    if not Path(BRIDGE_GIT).exists():
        pytest.skip(f"no clone of HabanaAI/gaudi-pytorch-bridge at {BRIDGE_GIT} (set HWSTACK_GAUDI_BRIDGE_GIT)")
    spec = importlib.util.spec_from_file_location("gaudi_make_manifest", DATA / "gaudi_make_manifest.py")
    generator = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = generator  # its dataclasses look their module up
    try:
        spec.loader.exec_module(generator)
    finally:
        del sys.modules[spec.name]
    assert generator.build(BRIDGE_GIT, MANIFEST["commit"]) == MANIFEST


@pytest.mark.parametrize("lazy_mode", ["0", "1"])
def test_the_fake_is_the_bridge_name_for_name_or_waived(lazy_mode):
    with fake_gaudi(8, lazy_mode=lazy_mode) as fake:
        names = provided()
        assert fake.lazy is (lazy_mode == "1")
    assert differences(names, expected(lazy_mode == "1"), WAIVED) == []


def test_no_waiver_is_stale():
    """A waiver names a bridge name (or method) the fake does not provide, in some mode."""
    bridge = {".".join(key) for key in expected(True)}
    bridge |= {f"{e['module']}.{e['name']}.{m}" for e in MANIFEST["entries"] if e["kind"] == "class"
               for m in e["methods"]}
    with fake_gaudi(8, lazy_mode="1"):
        fake = {".".join(key) for key in provided()}
        fake |= {f"{'.'.join(key)}.{m}" for key, v in provided().items() if inspect.isclass(v)
                 for m, f in vars(v).items() if inspect.isfunction(f)}
    assert sorted(name for name in WAIVED if name not in bridge) == []
    assert sorted(name for name in WAIVED if name in fake) == []


def _library_sources() -> list[Path]:
    roots = []
    for package in ("transformers", "accelerate", "peft", "torch._dynamo"):
        spec = importlib.util.find_spec(package)
        if spec is not None and spec.submodule_search_locations:
            roots.append(Path(next(iter(spec.submodule_search_locations))))
    workspace = Path(__file__).resolve().parents[3] / "packages"
    roots += [path for path in workspace.glob("*/src") if path.is_dir()]
    return [path for root in roots for path in root.rglob("*.py") if "testing" not in path.parts]


#: How code reaches the bridge's names: `torch.hpu.X`, the usual aliases, a device module, an import.
_REACH = (r"(?:torch\.hpu|hthpu|htcore|htorch\.hpu|htorch\.core|hpu_graphs|device_module|torch_device_module|"
          r"habana_frameworks\.torch(?:\.\w+)*)\.{name}\b|from habana_frameworks\.torch[\w.]* import [^\n]*\b{name}\b")


def test_no_library_hwstack_drives_calls_a_waived_name():
    """Transformers 5.25, Accelerate 1.16, PEFT, torch's Dynamo and hwstack's own packages (as installed) reach
    none of the waived names; `torch.hpu.manual_seed_all` (transformers `trainer_utils.set_seed`),
    `torch.hpu.random.get_rng_state_all` (Trainer checkpoints) and the memory counters are provided instead."""
    names = sorted({key.rsplit(".", 1)[1] for key in WAIVED})
    pattern = re.compile("|".join(_REACH.format(name=re.escape(name)) for name in names))
    hits = []
    for path in _library_sources():
        text = path.read_text(errors="replace")
        if "hpu" not in text and "habana" not in text:
            continue
        hits += [f"{path}: {match.group(0)}" for match in pattern.finditer(text)]
    assert hits == []


def test_what_transformers_and_accelerate_call_on_torch_hpu_is_provided():
    """The other direction: every `torch.hpu.X` / `torch.hpu.random.X` the installed libraries name exists in
    the fake (issue 41.6: `set_seed` raised on `torch.hpu.manual_seed_all`)."""
    called = set()
    for path in _library_sources():
        text = path.read_text(errors="replace")
        called |= set(re.findall(r"torch\.hpu\.((?:random\.)?\w+)\b", text))
    with fake_gaudi(8, lazy_mode="1") as fake:
        missing = []
        for name in sorted(called):
            owner = fake.hpu
            for part in name.split("."):
                owner = getattr(owner, part, None)
            if owner is None and name not in ("empty_cache",):  # not in the bridge either (accelerate comments it out)
                missing.append(name)
    assert "manual_seed_all" in called and missing == []


# ---- behaviour, not only names: the facts the manifest read from the source ------------------------------

def test_memory_stats_has_the_bridges_keys_and_mem_get_info_reads_them():
    """`hpu/csrc/bindings.cpp` `get_mem_stats` keys; `hpu/memory.py` `mem_get_info` = (Limit - InUse, Limit)."""
    with fake_gaudi(8, memory=96 * 2**30) as fake:
        stats = fake.hpu.memory_stats()
        assert list(stats) == MANIFEST["facts"]["memory_stats_keys"]
        assert fake.hpu.mem_get_info() == (stats["Limit"] - stats["InUse"], stats["Limit"])


def test_unset_lazy_mode_on_the_published_bridge_is_its_default():
    """`utils/internal.py` `is_lazy`: `os.getenv("PT_HPU_LAZY_MODE", "1") != "0"`, and `env_flags.yaml` default 1,
    in 1.19: the fake with plugin 1.19 (and 1.20, still lazy) and the variable unset is lazy; from 1.21.0 eager."""
    defaults = MANIFEST["facts"]["lazy_mode_default"]
    assert set(defaults.values()) == {"1"}
    for version, lazy in (("1.19.0", True), ("1.20.0", True), ("1.21.0", False)):
        with fake_gaudi(8, plugin_version=version) as fake:
            assert fake.lazy is lazy and fake.modules.torch.utils.internal.is_lazy() is lazy
            assert ("HPUGraph" in vars(fake.hpu)) is lazy  # hpu/__init__.py: `if is_lazy(): from .graphs import *`


def test_int64_default_in_lazy_mode_is_the_bridges():
    """`env_flags.yaml`: `PT_ENABLE_INT64_SUPPORT` default false (the lazy-mode value); hwenv says lazy = off."""
    from hwenv.gaudi import int64_status

    assert MANIFEST["facts"]["int64_default"]["scripts/env_flags.yaml PT_ENABLE_INT64_SUPPORT"] == "false"
    assert int64_status({"PT_HPU_LAZY_MODE": "1"}, device_name="GAUDI2").enabled is False


def test_selection_variables_are_the_ones_the_bridge_reads():
    """hwenv pins a process with what the bridge's Python reads (`HLS_MODULE_ID`, `HABANA_VISIBLE_MODULES`); no
    file of the bridge names `HABANA_VISIBLE_DEVICES` (only the container runtime reads it, issue 41.3)."""
    from hwenv import select

    reads = set(MANIFEST["facts"]["python_reads"])
    assert {"HLS_MODULE_ID", "HABANA_VISIBLE_MODULES", "LOCAL_RANK", "WORLD_SIZE", "PT_HPU_LAZY_MODE"} <= reads
    assert MANIFEST["facts"]["files_naming_habana_visible_devices"] == []
    assert "HABANA_VISIBLE_DEVICES" not in reads
    env = select("hpu", "3").env({"PT_HPU_LAZY_MODE": "1"})
    assert set(env) <= reads  # every variable hwenv writes for one card is one the bridge reads


# ---- the comparison can fail --------------------------------------------------------------------------------

def test_the_comparison_finds_a_dropped_name_a_changed_default_and_an_invented_name():
    with fake_gaudi(8, lazy_mode="1"):
        names = provided()
    bridge = expected(True)
    dropped = {k: v for k, v in names.items() if k != ("habana_frameworks.torch.hpu", "manual_seed_all")}
    assert differences(dropped, bridge, WAIVED) == [
        "missing: habana_frameworks.torch.hpu.manual_seed_all (python_packages/habana_frameworks/torch/hpu/random.py:85)"
        " is in the bridge, not in the fake, and not waived"]

    def get_rng_state(device="hpu:0"):  # a changed default
        return None

    changed = dict(names)
    changed[("habana_frameworks.torch.hpu", "get_rng_state")] = get_rng_state
    assert [d.split(" (")[0] for d in differences(changed, bridge, WAIVED)] == [
        "signature: habana_frameworks.torch.hpu.get_rng_state"]
    invented = {**names, ("habana_frameworks.torch.hpu", "is_bf16_supported_v2"): get_rng_state}
    assert differences(invented, bridge, WAIVED) == [
        "extra: habana_frameworks.torch.hpu.is_bf16_supported_v2 is in the fake but not a public name of the bridge"]

"""Device platforms (issue 24): the built-in kinds as data, the registry, plug-ins, ROCm, runtime calls."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import hwenv
import pytest
from hwenv.accelerator import choose
from hwenv.platforms import Platform, get_platform, registry, runtime
from hwenv.probes import ProbeResult


def test_every_builtin_kind_is_one_platform_module():
    kinds = [p.kind for p in hwenv.platforms()]
    assert kinds == ["hpu", "xpu", "rocm", "cuda", "mps", "cpu"]  # detection order, CPU last
    for platform in hwenv.platforms():
        assert platform.probe == f"hwenv.platforms.{platform.kind}:probe"
        assert registry.origin_of(platform.kind) == f"built-in hwenv.platforms.{platform.kind}"


@pytest.mark.parametrize(("kind", "device", "backend", "graphs", "variable"), [
    ("xpu", "xpu:0", "xccl", "xpu_graphs", "ZE_AFFINITY_MASK"),
    ("hpu", "hpu", "hccl", "hpu_graphs", "HABANA_VISIBLE_MODULES"),
    ("cuda", "cuda:0", "nccl", "cuda_graphs", "CUDA_VISIBLE_DEVICES"),
    ("rocm", "cuda:0", "nccl", "cuda_graphs", "HIP_VISIBLE_DEVICES"),
    ("mps", "mps", "gloo", "none", None),
    ("cpu", "cpu", "gloo", "none", None),
])
def test_platform_facts(kind, device, backend, graphs, variable):
    platform = get_platform(kind)
    assert (platform.device, platform.dist_backend, platform.graph_api, platform.visible_devices_variable) == (
        device, backend, graphs, variable)
    assert hwenv.Accelerator(kind).device == device


def test_gaudi_compiles_with_hpu_backend_and_has_no_triton():
    hpu = get_platform("hpu")
    assert (hpu.compile_backend, hpu.lazy_mode_variable, hpu.triton, hpu.device_calls_take_index) == (
        "hpu_backend", "PT_HPU_LAZY_MODE", False, False)


def test_rocm_is_its_own_kind_named_correctly():
    accel = hwenv.Accelerator("rocm", 2, capability=(9, 4))
    assert accel.name == "AMD GPU (ROCm)" and accel.device_type == "cuda"
    assert "RCCL" in accel.platform.dist_backend_note and accel.platform.vendor == "amd"


def test_rocm_build_is_detected_as_rocm_not_cuda(fake_cuda, monkeypatch):
    import torch

    fake_cuda(count=2, name="AMD Instinct MI300X", capability=(9, 4))
    monkeypatch.setattr(torch.version, "hip", "6.4.43482")
    accel = hwenv.detect()
    assert (accel.kind, accel.count, accel.name, accel.device) == ("rocm", 2, "AMD GPU (ROCm)", "cuda:0")
    assert any(reason.startswith("cuda: this torch is a ROCm build") for reason in accel.reasons)


def test_cuda_build_is_not_rocm(fake_cuda):
    fake_cuda(count=1)
    assert hwenv.detect().kind == "cuda"


def test_unknown_kind_names_the_known_ones():
    with pytest.raises(hwenv.PlatformError, match=r"'tpu' is not a device kind hwenv knows; known kinds are hpu, xpu, rocm"):
        get_platform("tpu")
    with pytest.raises(hwenv.DeviceOverrideError, match="valid kinds are hpu, xpu, rocm, cuda, mps, cpu"):
        hwenv.Accelerator("gpu")


def _dummy(kind: str = "dummy", priority: int = 60) -> Platform:
    return Platform(kind=kind, device_type="cpu", display_name="Dummy NPU", probe="hwenv.platforms.cpu:probe",
                    priority=priority)


def test_register_refuses_a_second_platform_of_one_kind_and_unregisters():
    hwenv.register_platform(_dummy())
    try:
        assert "dummy" in [p.kind for p in hwenv.platforms()]
        with pytest.raises(hwenv.PlatformError, match="Two platforms claim the kind 'dummy'"):
            hwenv.register_platform(_dummy())
        with pytest.raises(hwenv.PlatformError, match="Two platforms claim the kind 'xpu'.*built-in hwenv.platforms.xpu"):
            hwenv.register_platform(_dummy("xpu"))
    finally:
        registry.unregister("dummy")
    assert "dummy" not in [p.kind for p in hwenv.platforms()]


@pytest.mark.parametrize(("field", "value", "message"), [
    ("kind", "Bad Kind", "lower-case identifier"),
    ("graph_api", "metal", "graph_api 'metal'"),
    ("selection_grammar", "bitmask", "selection_grammar 'bitmask'"),
    ("probe", "no_colon", "must be 'module:function'"),
])
def test_platform_data_is_validated(field, value, message):
    fields = dict(kind="dummy", device_type="cpu", display_name="D", probe="m:f", priority=1)
    fields[field] = value
    with pytest.raises(ValueError, match=message):
        Platform(**fields)


def _result(kind: str, available: bool, count: int = 1) -> ProbeResult:
    return ProbeResult(kind, available, count, reason="" if available else "absent")


def test_two_claiming_accelerators_are_an_error_and_cpu_is_the_fallback():
    with pytest.raises(hwenv.PlatformConflictError, match=r"Intel GPU \(XPU\) \(xpu, 2 device\(s\)\) and NVIDIA"):
        choose({"xpu": _result("xpu", True, 2), "cuda": _result("cuda", True), "cpu": _result("cpu", True)})
    accel = choose({"xpu": _result("xpu", False), "cuda": _result("cuda", False), "cpu": _result("cpu", True)})
    assert accel.kind == "cpu" and accel.reasons == ("xpu: absent", "cuda: absent")


# ---- plug-ins through the hwstack.platforms entry-point group, in a child process -------------

PLUGIN_MODULE = '''
from hwenv.platforms import Platform
from hwenv.probes import ProbeResult

PLATFORM = Platform(kind="npu", device_type="npu", display_name="Dummy NPU", probe="hwstack_dummy:probe",
                    priority=60, visible_devices=("NPU_VISIBLE_DEVICES",), selection_grammar="indices",
                    dist_backend="gloo", vendor="dummy")
DUPLICATE = Platform(kind="xpu", device_type="xpu", display_name="Fake XPU", probe="hwstack_dummy:probe", priority=5)


def probe():
    import os
    if os.environ.get("DUMMY_NPU") == "1":
        return ProbeResult("npu", True, 2, ("Dummy NPU 0", "Dummy NPU 1"), True)
    return ProbeResult("npu", False, reason="DUMMY_NPU is not 1")


def broken():
    raise RuntimeError("the vendor runtime is missing")
'''


def _install_plugin(root: Path, entry_points: str) -> dict[str, str]:
    """A dummy distribution on a path entry: its module and a dist-info with entry_points.txt."""
    (root / "hwstack_dummy.py").write_text(PLUGIN_MODULE)
    info = root / "hwstack_dummy-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: hwstack-dummy\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[hwstack.platforms]\n{entry_points}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HWENV_", "ZE_", "HABANA_", "CUDA_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
    return env


def _child(code: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                          timeout=120, check=False)


def test_an_installed_plugin_adds_a_kind(tmp_path):
    env = _install_plugin(tmp_path, "npu = hwstack_dummy:PLATFORM")
    code = """
        import hwenv
        print([p.kind for p in hwenv.platforms()])
        print(hwenv.get_platform("npu").display_name, hwenv.platforms.origin_of("npu"))
        print(hwenv.select("npu", None).variable)
    """
    out = _child(code, env)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "['hpu', 'xpu', 'rocm', 'cuda', 'mps', 'npu', 'cpu']"
    assert lines[1] == "Dummy NPU plug-in 'npu' (hwstack_dummy:PLATFORM, group hwstack.platforms)"
    assert lines[2] == "NPU_VISIBLE_DEVICES"
    # detection asks the plug-in too, and HWENV_DEVICE is validated against the registry
    claimed = _child("import hwenv; a = hwenv.detect(); print(a.kind, a.count, a.name)", {**env, "DUMMY_NPU": "1"})
    assert claimed.stdout.strip() == "npu 2 Dummy NPU", claimed.stderr
    chosen = _child("import hwenv; print(hwenv.detect().kind)", {**env, "HWENV_DEVICE": "npu", "DUMMY_NPU": "1"})
    assert chosen.stdout.strip() == "npu", chosen.stderr
    refused = _child("import hwenv; hwenv.detect()", {**env, "HWENV_DEVICE": "npu"})
    assert "HWENV_DEVICE='npu' asks for Dummy NPU, but it is not usable here: DUMMY_NPU is not 1" in refused.stderr
    doctor = subprocess.run([sys.executable, "-m", "hwenv.cli", "doctor", "--json"], env={**env, "DUMMY_NPU": "1"},
                            capture_output=True, text=True, timeout=120, check=False)
    report = json.loads(doctor.stdout)
    assert report["accelerator"]["kind"] == "npu"
    assert "Platform 'npu' comes from plug-in 'npu' (hwstack_dummy:PLATFORM, group hwstack.platforms)." in report["notes"]


def test_a_plugin_that_reuses_a_builtin_kind_is_refused_naming_both(tmp_path):
    env = _install_plugin(tmp_path, "xpu = hwstack_dummy:DUPLICATE")
    out = _child("import hwenv; hwenv.platforms()", env)
    assert out.returncode != 0
    assert ("Two platforms claim the kind 'xpu': built-in hwenv.platforms.xpu and plug-in 'xpu' "
            "(hwstack_dummy:DUPLICATE, group hwstack.platforms)") in out.stderr


def test_a_broken_plugin_is_reported_not_fatal(tmp_path):
    env = _install_plugin(tmp_path, "npu = hwstack_dummy:broken")
    out = _child("""
        import hwenv
        print([p.kind for p in hwenv.platforms()])
        print(hwenv.diagnose().to_dict()["problems"][-1]["code"])
    """, env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["['hpu', 'xpu', 'rocm', 'cuda', 'mps', 'cpu']", "platform-plugin-failed"]
    assert "the vendor runtime is missing" in out.stderr  # logged with its reason


# ---- runtime calls go through the platform -----------------------------------------------------

def test_graph_tools_follow_the_platform():
    import torch

    assert runtime.graph_tools(get_platform("cuda")).graph_class is torch.cuda.CUDAGraph
    assert runtime.graph_tools(get_platform("rocm")).graph_class is torch.cuda.CUDAGraph
    xpu = runtime.graph_tools(get_platform("xpu"))
    assert xpu.graph_class is torch.xpu.XPUGraph and xpu.capture is torch.xpu.graph
    assert runtime.graph_tools(get_platform("cpu")) is None and runtime.graph_tools(get_platform("hpu")) is None


def test_gaudi_runtime_calls_take_no_device(fake_gaudi):
    fake = fake_gaudi(count=1)
    calls = []
    fake.hpu.synchronize = lambda *args: calls.append(("synchronize", args))
    fake.hpu.mem_get_info = lambda *args: calls.append(("mem_get_info", args)) or (1, 96 * 2**30)
    runtime.synchronize(get_platform("hpu"), "hpu:0")
    assert runtime.mem_get_info(get_platform("hpu"), 0) == (1, 96 * 2**30)
    assert calls == [("synchronize", ()), ("mem_get_info", ())]


def test_cpu_runtime_calls_are_no_ops():
    cpu = get_platform("cpu")
    assert runtime.device_module(cpu) is None and runtime.mem_get_info(cpu) is None
    runtime.synchronize(cpu)  # nothing to wait for


def test_import_hwenv_loads_no_submodule_and_no_torch():
    code = "import sys, hwenv; print(sorted(m for m in sys.modules if m.startswith('hwenv.')), 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[] False"


# ---- selection follows the platform's grammar: ROCm takes indices in its own variable -----------

def test_rocm_selection_writes_hip_visible_devices():
    selection = hwenv.select("rocm", "1,0")
    assert (selection.devices, selection.count, selection.variable) == (("1", "0"), 2, "HIP_VISIBLE_DEVICES")
    assert selection.env() == {"HIP_VISIBLE_DEVICES": "1,0"}
    with pytest.raises(hwenv.SelectionError, match=r"HIP_VISIBLE_DEVICES='0,4' names device 4, but only 2"):
        hwenv.select("rocm", "0,4", device_count=2)


def test_rocm_current_selection_reads_hip_before_cuda():
    env = {"HIP_VISIBLE_DEVICES": "2", "CUDA_VISIBLE_DEVICES": "0,1"}
    assert hwenv.current_selection("rocm", env).devices == ("2",)
    assert hwenv.current_selection("rocm", {"CUDA_VISIBLE_DEVICES": "0,1"}).devices == ("0", "1")
    assert hwenv.current_selection("cuda", env).devices == ("0", "1")


def test_a_kind_without_selection_names_the_selectable_kinds():
    with pytest.raises(hwenv.SelectionError, match=r"mps has no device selection.*--kind hpu\|xpu\|rocm\|cuda"):
        hwenv.select("mps", "0")


def test_every_public_name_resolves_lazily():
    missing = [name for name in hwenv.__all__ if name != "__version__" and getattr(hwenv, name, None) is None]
    assert not missing
    assert callable(hwenv.platforms) and hwenv.platforms.get_platform is get_platform  # package and call

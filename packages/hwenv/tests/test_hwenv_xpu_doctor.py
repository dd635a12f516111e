"""hwenv doctor's Intel GPU checks: hierarchy, masks per hierarchy, torch wheel variant, XCCL, retired Intel
add-ons, free-memory query and fp64."""

import importlib
import sys

import pytest
from hwenv import ProbeResult, diagnose
from hwenv.doctor.xpu_checks import intel_gpu_driver, xpu_checks
from hwenv.testing import fake_cuda, override_versions

checks_module = importlib.import_module("hwenv.doctor.xpu_checks")  # the module; hwenv.doctor.xpu_checks is the function


def codes(report):
    return [problem.code for problem in report.problems]


def problem(report, code):
    return next(p for p in report.problems if p.code == code)


def test_hierarchy_note_says_the_value_and_whether_it_is_the_default(fake_xpu, monkeypatch):
    fake_xpu(2)
    notes = [n for n in diagnose().notes if "device hierarchy" in n]
    assert len(notes) == 1 and "unset" in notes[0] and "driver default, FLAT" in notes[0]
    monkeypatch.setenv("ZE_FLAT_DEVICE_HIERARCHY", "COMPOSITE")
    assert any("ZE_FLAT_DEVICE_HIERARCHY=COMPOSITE (set in the environment)" in n for n in diagnose().notes)


def test_invalid_hierarchy_is_an_error_naming_it(fake_xpu, monkeypatch):
    fake_xpu(1)
    monkeypatch.setenv("ZE_FLAT_DEVICE_HIERARCHY", "flat")
    report = diagnose()
    assert "'flat'" in problem(report, "invalid-device-hierarchy").message
    assert problem(report, "invalid-device-hierarchy").severity == "error"


def test_subdevice_mask_is_invalid_under_flat_and_fine_under_composite(fake_xpu, monkeypatch):
    fake_xpu(2, tiles=2)
    monkeypatch.setenv("ZE_AFFINITY_MASK", "0.1")
    monkeypatch.setenv("ZE_ENABLE_PCI_ID_DEVICE_ORDER", "1")
    message = problem(diagnose(), "invalid-affinity-mask").message
    assert "ZE_FLAT_DEVICE_HIERARCHY=FLAT" in message and "COMPOSITE" in message
    monkeypatch.setenv("ZE_FLAT_DEVICE_HIERARCHY", "COMPOSITE")
    assert "invalid-affinity-mask" not in codes(diagnose())


def _render_nodes(tmp_path, vendor):
    dev, sys_drm = tmp_path / "dev_dri", tmp_path / "sys_drm"
    dev.mkdir()
    (dev / "renderD128").touch()
    (sys_drm / "renderD128" / "device").mkdir(parents=True)
    (sys_drm / "renderD128" / "device" / "vendor").write_text(f"{vendor}\n")
    return dev, sys_drm


def test_intel_gpu_driver_evidence(tmp_path):
    dev, sys_drm = _render_nodes(tmp_path, "0x8086")
    assert "Intel GPU render node" in intel_gpu_driver(dev, sys_drm, which=lambda name: None)
    nvidia = tmp_path / "nvidia"
    nvidia.mkdir()
    dev, sys_drm = _render_nodes(nvidia, "0x10de")
    assert intel_gpu_driver(dev, sys_drm, which=lambda name: None) is None
    assert intel_gpu_driver(tmp_path / "absent", sys_drm, which=lambda name: "/usr/bin/xpu-smi") == "xpu-smi is on PATH"


def test_this_cpu_machine_gets_no_torch_variant_alarm(clean_device_env):
    assert intel_gpu_driver() is None  # no xpu-smi, no Intel render node here
    assert "torch-without-xpu" not in codes(diagnose())


def _unavailable_xpu():
    return {"xpu": ProbeResult("xpu", False, reason="torch.xpu.is_available() is False (this torch build has no XPU "
                                                    "backend)", details={"torch.version.xpu": "None"})}


def test_cuda_wheel_on_an_intel_gpu_machine_names_the_variant(monkeypatch):
    monkeypatch.setattr(checks_module, "intel_gpu_driver", lambda: "/dev/dri/renderD128 is an Intel GPU render node")
    with override_versions(torch="2.15.0+cu132"):
        problems, _ = xpu_checks(None, _unavailable_xpu(), {})
    (found,) = [p for p in problems if p.code == "torch-without-xpu"]
    assert "+cu132" in found.message and "'+xpu'" in found.message and found.severity == "warning"
    assert "download.pytorch.org/whl/xpu" in found.fix
    monkeypatch.setattr(checks_module, "intel_gpu_driver", lambda: "xpu-smi is on PATH")
    with override_versions(torch="2.15.0+cpu"):
        (found,) = [p for p in xpu_checks(None, _unavailable_xpu(), {})[0] if p.code == "torch-without-xpu"]
    assert "+cpu" in found.message and found.severity == "error"


def test_intel_igpu_beside_the_nvidia_gpu_in_use_is_no_problem(monkeypatch):
    import hwenv

    monkeypatch.setattr(checks_module, "intel_gpu_driver", lambda: "/dev/dri/renderD129 is an Intel GPU render node")
    with fake_cuda(1):
        acc = hwenv.detect()
    assert acc.kind == "cuda"
    assert "torch-without-xpu" not in [p.code for p in xpu_checks(acc, _unavailable_xpu(), {})[0]]


def test_xccl_text_says_torch_2_8(fake_xpu):
    fake_xpu(2)
    with override_versions(torch="2.7.1+xpu"):
        message = problem(diagnose(), "xccl-missing").message
    assert "from torch 2.8" in message and "#1318" in message and "#141741" in message
    with override_versions(torch="2.8.0+xpu"):
        assert "xccl-missing" not in codes(diagnose())


@pytest.mark.parametrize(("module", "words"), [
    ("intel_extension_for_pytorch", "built-in XPU support"),
    ("oneccl_bindings_for_pytorch", "built-in xccl backend"),
])
def test_retired_intel_packages_are_found_without_importing_them(module, words, tmp_path, monkeypatch,
                                                                   clean_device_env):
    package = tmp_path / module
    package.mkdir()
    (package / "__init__.py").write_text("raise RuntimeError('imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    report = diagnose()
    found = [p for p in report.problems if p.code == "retired-intel-package"]
    assert len(found) == 1 and module in found[0].message and words in found[0].message
    assert "retired" in found[0].message and module not in sys.modules


def test_no_retired_package_alarm_here(clean_device_env):
    assert "retired-intel-package" not in codes(diagnose())


def test_memory_query_and_fp64_problems(fake_xpu):
    fake_xpu(1, integrated=True, fp64=False)
    report = diagnose()
    assert "device_map='auto'" in problem(report, "xpu-memory-unknown").message
    assert "max_memory" in problem(report, "xpu-memory-unknown").fix
    assert "has_fp64 is False" in problem(report, "xpu-no-fp64").message


def test_a_discrete_xpu_has_none_of_them(fake_xpu):
    fake_xpu(4)
    found = codes(diagnose())
    assert not {"xpu-memory-unknown", "xpu-no-fp64", "xccl-missing", "invalid-device-hierarchy"} & set(found)


def test_a_discrete_card_without_sysman_cannot_report_free_memory_and_the_fix_says_so(fake_xpu, monkeypatch):
    """Issue 41.6: the free-memory aspect `torch.xpu.mem_get_info` reads "may need ZES_ENABLE_SYSMAN=1", on any card
    (intel/llvm `sycl/doc/extensions/supported/sycl_ext_intel_device_info.md`, "Free Global Memory"); it is not only
    integrated GPUs that fail. The fake's `needs_sysman=True` card reports it only with the variable set."""
    import hwenv

    fake_xpu(2, needs_sysman=True)  # a discrete card
    found = problem(diagnose(), "xpu-memory-unknown")
    assert "(a discrete GPU)" in found.message and "ZES_ENABLE_SYSMAN is not set here" in found.message
    assert found.fix.startswith("set ZES_ENABLE_SYSMAN=1 for the run and check again")
    assert "ZES_ENABLE_SYSMAN=1 may enable it" in hwenv.detect().memory_source
    monkeypatch.setenv("ZES_ENABLE_SYSMAN", "1")
    assert "xpu-memory-unknown" not in codes(diagnose())
    assert hwenv.detect().memory_source.startswith("torch.xpu.mem_get_info")

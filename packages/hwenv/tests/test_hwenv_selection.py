"""Selections and their environments (X4, X5, G4, G6, G8)."""

import pytest
from hwenv import SelectionError, current_selection, parse_hl_smi_csv, select
from hwenv.errors import AffinityMaskError, GaudiGroupError
from hwenv.testing import HL_SMI_CSV_8

ROWS = parse_hl_smi_csv(HL_SMI_CSV_8)


@pytest.mark.facts("X4", "X5")
def test_xpu_selection_sets_mask_and_pci_order():
    selection = select("xpu", "0,2")
    assert selection.env() == {"ZE_AFFINITY_MASK": "0,2", "ZE_ENABLE_PCI_ID_DEVICE_ORDER": "1"}
    assert selection.count == 2


@pytest.mark.facts("X5")
def test_xpu_pci_order_opt_out_and_no_devices():
    assert select("xpu", "1", pci_order=False).env() == {"ZE_AFFINITY_MASK": "1"}
    assert select("xpu").env() == {"ZE_ENABLE_PCI_ID_DEVICE_ORDER": "1"}
    assert select("xpu").count is None


def test_xpu_bad_mask_and_too_few_devices():
    with pytest.raises(AffinityMaskError):
        select("xpu", "0,,2")
    with pytest.raises(AffinityMaskError, match="only 2"):
        select("xpu", "0,2", device_count=2)


@pytest.mark.facts("G4", "G6")
def test_gaudi_selection_uses_module_ids_and_int64(clean_device_env, override_versions):
    # int64 is written only for an eager-mode child (bridge env_flags.yaml); PT_HPU_LAZY_MODE is
    # unset here and plugin 1.22 defaults to eager. Lazy mode: tests/test_hwenv_gaudi_selection.py.
    override_versions(habana_torch_plugin="1.22.0")
    selection = select("hpu", "5,4,7,6")
    assert selection.env() == {"HABANA_VISIBLE_MODULES": "5,4,7,6", "PT_ENABLE_INT64_SUPPORT": "1"}
    assert select("hpu").env() == {"PT_ENABLE_INT64_SUPPORT": "1"}


@pytest.mark.facts("G6", "G7")
def test_gaudi_indices_are_translated_to_module_ids():
    # hl-smi rows: index 3 -> module 6, index 2 -> module 7
    assert select("hpu", "3,2", by="index", hl_smi_rows=ROWS).devices == ("6", "7")


@pytest.mark.facts("G8")
@pytest.mark.parametrize("devices", ["0,1,2", "0,1,2,3,4", "0,2"])
def test_gaudi_unsupported_groups(devices):
    # multi-card selections only: one card is a standard run (test_hwenv_gaudi_selection.py)
    with pytest.raises(GaudiGroupError):
        select("hpu", devices)


@pytest.mark.facts("G6")
def test_gaudi_apply_drops_inherited_device_indices():
    env = select("hpu", "0,1").apply({"HABANA_VISIBLE_DEVICES": "4,5", "PATH": "/bin"})
    assert "HABANA_VISIBLE_DEVICES" not in env
    assert env["HABANA_VISIBLE_MODULES"] == "0,1" and env["PATH"] == "/bin"


@pytest.mark.facts("G6")
def test_both_gaudi_variables_must_agree():
    # indices 5,4 are modules 0,1 by hl-smi
    agreeing = {"HABANA_VISIBLE_MODULES": "0,1", "HABANA_VISIBLE_DEVICES": "5,4"}
    assert current_selection("hpu", agreeing, hl_smi_rows=ROWS).devices == ("0", "1")
    disagreeing = {"HABANA_VISIBLE_MODULES": "0,1", "HABANA_VISIBLE_DEVICES": "0,1"}
    with pytest.raises(SelectionError, match="disagree"):
        current_selection("hpu", disagreeing, hl_smi_rows=ROWS)


def test_current_selection_reads_xpu_and_cuda():
    assert current_selection("xpu", {"ZE_AFFINITY_MASK": "1,0"}).devices == ("1", "0")
    assert current_selection("cuda", {"CUDA_VISIBLE_DEVICES": "3"}).env() == {"CUDA_VISIBLE_DEVICES": "3"}


@pytest.mark.parametrize(("kind", "devices"), [("cpu", "0"), ("tpu", "0"), ("cuda", "a"), ("hpu", "")])
def test_bad_selections(kind, devices):
    with pytest.raises(SelectionError):
        select(kind, devices)

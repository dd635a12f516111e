"""Gaudi selections as the bridge and Intel's docs have them (INTEL.md S8, S9, S11, S13; issue 23 points 1-2).

- one card is a standard run: no 2/4-card group rule, no hl-smi;
- several cards are a distributed run on part of a server: Intel's groups only;
- with no selection, process r uses module r (HABANA_VISIBLE_MODULES: the r-th listed module);
- HLS_MODULE_ID, the bridge's per-process pin, wins here and is not inherited by a child;
- one card is pinned with HLS_MODULE_ID (issue 41.4: bridge `backend/synapse_helpers/device.cpp` acquires the
  pinned module, else any free card; `_setup_module_id` pins only ranks of a distributed run);
- HABANA_VISIBLE_DEVICES is read only when a container starts (issue 41.3: HabanaAI/habana-container-runtime
  `cmd/habana-container-runtime-hook/container_config.go`), so an index is also written as its module's pin.
"""

from __future__ import annotations

import pytest
from hwenv import (
    GaudiGroupError,
    GaudiModulePinError,
    SelectionError,
    current_selection,
    parse_hl_smi_csv,
    select,
)
from hwenv.gaudi import check_group, module_pin, modules_for_processes
from hwenv.testing import HL_SMI_CSV_8

ROWS = parse_hl_smi_csv(HL_SMI_CSV_8)
EAGER = {"PT_HPU_LAZY_MODE": "0"}


# ---- point 1: single-card runs -------------------------------------------------------------

@pytest.mark.facts("G6", "G8")
@pytest.mark.parametrize("card", ["0", "3", "5", "7"])
def test_one_module_is_a_valid_selection(card):
    selection = select("hpu", card)
    assert selection.devices == (card,) and selection.count == 1
    assert selection.env(EAGER) == {"HABANA_VISIBLE_MODULES": card, "HLS_MODULE_ID": card,
                                    "PT_ENABLE_INT64_SUPPORT": "1"}


@pytest.mark.facts("G6")
def test_one_module_is_pinned_because_an_unpinned_process_takes_any_free_card():
    """Issue 41.4: bridge 1.19 `device.cpp` acquires `HLS_MODULE_ID`'s module, else any free card
    (`synDeviceAcquireByDeviceType`); `_setup_module_id` pins only when world size > 1, and Accelerate's
    `PartialState` / `.to("hpu")` never call `set_device`. Several modules are left to the ranks' own pins."""
    assert select("hpu", "6").env({"PT_HPU_LAZY_MODE": "1"}) == {"HABANA_VISIBLE_MODULES": "6", "HLS_MODULE_ID": "6"}
    assert "HLS_MODULE_ID" not in select("hpu", "0,1").env(EAGER)
    child = select("hpu", "6").apply({"HLS_MODULE_ID": "2", "PT_HPU_LAZY_MODE": "1"})
    assert child["HLS_MODULE_ID"] == "6"  # the selection's pin, not the inherited one


def test_one_device_index_is_written_for_the_container_and_pinned_by_its_module():
    """Issue 41.3: `HABANA_VISIBLE_DEVICES` is read by the habana container runtime's OCI hook when a container
    starts (habana-container-runtime `container_config.go` `getDevicesFromEnvvar`), never by the bridge; the
    runtime then sets `HABANA_VISIBLE_MODULES` in the container. So the index stays for a container start and
    its module (hl-smi: index 4 is module 1) is what a child process is pinned to."""
    selection = select("hpu", "4", by="index", hl_smi_rows=ROWS)
    assert selection.devices == ("4",) and selection.by == "index" and selection.variable == "HABANA_VISIBLE_DEVICES"
    assert selection.modules == ("1",) and selection.selects_in_process and not selection.note
    assert selection.env(EAGER) == {"HABANA_VISIBLE_DEVICES": "4", "HABANA_VISIBLE_MODULES": "1",
                                    "HLS_MODULE_ID": "1", "PT_ENABLE_INT64_SUPPORT": "1"}


def test_an_index_hl_smi_cannot_map_says_it_selects_nothing_in_a_process(monkeypatch):
    def no_hl_smi():
        raise FileNotFoundError("hl-smi not found")

    monkeypatch.setattr("hwenv.gaudi.selecting.read_hl_smi", no_hl_smi)
    selection = select("hpu", "4", by="index")
    assert selection.env(EAGER) == {"HABANA_VISIBLE_DEVICES": "4", "PT_ENABLE_INT64_SUPPORT": "1"}
    assert not selection.selects_in_process
    assert "read only by the habana container runtime when a container starts" in selection.note
    assert "hl-smi could not map device index 4" in selection.note and "Fix: pass the module ID" in selection.note
    assert select("hpu", "4").selects_in_process and select("hpu", "4").note == ""


@pytest.mark.facts("G6")
@pytest.mark.parametrize("variable", ["HABANA_VISIBLE_MODULES", "HABANA_VISIBLE_DEVICES"])
def test_one_card_container_is_read(monkeypatch, variable):
    monkeypatch.setattr("hwenv.gaudi.selecting.read_hl_smi", lambda: pytest.fail("hl-smi must not be read"))
    selection = current_selection("hpu", {variable: "3"})
    assert selection.devices == ("3",) and selection.count == 1 and selection.variable == variable


def test_check_group_passes_one_card_and_still_refuses_a_missing_module():
    for card in range(8):
        check_group((card,))
    with pytest.raises(GaudiGroupError, match="do not exist"):
        check_group((9,))
    with pytest.raises(GaudiGroupError, match="do not exist"):
        select("hpu", "12")


@pytest.mark.facts("G8")
@pytest.mark.parametrize("devices", ["0,2", "1,2", "0,1,2", "3,4,5,6", "0,1,2,3,4"])
def test_multi_card_groups_outside_intels_table_are_refused_naming_the_supported_groups(devices):
    with pytest.raises(GaudiGroupError, match="distributed run") as error:
        select("hpu", devices)
    assert "{0,1} or {2,3} or {4,5} or {6,7}" in str(error.value) and "{0,1,2,3} or {4,5,6,7}" in str(error.value)


def test_several_indices_are_still_mapped_and_checked():
    # hl-smi rows: index 5 -> module 0, index 4 -> module 1; index 3 -> 6, index 0 -> 5 (not a group)
    assert select("hpu", "5,4", by="index", hl_smi_rows=ROWS).devices == ("0", "1")
    with pytest.raises(GaudiGroupError):
        select("hpu", "3,0", by="index", hl_smi_rows=ROWS)


# ---- point 2: which modules N processes use ------------------------------------------------

@pytest.mark.facts("G8", "G16")
@pytest.mark.parametrize(("nproc", "modules"), [(1, (0,)), (2, (0, 1)), (4, (0, 1, 2, 3)), (8, tuple(range(8)))])
def test_module_id_is_the_local_rank(nproc, modules):
    assert modules_for_processes(nproc, {}) == modules


def test_visible_modules_position_is_the_local_rank():
    assert modules_for_processes(2, {"HABANA_VISIBLE_MODULES": "5,4,7,6"}) == (5, 4)
    assert modules_for_processes(4, {"HABANA_VISIBLE_MODULES": "5,4,7,6"}) == (5, 4, 7, 6)
    with pytest.raises(SelectionError, match="lists 2"):
        modules_for_processes(3, {"HABANA_VISIBLE_MODULES": "0,1"})


def test_two_processes_with_no_selection_are_a_supported_group_three_are_not():
    check_group(modules_for_processes(2, {}))
    with pytest.raises(GaudiGroupError):
        check_group(modules_for_processes(3, {}))


def test_hls_module_id_wins_for_one_process_and_is_refused_for_several():
    assert modules_for_processes(1, {"HLS_MODULE_ID": "6", "HABANA_VISIBLE_MODULES": "6,7"}) == (6,)
    with pytest.raises(GaudiModulePinError, match="all 2 processes would open module 6"):
        modules_for_processes(2, {"HLS_MODULE_ID": "6"})
    with pytest.raises(GaudiModulePinError, match="not in HABANA_VISIBLE_MODULES"):
        modules_for_processes(1, {"HLS_MODULE_ID": "3", "HABANA_VISIBLE_MODULES": "6,7"})


@pytest.mark.parametrize(("value", "pin"), [(None, None), ("", None), ("0", 0), ("7", 7)])
def test_module_pin_reads_like_the_bridge(value, pin):
    # bridge _get_module_id_from_environ: unset or empty -> -1 (no pin)
    assert module_pin({} if value is None else {"HLS_MODULE_ID": value}) == pin


def test_malformed_module_pin_names_the_value():
    with pytest.raises(GaudiModulePinError, match="'x3'"):
        module_pin({"HLS_MODULE_ID": "x3"})


def test_current_selection_honours_hls_module_id():
    assert current_selection("hpu", {"HLS_MODULE_ID": "6"}).devices == ("6",)
    # it wins over a multi-card HABANA_VISIBLE_MODULES (the bridge's set_device)
    assert current_selection("hpu", {"HLS_MODULE_ID": "5", "HABANA_VISIBLE_MODULES": "4,5"}).devices == ("5",)
    with pytest.raises(GaudiModulePinError, match="set_device"):
        current_selection("hpu", {"HLS_MODULE_ID": "3", "HABANA_VISIBLE_MODULES": "4,5"})


def test_apply_drops_an_inherited_pin_with_and_without_devices():
    inherited = {"HLS_MODULE_ID": "3", "PATH": "/bin", "PT_HPU_LAZY_MODE": "0"}
    child = select("hpu", "0,1").apply(inherited)
    assert "HLS_MODULE_ID" not in child and child["HABANA_VISIBLE_MODULES"] == "0,1" and child["PATH"] == "/bin"
    assert "HLS_MODULE_ID" not in select("hpu").apply(inherited)
    assert inherited["HLS_MODULE_ID"] == "3"  # the caller's mapping is not changed


def test_apply_by_index_replaces_an_inherited_module_list(monkeypatch):
    child = select("hpu", "4", by="index", hl_smi_rows=ROWS).apply({"HABANA_VISIBLE_MODULES": "0,1",
                                                                   "PT_HPU_LAZY_MODE": "0"})
    assert child["HABANA_VISIBLE_DEVICES"] == "4" and child["HABANA_VISIBLE_MODULES"] == "1"
    monkeypatch.setattr("hwenv.gaudi.selecting.read_hl_smi", lambda: (_ for _ in ()).throw(OSError("no hl-smi")))
    child = select("hpu", "4", by="index").apply({"HABANA_VISIBLE_MODULES": "0,1", "PT_HPU_LAZY_MODE": "0"})
    assert child["HABANA_VISIBLE_DEVICES"] == "4" and "HABANA_VISIBLE_MODULES" not in child


# ---- point 3: int64 in the child's environment -----------------------------------------------

@pytest.mark.facts("G4")
def test_env_sets_int64_only_in_eager_mode():
    selection = select("hpu", "0,1")
    assert selection.env({"PT_HPU_LAZY_MODE": "0"})["PT_ENABLE_INT64_SUPPORT"] == "1"
    assert "PT_ENABLE_INT64_SUPPORT" not in selection.env({"PT_HPU_LAZY_MODE": "1"})


def test_env_follows_the_plugins_default_mode(override_versions):
    override_versions(habana_torch_plugin="1.19.0")
    assert "PT_ENABLE_INT64_SUPPORT" not in select("hpu", "3").env({})  # lazy by default up to 1.20
    override_versions(habana_torch_plugin="1.22.0")
    assert select("hpu", "3").env({}) == {"HABANA_VISIBLE_MODULES": "3", "HLS_MODULE_ID": "3",
                                          "PT_ENABLE_INT64_SUPPORT": "1"}


def test_apply_reads_the_mode_the_child_inherits():
    child = select("hpu", "3").apply({"PT_HPU_LAZY_MODE": "1"})
    assert "PT_ENABLE_INT64_SUPPORT" not in child and child["PT_HPU_LAZY_MODE"] == "1"


def test_in_container_reads_the_markers(tmp_path):
    from hwenv.gaudi.selecting import in_container

    assert in_container(str(tmp_path))[0] is False
    (tmp_path / "proc" / "1").mkdir(parents=True)
    (tmp_path / "proc" / "1" / "cgroup").write_text("0::/kubepods/besteffort/pod1\n")
    assert in_container(str(tmp_path)) == (True, "/proc/1/cgroup names kubepods")
    (tmp_path / ".dockerenv").write_text("")
    assert in_container(str(tmp_path)) == (True, "/.dockerenv exists")

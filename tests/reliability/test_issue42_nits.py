"""Issue 42.8's nits, one table per class: each bad value is an error of the package's own class naming the value, the
rule and the fix, raised before any work (no model loads, no process starts); the edges that are fine stay fine.

Facts the rules rest on, read from the sources: `hl-smi -Q index,module_id -f csv` prints `index, module_id` then one
row per card (INTEL.md S10; Intel's multi-tenant guide); Gaudi module IDs are 0..7 on an 8-card server (G8); the
habana container runtime writes HABANA_VISIBLE_MODULES for every card a container mounts (HabanaAI/habana-container-
runtime README: "HABANA_VISIBLE_MODULES Auto generated"), so one process with several modules listed is standard and
only logged; torch.compile refuses an unknown backend name only when it is called (`InvalidBackend`)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import hwcompile
import hwenv
import numpy as np
import pytest
from hwenv.gaudi import read_hl_smi

# ------------------------------------------------------------------------------------------ hl-smi's output

HL_SMI_BAD = [
    pytest.param("index, module_id\n", "header but no rows: it lists no Gaudi", id="header-without-rows"),
    pytest.param("index, module_id\n0, 9\n", "module_id 9 does not exist on a 8-device server", id="module-id-9"),
    pytest.param("index, module_id\n0, " + "9" * 5000 + "\n", "has 5000 digits", id="id-past-int-limit"),
    pytest.param("index, module_id\n0, 1\n1, 1\n", "repeats", id="module-id-twice"),
]


@pytest.mark.parametrize(("text", "words"), HL_SMI_BAD)
def test_hl_smi_output_edges_are_named(text, words):
    with pytest.raises(hwenv.HlSmiParseError, match=words):
        hwenv.parse_hl_smi_csv(text)


def test_hl_smi_output_with_a_byte_order_mark_is_read():
    assert hwenv.index_to_module(hwenv.parse_hl_smi_csv("\ufeffindex, module_id\n3, 6\n")) == {3: 6}


HL_SMI_FAILS = [
    pytest.param("", "", 1, "exited with 1: it printed nothing. Run `hl-smi` alone", id="silent-exit-1"),
    pytest.param("", "habanalabs driver is not loaded\n", 3, "exited with 3: habanalabs driver is not loaded",
                 id="stderr-reason"),
    pytest.param("ERROR: no devices found\n", "", 2, "exited with 2: ERROR: no devices found", id="stdout-reason"),
]


@pytest.mark.parametrize(("stdout", "stderr", "code", "words"), HL_SMI_FAILS)
def test_a_failing_hl_smi_always_says_why(stdout, stderr, code, words, tmp_path, monkeypatch):
    tool = tmp_path / "hl-smi"
    tool.write_text(f"#!/bin/sh\nprintf '%s' {json.dumps(stdout)}\nprintf '%s' {json.dumps(stderr)} >&2\nexit {code}\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    with pytest.raises(hwenv.HlSmiParseError) as info:
        read_hl_smi()
    assert words in str(info.value)


def test_hl_smi_output_that_is_not_utf8_is_a_parse_error_not_a_decode_traceback(tmp_path, monkeypatch):
    tool = tmp_path / "hl-smi"
    tool.write_text("#!/bin/sh\nprintf 'index, module_id\\n0, \\377\\n'\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    with pytest.raises(hwenv.HlSmiParseError, match="module_id '\ufffd' is not a non-negative integer"):
        read_hl_smi()


# ------------------------------------------------------------------------------------------ Accelerator fields

ACCELERATOR_BAD = [
    pytest.param({"count": "2"}, "count '2' (str) must be an int >= 0", id="count-str"),
    pytest.param({"count": True}, "count True (bool)", id="count-bool"),
    pytest.param({"count": 2.0}, "count 2.0 (float)", id="count-float"),
    pytest.param({"count": -1}, "count -1 (int) must be an int >= 0", id="count-negative"),
    pytest.param({"bf16": "yes"}, "bf16 'yes' must be True, False or None", id="bf16-str"),
    pytest.param({"bf16": 1}, "bf16 1 must be True, False or None", id="bf16-int"),
]


@pytest.mark.parametrize(("fields", "words"), ACCELERATOR_BAD)
def test_accelerator_fields_of_the_wrong_type_are_refused_naming_them(fields, words):
    with pytest.raises(hwenv.AcceleratorFieldError, match=words.replace("(", r"\(").replace(")", r"\)")):
        hwenv.Accelerator("xpu", **fields)


def test_accelerator_kind_that_is_not_a_string_is_refused():
    with pytest.raises(hwenv.AcceleratorFieldError, match="kind 3 is int, not a string"):
        hwenv.Accelerator(3)
    assert hwenv.Accelerator("xpu", 0, bf16=None).count == 0  # the edges that are fine stay fine


# ------------------------------------------------------------------------------------------ compile backends

COMPILE_BAD = [
    pytest.param("cpu", "inductr", "did you mean 'inductor'?", id="inductr-cpu"),
    pytest.param("xpu", "aot_eagr", "did you mean 'aot_eager'?", id="aot-eagr-xpu"),
    pytest.param("cuda", "cudagraph", "did you mean 'cudagraphs'?", id="cudagraph-cuda"),
    pytest.param("cpu", "no_such_backend_at_all", "common ones: ", id="unknown-cpu"),
]


@pytest.mark.parametrize(("kind", "backend", "words"), COMPILE_BAD)
def test_a_misspelt_backend_that_would_be_kept_is_refused_naming_the_closest(kind, backend, words):
    with pytest.raises(hwcompile.CompileArgumentError, match=words) as info:
        hwcompile.route_backend(kind, backend)
    assert repr(backend) in str(info.value)


def test_known_backends_are_kept_and_gaudi_still_reroutes_with_its_warning(caplog):
    assert hwcompile.route_backend("cpu", "aot_eager").backend == "aot_eager"
    caplog.set_level(logging.WARNING)
    hwcompile.reset_warnings()
    assert hwcompile.route_backend("hpu", "indcutor").backend == "hpu_backend"  # G13: warned, as Transformers does
    assert any("'indcutor' is not supported" in record.getMessage() for record in caplog.records)


# ------------------------------------------------------------------------------------------ one Gaudi process

ONE_PROCESS = [
    pytest.param({"HABANA_VISIBLE_MODULES": "0,1"}, (0,), (1,), id="two-listed"),
    pytest.param({"HABANA_VISIBLE_MODULES": "4,5,6,7"}, (4,), (5, 6, 7), id="four-listed"),
    pytest.param({"HABANA_VISIBLE_MODULES": "3"}, (3,), (), id="one-card-container"),
    pytest.param({"HABANA_VISIBLE_MODULES": "0,1", "HLS_MODULE_ID": "1"}, (1,), (), id="pinned"),
]


@pytest.mark.parametrize(("env", "uses", "idle"), ONE_PROCESS)
def test_one_gaudi_process_uses_one_module_and_says_which_stay_idle(env, uses, idle, caplog):
    from hwdist.gaudi_world import check_gaudi_world, idle_modules

    caplog.set_level(logging.WARNING, logger="hwdist.gaudi_world")
    assert check_gaudi_world(1, 8, env, local_rank=0) == uses
    assert idle_modules(1, env) == idle
    warned = [record.getMessage() for record in caplog.records if "stay idle" in record.getMessage()]
    assert bool(warned) == bool(idle)
    if idle:
        assert f"modules {list(idle)} stay idle" in warned[0] and "HABANA_VISIBLE_MODULES" in warned[0]


# ------------------------------------------------------------------------------------------ adapters


def _adapter(folder: Path, base: str, values: np.ndarray) -> Path:
    """A LoRA adapter folder PEFT would load on `base`: config, and one tensor of `values` (float32)."""
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj"], "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base}))
    blob = values.astype(np.float32).tobytes()
    header = json.dumps({"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": {
        "dtype": "F32", "shape": [values.size], "data_offsets": [0, len(blob)]}}).encode()
    (folder / "adapter_model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + blob)
    return folder


ADAPTER_BAD = [
    pytest.param("/elsewhere/gone-base", np.ones(4), "the adapter's base model '/elsewhere/gone-base' "
                 "(base_model_name_or_path in", id="base-missing"),
    pytest.param("README", np.ones(4), "base_model_name_or_path", id="base-a-file"),
    pytest.param(None, np.array([1.0, np.nan, np.inf, 2.0]), "holds 2 NaN or infinite value(s) of 4", id="nan-weights"),
]


@pytest.mark.parametrize(("base", "values", "words"), ADAPTER_BAD)
def test_an_adapter_is_refused_at_plan_naming_its_own_file_not_model(base, values, words, tmp_path, monkeypatch):
    import hwrun

    (tmp_path / "README").write_text("not a model\n")
    folder = _adapter(tmp_path / "adapter", str(tmp_path / base) if base == "README" else base or hwrun.DEFAULT_MODEL,
                      values)
    monkeypatch.setattr("hwrun.model.load.load", lambda *a, **k: pytest.fail("the model loaded"))
    with pytest.raises(hwrun.AdapterFormatError) as info:
        hwrun.plan(str(folder), device="cpu")
    message = str(info.value)
    assert words in message and "--model" not in message
    assert "adapter_config.json" in message or "adapter_model.safetensors" in message

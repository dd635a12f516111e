"""Gaudi generations are data (issue 24 point 6) and int64 follows the bridge (issue 23 point 5)."""

from __future__ import annotations

import dataclasses

import hwenv
import pytest
from hwenv.gaudi import GAUDI_GENERATIONS, GaudiMode, generation_of, int64_status, newest_generation


@pytest.mark.parametrize(("name", "number", "bnb", "int64", "fp8"),
                         [("GAUDI", 1, False, False, False), ("GAUDI2", 2, True, True, True),
                          ("GAUDI3", 3, True, True, True), (" gaudi2 ", 2, True, True, True)])
@pytest.mark.facts("G10", "G12")
def test_known_generations(name, number, bnb, int64, fp8):
    generation = generation_of(name)
    assert generation.known and generation.number == number and generation.bf16  # every generation: bf16 (G12)
    assert (generation.bnb_4bit, generation.bnb_8bit, generation.int64, generation.fp8) == (bnb, bnb, int64, fp8)


@pytest.mark.facts("G10", "G12")
@pytest.mark.parametrize("name", ["GAUDI4", "GAUDI2X", "HL-9000", "", None])
def test_unknown_names_get_the_newest_rules(name):
    generation = generation_of(name)
    assert generation.known is False and generation.device_name == (name or "").strip()
    newest = newest_generation()
    assert dataclasses.replace(generation, known=True, device_name="") == newest
    assert generation.bnb_4bit and generation.bf16  # a new Gaudi is not refused 4-bit or bf16
    assert "not a Gaudi name hwenv knows" in generation.reason()


def test_a_new_row_is_all_a_new_generation_needs(monkeypatch):
    gaudi4 = dataclasses.replace(newest_generation(), name="GAUDI4", number=4, display_name="Gaudi 4")
    monkeypatch.setattr("hwenv.gaudi.generations.GAUDI_GENERATIONS", (*GAUDI_GENERATIONS, gaudi4))
    assert generation_of("GAUDI4").known and generation_of("GAUDI4").display_name == "Gaudi 4"


def test_exported_from_hwenv():
    assert hwenv.generation_of is generation_of and hwenv.GAUDI_GENERATIONS is GAUDI_GENERATIONS
    assert hwenv.GaudiGeneration is type(GAUDI_GENERATIONS[0])


EAGER = GaudiMode(False, "test")
LAZY = GaudiMode(True, "test")


@pytest.mark.parametrize(("value", "name", "mode", "supported", "enabled", "problem"), [
    (None, "GAUDI2", EAGER, True, True, False),      # eager default on (env_flags.yaml)
    ("0", "GAUDI2", EAGER, True, False, True),       # supported, needed, off
    ("FALSE", "GAUDI3", EAGER, True, False, True),   # parse_env_bool ignores case
    ("True", "GAUDI3", EAGER, True, True, False),
    ("", "GAUDI2", EAGER, True, True, False),        # empty is unset
    (None, "GAUDI2", LAZY, False, False, False),     # lazy: unsupported, not a missing setting
    ("1", "GAUDI2", LAZY, False, True, False),
    (None, "GAUDI", EAGER, False, False, False),     # Gaudi 1: eager/utils.cpp defaults it off
    ("1", "GAUDI", EAGER, False, True, False),       # ... and a set flag wins there, but Intel does not support it
    (None, None, EAGER, True, True, False),          # unknown device: newest rules
])
@pytest.mark.facts("G4")
def test_int64_status(value, name, mode, supported, enabled, problem):
    env = {} if value is None else {"PT_ENABLE_INT64_SUPPORT": value}
    status = int64_status(env, device_name=name, mode=mode)
    assert (status.supported, status.enabled, status.problem) == (supported, enabled, problem), status.reason


def test_int64_malformed_names_the_value():
    status = int64_status({"PT_ENABLE_INT64_SUPPORT": "yes"}, device_name="GAUDI2", mode=EAGER)
    assert status.malformed and not status.problem and "'yes'" in status.reason


def test_int64_reads_the_mode_from_the_environment_and_plugin():
    assert int64_status({"PT_HPU_LAZY_MODE": "1"}, device_name="GAUDI2").supported is False
    assert int64_status({}, device_name="GAUDI2", plugin_version="1.19.0").supported is False
    assert int64_status({}, device_name="GAUDI2", plugin_version="1.21.0").supported is True

"""docs/seed-coverage.md is generated from the tests' fact markers: stale or uncovered facts fail here."""

import importlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import seed_coverage  # noqa: E402


def test_every_fact_has_a_test_or_a_stated_reason():
    assert seed_coverage.gaps() == []


def test_coverage_file_is_current():
    assert (ROOT / "docs" / "seed-coverage.md").read_text() == seed_coverage.render(), (
        "run: python tools/seed_coverage.py"
    )


def test_named_api_exists():
    for fact, names in seed_coverage.API.items():
        for name in names:
            module, attribute = name.split(".", 1)
            assert hasattr(importlib.import_module(module), attribute), f"{fact}: {name} does not exist"


def test_every_example_names_its_facts():
    for path in sorted((ROOT / "examples").glob("*")):
        if path.suffix in (".py", ".sh"):
            assert seed_coverage.MARKER.search(path.read_text()), f"{path.name} lacks a '# Facts:' line"


def test_gap_detection_can_fail(monkeypatch):
    monkeypatch.setattr(seed_coverage, "test_markers", lambda: {fact: [] for fact in seed_coverage.FACTS})
    assert "X4" in seed_coverage.gaps()


def test_every_fact_says_what_it_is_checked_against():
    assert set(seed_coverage.CHECKED_AGAINST) == set(seed_coverage.FACTS)
    assert all(text.split(":")[0] in ("real", "source", "fake only", "nothing to check")
               for text in seed_coverage.CHECKED_AGAINST.values())

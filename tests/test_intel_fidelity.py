"""docs/intel-fidelity.md: every real Intel behaviour has a row, a source and existing tests."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "intel-fidelity.md"
#: The behaviours of shared/INTEL.md (issue 23); each must be a row of the document.
ROWS = (
    "xpu-hierarchy-default", "xpu-flat-tiles", "xpu-mask-flat-subdevice", "xpu-mask-composite", "xpu-mask-order",
    "xpu-count", "xpu-bf16", "xpu-properties", "xpu-signatures", "xpu-accelerate", "xpu-xccl", "xpu-retired",
    "xpu-graphs", "hpu-api", "hpu-names", "hpu-memory-split", "hpu-import", "hpu-module-pin", "hpu-set-device",
    "hpu-local-rank", "hpu-groups", "hpu-one-card-container", "hpu-hl-smi", "hpu-lazy-mode", "hpu-compile-modes",
    "hpu-int64", "hpu-generations", "hpu-graphs", "hpu-flag-values", "hpu-backend-options", "tf-compile-wrapper", "tf-accelerate-gate",
    "tf-training-args", "tf-hub-kernels",
)
TEST_REF = re.compile(r"`([\w/.-]+\.py)::(test_\w+)`")


def _rows() -> dict[str, tuple[str, str]]:
    """id -> (source, tests); the verdict column is checked by `_verdicts`."""
    return {row: (source, tests) for row, (source, _, tests) in _table().items()}


def _table() -> dict[str, tuple[str, str, str]]:
    rows = {}
    for line in DOC.read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[0] not in ("id", "---"):
            rows[cells[0]] = (cells[2], cells[3], cells[4])
    return rows


def test_every_row_has_a_verdict_and_every_unknown_is_explained():
    """Issue 41: each behaviour's verdict after the re-check; an unknown part names what would settle it."""
    text = DOC.read_text()
    for row, (_, verdict, _) in _table().items():
        assert verdict.startswith("matches"), f"{row}: verdict {verdict!r} (fix it, or say what is unknown)"
        if "unknown" in verdict:
            assert "## Unknown, and what would settle it" in text, row
    assert text.count("Settled by") >= 3


def test_every_behaviour_is_a_row_and_nothing_else():
    assert sorted(_rows()) == sorted(ROWS)


def problems(rows: dict[str, tuple[str, str]]) -> list[str]:
    """Rows without a source, without tests, or naming a test that does not exist."""
    found = []
    for row, (source, tests) in rows.items():
        refs = TEST_REF.findall(tests)
        if not source:
            found.append(f"{row}: no source")
        if not refs:
            found.append(f"{row}: names no test")
        for path, name in refs:
            text = (ROOT / path).read_text() if (ROOT / path).is_file() else ""
            if not re.search(rf"^def {name}\(", text, re.MULTILINE):
                found.append(f"{row}: {path}::{name} does not exist")
    return found


def test_every_row_names_a_source_and_existing_tests():
    assert problems(_rows()) == []


def test_a_missing_test_or_source_would_be_found():
    bad = {"a": ("S1", "`tests/test_intel_fidelity.py::test_nothing_like_this`"), "b": ("", "none")}
    assert problems(bad) == ["a: tests/test_intel_fidelity.py::test_nothing_like_this does not exist",
                             "b: no source", "b: names no test"]

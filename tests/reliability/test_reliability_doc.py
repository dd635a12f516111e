"""docs/reliability.md is generated from the case tables: a stale document fails here."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import reliability_doc  # noqa: E402


def test_reliability_doc_is_current():
    assert reliability_doc.DOC.read_text() == reliability_doc.render(), "run: python tools/reliability_doc.py"


def test_every_case_appears_in_the_doc():
    text = reliability_doc.render()
    for case in reliability_doc.tables.all_cases():
        assert f"`{case.id}`" in text


def test_a_new_table_file_is_picked_up(tmp_path, monkeypatch):
    tables = reliability_doc.tables
    extra = tmp_path / "cases_hwrun.py"
    extra.write_text("from reliability_case import Case\nCASES = (Case('hwrun-x', 'hwrun.cli.main', ('plan',), 'data-lost', 'b', 'o', 'v'),)\n")
    lost = sum(case.klass == "data-lost" for case in tables.all_cases())
    monkeypatch.setattr(tables, "table_files", lambda: [*sorted(tables.HERE.glob("cases_*.py")), extra])
    assert "`hwrun-x`" in reliability_doc.render() and f"## Data lost ({lost + 1})" in reliability_doc.render()

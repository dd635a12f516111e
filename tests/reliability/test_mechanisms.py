"""The mechanisms table (mechanisms.py, rendered into docs/reliability.md) names real classes and test files."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # --import-mode=importlib puts no test folder on the path
import mechanisms  # noqa: E402
import reliability_case  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def test_every_mechanism_names_a_class_and_existing_table_driven_tests():
    for row in mechanisms.MECHANISMS:
        assert row.klass in reliability_case.CLASSES, row
        for test in row.tests:
            path = ROOT / test.split("::")[0]
            assert path.is_file(), test
            assert "pytest.mark.parametrize" in path.read_text(encoding="utf-8"), test

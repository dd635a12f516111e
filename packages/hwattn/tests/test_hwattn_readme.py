"""The README tables are exactly what the code generates; every public name is documented; import is light."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import hwattn
from hwattn.table import readme_blocks, update_readme

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_tables_are_generated_from_the_code():
    text = README.read_text()
    for name, table in readme_blocks().items():
        assert f"<!-- {name}:start -->\n{table}\n<!-- {name}:end -->" in text, (
            f"README {name} is stale: run `python -m hwattn --update packages/hwattn/README.md`")
    assert update_readme(text) == text


def test_table_changes_when_the_rules_change():
    from hwattn import AttentionEnvironment, decision_table

    assert decision_table(AttentionEnvironment(kernels_available=False)) != decision_table()
    assert "`kernels-community/flash-attn2` (GQA native)" in decision_table()


def test_every_public_name_is_in_the_readme():
    text = README.read_text()
    missing = [name for name in hwattn.__all__ if name != "__version__" and f"`{name}" not in text
               and f"{name}(" not in text]
    assert not missing


def test_import_loads_no_heavy_library_and_downloads_nothing():
    code = ("import sys, hwattn; heavy = [m for m in ('torch', 'transformers', 'kernels', 'huggingface_hub') "
            "if m in sys.modules]; print(heavy)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert result.stdout.strip() == "[]"

"""Start-up (issue 29): `import hwenv` and `hwenv --help` import no torch, and the plug-in scan imports
`importlib.metadata` only where a distribution may declare the entry-point group. Structure, not timing:
the figures are in docs/benchmarks/import_time.md (tools/bench/import_time.py)."""

import json
import subprocess
import sys
import textwrap

from hwenv.platforms import registry

#: Prints which of the heavy modules a code path imported, as JSON.
_REPORT = "import json, sys; print(json.dumps({m: m in sys.modules for m in ('torch', 'importlib.metadata')}))"


def _loaded(code: str) -> dict[str, bool]:
    script = textwrap.dedent(code) + "\n" + _REPORT
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_import_hwenv_imports_neither_torch_nor_importlib_metadata():
    assert _loaded("import hwenv") == {"torch": False, "importlib.metadata": False}


def test_hwenv_help_imports_no_torch():
    loaded = _loaded("""
        import contextlib, io, hwenv.cli
        with contextlib.redirect_stdout(io.StringIO()) as out:
            try:
                hwenv.cli.main(["--help"])
            except SystemExit as stop:
                assert stop.code == 0
        assert "doctor" in out.getvalue()
    """)
    assert loaded["torch"] is False


def test_listing_platforms_without_plugins_skips_importlib_metadata():
    # no distribution on sys.path declares hwstack.platforms here, so the 2 ms scan answers
    loaded = _loaded("import hwenv; assert [p.kind for p in hwenv.platforms()][-1] == 'cpu'")
    assert loaded == {"torch": False, "importlib.metadata": False}


def test_the_prescan_finds_a_declared_group(tmp_path, monkeypatch):
    info = tmp_path / "someone_npu-1.0.dist-info"
    info.mkdir()
    (info / "entry_points.txt").write_text("[console_scripts]\nx = y:z\n")
    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    assert registry._group_may_be_declared() is False
    (info / "entry_points.txt").write_text("[console_scripts]\nx = y:z\n\n[hwstack.platforms]\nnpu = a:B\n")
    assert registry._group_may_be_declared() is True


def test_the_prescan_defers_to_importlib_metadata_for_zips_and_eggs(tmp_path, monkeypatch):
    archive = tmp_path / "bundle.zip"
    archive.write_bytes(b"PK\x05\x06" + b"\x00" * 18)  # an empty zip on the path: only importlib.metadata reads it
    monkeypatch.setattr(sys, "path", [str(tmp_path / "missing"), str(archive)])
    assert registry._group_may_be_declared() is True
    egg = tmp_path / "thing-1.0-py3.11.egg"
    egg.mkdir()
    monkeypatch.setattr(sys, "path", [str(egg)])
    assert registry._group_may_be_declared() is True
    monkeypatch.setattr(sys, "path", [str(tmp_path / "missing")])
    assert registry._group_may_be_declared() is False

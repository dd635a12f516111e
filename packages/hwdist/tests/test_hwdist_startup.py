"""Start-up (issue 29): `import hwdist` and `hwdist --help` import no torch (and no collective machinery);
names load on first use. Structure, not timing: figures in docs/benchmarks/import_time.md."""

import json
import subprocess
import sys
import textwrap

import hwdist

_HEAVY = ("torch", "hwdist.collectives", "hwdist.context", "hwdist.backend")


def _loaded(code: str) -> dict[str, bool]:
    report = f"import json, sys; print(json.dumps({{m: m in sys.modules for m in {_HEAVY!r}}}))"
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code) + "\n" + report], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_import_hwdist_loads_no_submodule_and_no_torch():
    assert not any(_loaded("import hwdist").values())


def test_hwdist_help_and_bench_help_import_no_torch():
    loaded = _loaded("""
        import contextlib, io, hwdist.cli
        for argv in (["--help"], ["bench", "--help"], ["launch", "--help"]):
            with contextlib.redirect_stdout(io.StringIO()) as out:
                try:
                    hwdist.cli.main(argv)
                except SystemExit as stop:
                    assert stop.code == 0
            assert "usage: hwdist" in out.getvalue()
    """)
    assert not any(loaded.values()), loaded


def test_every_public_name_loads_lazily_and_unknown_names_raise():
    for name in hwdist.__all__:
        assert getattr(hwdist, name) is not None
    assert hwdist.all_reduce.__module__ == "hwdist.collectives"
    assert set(hwdist.__all__) <= set(dir(hwdist))
    try:
        hwdist.not_a_name  # noqa: B018
    except AttributeError as error:
        assert "not_a_name" in str(error)
    else:
        raise AssertionError("an unknown name must raise AttributeError")

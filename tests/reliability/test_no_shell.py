"""hwenv, hwdist and hwcompile run subprocesses with an argument list, never through a shell (issue 27)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("hwenv", "hwdist", "hwcompile")
SHELL = re.compile(r"shell\s*=\s*True|os\.system\(|os\.popen\(|subprocess\.getoutput\(|subprocess\.getstatusoutput\(")


def shell_calls(root: Path = ROOT) -> list[str]:
    """`file:line` of every shell-running call in the three packages' sources."""
    found = []
    for package in PACKAGES:
        for path in sorted((root / "packages" / package / "src").rglob("*.py")):
            for number, line in enumerate(path.read_text().splitlines(), start=1):
                if SHELL.search(line):
                    found.append(f"{path.relative_to(root)}:{number}")
    return found


def test_no_subprocess_goes_through_a_shell():
    assert shell_calls() == []


def test_the_scan_can_fail(tmp_path):
    source = tmp_path / "packages" / "hwenv" / "src" / "hwenv"
    source.mkdir(parents=True)
    (source / "bad.py").write_text("import subprocess\nsubprocess.run('ls', shell=True)\n")
    assert shell_calls(tmp_path) == ["packages/hwenv/src/hwenv/bad.py:2"]

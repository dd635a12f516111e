"""Issue 27's bad-input suite: every case of every table through the real CLI, as a subprocess.

Each case runs `python -m <module> ARGV` in a scratch folder holding a user's files; it must
end with exit 2 and exactly one stderr line naming the bad value (or, for doctor cases, the
named problem), with no traceback, and every file in the folder unchanged (checksums).
Each case is its own test with its own time bound (issue 40: one shared fixture let one slow
case turn every case into an error); pytest-xdist spreads them over the cores.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import reliability_tables as tables  # noqa: E402

CASES = tables.all_cases()
CASE = tables.case_module()
#: Variables that would change what a case tests; the scratch environment starts without them.
DEVICE_VARIABLES = ("HWENV_DEVICE", "ZE_AFFINITY_MASK", "ZE_ENABLE_PCI_ID_DEVICE_ORDER", "ZE_FLAT_DEVICE_HIERARCHY",
                    "HABANA_VISIBLE_MODULES", "HABANA_VISIBLE_DEVICES", "HLS_MODULE_ID", "PT_HPU_LAZY_MODE",
                    "PT_ENABLE_INT64_SUPPORT", "CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES",
                    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
#: Seconds one case's process may take, by what it does. Measured with 2 xdist workers on 2 cores under load 8:
#: hwenv's cases and the argument-parser refusals 0.1-0.3 s, the others 2-9 s (importing torch and Transformers
#: without cached bytecode: 2-3x that), the `slow` ones 15-21 s (they import the training stack; one trains).
#: Each bound is over 10x that, so a parallel build beside the suite does not fail a case; a case past its bound
#: fails alone, naming itself, and the others run on.
BOUNDS_S = {"hwenv.cli": 120, "hwdist": 300, "hwrun.cli.main": 300}
SLOW_BOUND_S = 600


def bound_s(case) -> int:
    """The seconds `case`'s process may take (BOUNDS_S by module; SLOW_BOUND_S for a `slow` case)."""
    return SLOW_BOUND_S if case.slow else BOUNDS_S.get(case.module, 300)


def _user_folder(root: Path, files: dict | None = None) -> Path:
    """A working folder as a user has it: a README, a script, a non-executable shell file, data, and
    the case's own `files` (e.g. a binary batch file)."""
    root.mkdir()
    for name, content in (files or {}).items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    (root / "README.md").write_text("# my project\n")
    (root / "train.py").write_text("print('training')\n")
    (root / "script.sh").write_text("#!/bin/sh\necho hi\n")
    (root / "script.sh").chmod(0o644)
    (root / "data").mkdir()
    (root / "data" / "rows.jsonl").write_text('{"text": "hello"}\n')
    return root


def _checksums(root: Path) -> dict[str, str]:
    return {str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "dir"
            for path in sorted(root.rglob("*"))}


def _run(case, cwd: Path, timeout: float | None = None) -> subprocess.CompletedProcess:
    """`python -m MODULE ARGV` in `cwd`. Past `timeout` (default: the case's bound) seconds the process and its
    children are killed and the test fails, naming the case."""
    env = {key: value for key, value in os.environ.items() if key not in DEVICE_VARIABLES}
    env.update(case.env)  # bytecode as the suite keeps it (conftest.py): never written into the scratch folder
    argv = [sys.executable, "-m", case.module, *case.argv]
    timeout = bound_s(case) if timeout is None else timeout
    # its own process group, so that a timeout also kills what it started (torchrun's workers)
    process = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        pytest.fail(f"case {case.id}: `{case.command()}` did not finish within its bound of {timeout:.0f} s (load "
                    f"average {os.getloadavg()[0]:.1f}) and was killed; its stderr:\n{stderr[-2000:]}")
    return subprocess.CompletedProcess(argv, process.returncode, stdout, stderr)


def _params() -> list:
    """One test per case; the end-to-end ones (`Case.slow`) carry the slow marker (and run all the same)."""
    return [pytest.param(case, id=case.id, marks=[pytest.mark.slow] if case.slow else []) for case in CASES]


@pytest.mark.parametrize("case", _params())
def test_bad_input_is_one_clear_line_and_changes_nothing(case, tmp_path):
    folder = _user_folder(tmp_path / "work", case.files)
    before = _checksums(folder)
    result = _run(case, folder)
    said = f"case {case.id}: `{case.command()}` exited {result.returncode}; its stderr:\n{result.stderr[-4000:]}"
    assert _checksums(folder) == before, f"a file in the working folder changed\n{said}"
    assert "Traceback" not in result.stderr, said
    if case.expect == "exit-2":
        assert result.returncode == 2, said
        lines = result.stderr.splitlines()
        assert len(lines) == 1, f"not exactly one stderr line\n{said}"
        assert case.named in lines[0], f"{case.named!r} is not named\n{said}"
    else:
        assert result.returncode == 0, said
        problems = [p for p in json.loads(result.stdout)["problems"] if p["code"] == case.problem]
        assert problems, f"no {case.problem} problem\n{said}"
        assert any(case.named in p["message"] and p["fix"] for p in problems), f"{problems}\n{said}"


def test_every_case_is_well_formed():
    ids = [case.id for case in CASES]
    assert len(ids) == len(set(ids)), "duplicate case ids"
    for case in CASES:
        assert case.klass in CASE.CLASSES, case.id
        assert case.expect in CASE.EXPECTATIONS, case.id
        assert case.named and case.before and case.outcome, case.id
        assert (case.expect == "doctor-problem") == bool(case.problem), case.id


def test_the_check_can_fail(tmp_path):
    """A valid command is not a bad-input case: the assertions above would fail on it."""
    ok = CASE.Case("valid", "hwenv.cli", ("env", "--kind", "cuda", "--devices", "0"), "unclear-error", "-", "-", "0")
    result = _run(ok, _user_folder(tmp_path / "work"))
    assert result.returncode == 0 and result.stderr == ""


def test_a_case_past_its_bound_fails_naming_itself(tmp_path):
    """The bound is enforced per case: a process that outlives it is killed and only that test fails."""
    sleeper = CASE.Case("sleeper", "hwenv.cli", ("env",), "hang-unbounded", "-", "-", "-",
                        files={"hwenv/__init__.py": "", "hwenv/cli.py": "import time\ntime.sleep(60)\n"})
    with pytest.raises(pytest.fail.Exception, match=r"case sleeper: `.*` did not finish within its bound of 1 s"):
        _run(sleeper, _user_folder(tmp_path / "work", sleeper.files), timeout=1)

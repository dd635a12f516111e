"""Issue 27's bad-input suite: every case of every table through the real CLI, as a subprocess.

Each case runs `python -m <module> ARGV` in a scratch folder holding a user's files; it must
end with exit 2 and exactly one stderr line naming the bad value (or, for doctor cases, the
named problem), with no traceback, and every file in the folder unchanged (checksums).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
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


def _run(case, cwd: Path) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key not in DEVICE_VARIABLES}
    env.update(case.env, PYTHONDONTWRITEBYTECODE="1")
    return subprocess.run([sys.executable, "-m", case.module, *case.argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


#: Cases run side by side (most time is `import torch` in the child); each has its own folder.
WORKERS = 4


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict:
    """Every case run once, concurrently: id -> (checksums before, checksums after, the finished process)."""

    def one(case, folder):
        folder = _user_folder(folder / "work", case.files)
        before = _checksums(folder)
        result = _run(case, folder)
        return case.id, (before, _checksums(folder), result)

    # the folders are made here, not in the threads: pytest's temporary-folder factory is not thread-safe (made
    # from 4 threads, the cases failed here with FileExistsError and "... is not a normalized and relative path")
    folders = [tmp_path_factory.mktemp(case.id) for case in CASES]
    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        return dict(pool.map(one, CASES, folders))


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_bad_input_is_one_clear_line_and_changes_nothing(case, outcomes):
    before, after, result = outcomes[case.id]
    assert after == before, "a file in the working folder changed"
    assert "Traceback" not in result.stderr, result.stderr
    if case.expect == "exit-2":
        assert result.returncode == 2, (result.returncode, result.stderr)
        lines = result.stderr.splitlines()
        assert len(lines) == 1, result.stderr
        assert case.named in lines[0], lines[0]
    else:
        assert result.returncode == 0, result.stderr
        problems = [p for p in json.loads(result.stdout)["problems"] if p["code"] == case.problem]
        assert problems, f"no {case.problem} problem"
        assert any(case.named in p["message"] and p["fix"] for p in problems), problems


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

"""Issue 27's bad-input suite: every case of every table through the real CLI.

Each case runs the CLI's `main(ARGV)` in a scratch folder holding a user's files; it must
end with exit 2 and exactly one stderr line naming the bad value (or, for doctor cases, the
named problem), with no traceback, and every file in the folder unchanged (checksums).
Each case is its own test with its own time bound (issue 40: one shared fixture let one slow
case turn every case into an error); pytest-xdist spreads them over the cores.

How a case runs (issue 40.2: the suite within 10 minutes on 2 cores): as its own process,
`python -m <module> ARGV`, unless it is in `IN_PROCESS`. Those import torch, Transformers or the
training stack, which took 2-10 s per process, nearly all of it interpreter start-up and imports
(188 s of test time for the file); they call the same `main(argv)` the console script calls, in
this process, with everything a process would have fresh made so (`_in_process`): the scratch
folder as the current folder, the environment, the root logger without handlers (so the CLI's
`logging.basicConfig` writes to the captured stderr), logging not disabled, Transformers' logger
at its default level, Python's default warning filters with warnings printed on stderr, and
afterwards the environment, loggers, torch's thread count, signal handlers and the libraries'
progress-bar switches as they were (what a library prints once, at its import, or through a
logger whose level an earlier test changed, only a process shows: the witnesses below). stdout and stderr are
captured at the file descriptors (`capfd`), so a library's C-level output counts too, and a
`SystemExit` is its exit status. Every CLI keeps cases that run as processes: each of hwenv's
and hwdist's light ones (no torch import, 0.1-0.3 s as a process), and `SUBPROCESS_WITNESSES`,
one per command that imports the heavy stack, which prove that the real process start
(imports and all) prints nothing else on stderr and exits with the status `main` returns.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
import warnings
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


#: Cases run in this process through `main(argv)` (the module doc says how): each imports torch, Transformers or
#: the training stack, 2-10 s as a process. A case not named here runs as a process (the safe default).
IN_PROCESS = frozenset({
    # hwenv: doctor and a device check import torch
    "hwenv-device-absent", "doctor-gaudi-unsupported-group", "doctor-gaudi-variables-disagree",
    "doctor-mask-subdevice-flat", "doctor-cuda-visible-garbage", "doctor-hip-visible-duplicate",
    "doctor-lazy-mode-malformed-off-gaudi", "doctor-int64-malformed-off-gaudi",
    # hwdist: the dry run and bench import torch
    "hwdist-launch-by-index-on-cuda", "hwdist-bench-size-too-big",
    # hwrun plan / generate
    "hwrun-model-custom-code-untrusted", "hwrun-model-config-not-object", "hwrun-model-truncated-safetensors",
    "hwrun-model-config-no-model-type", "hwrun-generate-adapter-overwritten", "hwrun-generate-adapter-base-missing",
    "hwrun-hwenv-device-absent", "hwrun-compile-misspelt", "hwrun-plan-gaudi-module-out-of-range",
    "hwrun-plan-gaudi-selections-disagree", "hwrun-temperature-without-sample", "hwrun-top-k-negative",
    "hwrun-temperature-negative", "hwrun-top-p-without-sample", "hwrun-batch-file-binary", "hwrun-batch-file-dev-zero",
    # hwrun train: refusals (the training stack's import is what cost 7-10 s each)
    "hwrun-train-output-empty", "hwrun-train-output-current-folder", "hwrun-train-overwrite-foreign-model",
    "hwrun-train-resume-corrupted-checkpoint", "hwrun-train-output-is-a-file", "hwrun-train-output-unwritable",
    "hwrun-train-data-dev-zero", "hwrun-train-data-past-bound", "hwrun-train-resume-another-models-run",
    "hwrun-train-max-positions-zero", "hwrun-train-lora-r-unbounded", "hwrun-train-batch-size-unbounded",
})
#: One case per command that imports the heavy stack, kept as a real process (with everything light): the proof that
#: the process itself, imports included, writes only the one line and exits with `main`'s status. The training one
#: is the run that trains (Trainer's output, a process group of its own, the removed output folder).
SUBPROCESS_WITNESSES = {
    "hwenv doctor": "doctor-gaudi-module-out-of-range",
    "hwenv env (device check)": "hwenv-device-unknown",
    "hwdist bench": "hwdist-bench-device-unknown",
    "hwrun plan": "hwrun-plan-invalid-affinity-mask",
    "hwrun generate": "hwrun-generate-adapter-nan",
    "hwrun train": "hwrun-train-lr-diverges",
}
#: Python's own warning filters in a process started without -W or PYTHONWARNINGS (pytest installs its own).
PYTHON_DEFAULT_WARNINGS = (("default", DeprecationWarning, "__main__"), ("ignore", DeprecationWarning, ""),
                           ("ignore", PendingDeprecationWarning, ""), ("ignore", ImportWarning, ""),
                           ("ignore", ResourceWarning, ""))
#: The module whose `main(argv)` `python -m MODULE` runs.
MAIN_OF = {"hwdist": "hwdist.cli"}


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


class _PastBound(BaseException):
    """Raised by the alarm of an in-process case past its bound (a BaseException: the CLI's handlers let it by)."""


@contextlib.contextmanager
def _bounded(seconds: float):
    """SIGALRM after `seconds` raises `_PastBound` in the main thread (a hang in Python code ends there)."""
    def alarm(signum, frame):
        raise _PastBound()

    if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
        yield
        return
    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


@contextlib.contextmanager
def _as_a_fresh_process(case, cwd: Path):
    """This process's state as `python -m MODULE` in `cwd` would start with it, and afterwards as it was."""
    environ, cwd_before, argv_before, disabled = dict(os.environ), os.getcwd(), sys.argv, logging.root.manager.disable
    root = logging.getLogger()
    root_state = (root.handlers[:], root.level, root.filters[:])
    loggers = {name: (lg.level, lg.disabled, lg.filters[:], lg.handlers[:], lg.propagate)
               for name, lg in logging.Logger.manager.loggerDict.items() if isinstance(lg, logging.Logger)}
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1)}
    torch = sys.modules.get("torch")
    threads = torch.get_num_threads() if torch is not None else None
    hub_bars = sys.modules.get("huggingface_hub.utils.tqdm")
    hub_bar_states = dict(hub_bars.progress_bar_states) if hub_bars is not None else None
    tf_logging = sys.modules.get("transformers.utils.logging")
    tf_bars = tf_logging._tqdm_active if tf_logging is not None else None
    execs = {name: getattr(os, name) for name in dir(os) if name.startswith("exec")}  # execv, execvpe, ...
    try:
        os.environ.clear()
        os.environ.update({key: value for key, value in environ.items() if key not in DEVICE_VARIABLES})
        os.environ.update(case.env)
        os.chdir(cwd)
        sys.argv = [case.module, *case.argv]
        root.handlers, root.filters = [], []
        root.setLevel(logging.WARNING)
        logging.disable(logging.NOTSET)  # a test before may have silenced logging; a new process has not
        if tf_logging is not None:  # another in-process CLI call (quiet_transformers) may have left it at ERROR
            tf_logging._get_library_root_logger().setLevel(tf_logging._get_default_logging_level())

        def no_exec(*args, **kwargs):  # an exec would replace this pytest worker: refused, the case fails
            raise AssertionError(f"case {case.id} tried to exec {args[:2]} in process")

        for name in execs:
            setattr(os, name, no_exec)
        with warnings.catch_warnings():
            warnings.resetwarnings()
            for action, category, module in reversed(PYTHON_DEFAULT_WARNINGS):
                warnings.filterwarnings(action, category=category, module=module)
            warnings.showwarning = _show_warning
            yield
    finally:
        for name, function in execs.items():
            setattr(os, name, function)
        for handler in root.handlers:
            if handler not in root_state[0]:
                handler.close()
        root.handlers, root.level, root.filters = root_state
        for name, (level, disabled, filters, own, propagate) in loggers.items():
            lg = logging.getLogger(name)
            lg.level, lg.disabled, lg.filters, lg.handlers, lg.propagate = level, disabled, filters, own, propagate
        logging.disable(disabled)
        logging.Logger.manager._clear_cache()
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        if threads is not None:  # (torch imported by the case kept its default; the CLIs give back what they set)
            torch.set_num_threads(threads)
        if hub_bar_states is not None:
            hub_bars.progress_bar_states.clear()
            hub_bars.progress_bar_states.update(hub_bar_states)
        if tf_bars is not None:
            tf_logging._tqdm_active = tf_bars
        sys.argv = argv_before
        os.chdir(cwd_before)
        os.environ.clear()
        os.environ.update(environ)


def _in_process(case, cwd: Path, capfd, timeout: float | None = None) -> subprocess.CompletedProcess:
    """`main(ARGV)` of `case.module` in this process, as `_run` would run it (the module doc says how)."""
    main = importlib.import_module(MAIN_OF.get(case.module, case.module)).main
    timeout = bound_s(case) if timeout is None else timeout
    capfd.readouterr()  # what came before is not the case's
    started = time.monotonic()
    code: object = None
    try:
        with _as_a_fresh_process(case, cwd), _bounded(timeout):
            code = main(list(case.argv))
    except SystemExit as exit:
        code = exit.code
    except _PastBound:
        stderr = capfd.readouterr().err
        pytest.fail(f"case {case.id}: `{case.command()}` did not finish within its bound of {timeout:.0f} s in process "
                    f"(load average {os.getloadavg()[0]:.1f}); its stderr:\n{stderr[-2000:]}")
    except Exception:  # as a process would: the traceback on stderr, exit 1
        traceback.print_exc(file=sys.stderr)
        code = 1
    if isinstance(code, str):  # sys.exit("text"): printed, status 1
        print(code, file=sys.stderr)
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    out, err = capfd.readouterr()
    assert time.monotonic() - started <= timeout, f"case {case.id} took longer than its bound of {timeout:.0f} s"
    return subprocess.CompletedProcess(["main", *case.argv], 0 if code is None else int(code), out, err)


def _params() -> list:
    """One test per case; the end-to-end ones (`Case.slow`) carry the slow marker (and run all the same)."""
    return [pytest.param(case, id=case.id, marks=[pytest.mark.slow] if case.slow else []) for case in CASES]


@pytest.mark.parametrize("case", _params())
def test_bad_input_is_one_clear_line_and_changes_nothing(case, tmp_path, capfd):
    folder = _user_folder(tmp_path / "work", case.files)
    before = _checksums(folder)
    result = _in_process(case, folder, capfd) if case.id in IN_PROCESS else _run(case, folder)
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


def test_in_process_cases_and_witnesses_are_cases():
    ids = {case.id for case in CASES}
    assert IN_PROCESS <= ids, sorted(IN_PROCESS - ids)
    for command, witness in SUBPROCESS_WITNESSES.items():
        assert witness in ids and witness not in IN_PROCESS, (command, witness)


def test_in_process_sees_what_a_process_prints(tmp_path, capfd, monkeypatch):
    """A CLI's log records and warnings reach the case's stderr in process as they would from a process, so the
    one-line check fails on them; `SystemExit` is the status; and the case leaves this process as it was."""
    fake = type(sys)("hwstack_fake_cli")

    def main(argv):
        logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
        logging.getLogger("some.library").warning("a library's note")
        warnings.warn("a library's FutureWarning", FutureWarning, stacklevel=1)
        warnings.warn("a DeprecationWarning Python hides", DeprecationWarning, stacklevel=1)
        logging.getLogger("transformers").setLevel(logging.ERROR)
        os.environ["RANK"] = "0"
        print("to stdout")
        sys.exit(int(argv[0]))

    fake.main = main
    monkeypatch.setitem(sys.modules, fake.__name__, fake)
    case = CASE.Case("fake", fake.__name__, ("3",), "unclear-error", "-", "-", "-", env={"HWENV_DEVICE": "cpu"})
    environ, handlers, level = dict(os.environ), logging.getLogger().handlers[:], logging.getLogger("transformers").level
    result = _in_process(case, _user_folder(tmp_path / "work"), capfd)
    assert result.returncode == 3 and result.stdout == "to stdout\n"
    lines = result.stderr.splitlines()
    assert lines[0] == "WARNING some.library: a library's note" and "FutureWarning: a library's FutureWarning" in lines[1]
    assert "DeprecationWarning" not in result.stderr
    assert dict(os.environ) == environ and os.getcwd() != str(tmp_path / "work")
    assert logging.getLogger().handlers == handlers and logging.getLogger("transformers").level == level


def test_an_in_process_case_past_its_bound_fails_naming_itself(tmp_path, capfd, monkeypatch):
    fake = type(sys)("hwstack_fake_sleeper")
    fake.main = lambda argv: time.sleep(30)
    monkeypatch.setitem(sys.modules, fake.__name__, fake)
    sleeper = CASE.Case("sleeper", fake.__name__, (), "hang-unbounded", "-", "-", "-")
    with pytest.raises(pytest.fail.Exception, match=r"case sleeper: `.*` did not finish within its bound of 1 s"):
        _in_process(sleeper, _user_folder(tmp_path / "work"), capfd, timeout=1)

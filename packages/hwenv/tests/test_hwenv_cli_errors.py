"""The shared CLI validation layer (hwenv.cli_errors, issue 27): one line, exit 2, traceback only with --verbose."""

from __future__ import annotations

import pytest
from hwenv.cli import main
from hwenv.cli_errors import OneLineParser, run_command
from hwenv.errors import HwenvError, SelectionError


def _raise(error):
    def function():
        raise error
    return function


def test_package_error_is_one_line_exit_2(capsys):
    assert run_command("tool x", _raise(SelectionError("bad 'v'\nsecond line")), (HwenvError,)) == 2
    assert capsys.readouterr().err == "tool x: error: bad 'v' second line\n"


def test_verbose_adds_the_traceback(capsys):
    assert run_command("tool x", _raise(SelectionError("bad")), (HwenvError,), verbose=True) == 2
    err = capsys.readouterr().err
    assert err.startswith("Traceback") and err.endswith("tool x: error: bad\n")


def test_a_bug_is_one_line_exit_1_naming_its_type(capsys):
    assert run_command("tool x", _raise(KeyError("k")), (HwenvError,)) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "internal error: KeyError" in err and "--verbose" in err


def test_interrupt_and_closed_pipe(capsys):
    assert run_command("tool x", _raise(KeyboardInterrupt()), (HwenvError,)) == 130
    assert run_command("tool x", lambda: 0, (HwenvError,)) == 0


def test_usage_error_is_one_line(capsys):
    parser = OneLineParser(prog="tool")
    parser.add_argument("--n", type=int)
    with pytest.raises(SystemExit) as stop:
        parser.parse_args(["--n", "abc"])
    assert stop.value.code == 2
    assert capsys.readouterr().err == "tool: error: argument --n: invalid int value: 'abc' (see tool --help)\n"


@pytest.mark.parametrize(("argv", "named"), [
    (["env", "--kind", "xpu", "--by", "index", "--devices", "0"], "--by index"),
    (["env", "--kind", "cuda", "--by", "module", "--devices", "0"], "--by module"),
    (["env", "--kind", "hpu", "--by", "index"], "no --devices"),
    (["env", "--kind", "cuda", "--no-pci-order", "--devices", "0"], "--no-pci-order"),
])
def test_options_that_do_nothing_are_refused(clean_device_env, capsys, argv, named):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and named in err


def test_options_that_apply_are_kept(clean_device_env, capsys):
    assert main(["env", "--kind", "xpu", "--no-pci-order", "--devices", "0"]) == 0
    assert capsys.readouterr().out.strip() == "ZE_AFFINITY_MASK=0"
    assert main(["env", "--kind", "rocm", "--devices", "1"]) == 0  # every selectable kind of the registry
    assert capsys.readouterr().out.strip() == "HIP_VISIBLE_DEVICES=1"


def test_exec_refuses_a_non_executable_file_before_exec(clean_device_env, capsys, tmp_path, monkeypatch):
    script = tmp_path / "run.sh"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o644)
    monkeypatch.setattr("hwenv.cli.os.execvpe", lambda *a: pytest.fail("exec was reached"))
    assert main(["exec", "--kind", "cuda", "--", str(script)]) == 2
    assert "is not executable" in capsys.readouterr().err
    assert main(["exec", "--kind", "cuda", "--", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err

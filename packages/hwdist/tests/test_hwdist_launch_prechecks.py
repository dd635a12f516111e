"""Issue 42 (its point 7): what made torchrun print its own traceback from `hwdist launch` is refused before torchrun
starts, in one line naming the value, the rule and the fix: a script that is not Python, a log folder that cannot
be created, a master port another process holds; and --nproc-per-node is bounded where no device count bounds it."""

from __future__ import annotations

import socket

import pytest
from hwdist.cli import main

ELF = b"\x7fELF\x02\x01\x01\x00" + b"\x00" * 56


def _listening() -> socket.socket:
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    return server


CASES = [
    # id, files {name: bytes}, argv, words the one line must hold
    ("bash-script", {"run.sh": b"#!/bin/bash\necho training\n"}, ["run.sh"], ["'run.sh' is a /bin/bash script"]),
    ("shell-without-shebang", {"run.sh": b"echo hi | tee log\nls -l &&\n"}, ["run.sh"],
     ["'run.sh' is not Python this interpreter can run (line 1"]),
    ("binary", {"a.out": ELF}, ["a.out"], ["'a.out' is not Python"]),
    ("syntax-error", {"train.py": b"import os\ndef broken(:\n"}, ["train.py"], ["line 2"]),
    ("log-dir-under-a-file", {"train.py": b"", "notes.txt": b"x"}, ["--log-dir", "notes.txt/logs", "train.py"],
     ["--log-dir 'notes.txt/logs' cannot be created", "is a file"]),
    ("log-dir-unwritable", {"train.py": b""}, ["--log-dir", "/proc/hwdist-logs", "train.py"],
     ["--log-dir '/proc/hwdist-logs' cannot be created", "not writable"]),
    ("master-port-in-use", {"train.py": b""}, ["--master-port", "{busy}", "train.py"], ["{busy} is in use", "Fix:"]),
    ("nproc-far-past-the-cores", {"train.py": b""}, ["--nproc-per-node", "100000", "train.py"],
     ["--nproc-per-node 100000 on cpu exceeds", "per core"]),
    ("nproc-past-any-node", {}, ["--dry-run", "--kind", "cuda", "--nproc-per-node", "300", "train.py"],
     ["--nproc-per-node 300 exceeds 256"]),
]


@pytest.mark.parametrize(("files", "argv", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_launch_refuses_before_torchrun_starts(tmp_path, monkeypatch, capsys, clean_device_env, files, argv, words):
    monkeypatch.chdir(tmp_path)
    for name, content in files.items():
        (tmp_path / name).write_bytes(content)
    monkeypatch.setattr("hwdist.launch.run", lambda *a, **k: pytest.fail("torchrun was started"))
    server = _listening()
    busy = str(server.getsockname()[1])
    try:
        kind = [] if "--kind" in argv else ["--kind", "cpu"]
        code = main(["launch", *kind, *[a.replace("{busy}", busy) for a in argv]])
    finally:
        server.close()
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("hwdist launch: error:") and err.count("\n") == 1, err
    assert "Traceback" not in err
    for word in words:
        assert word.replace("{busy}", busy) in err, err


def _zipapp(path) -> None:
    import zipfile

    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("__main__.py", "print('hi')\n")


@pytest.mark.parametrize("write", [
    lambda p: p.write_text("#!/usr/bin/env python3\nprint('hi')\n"),
    lambda p: p.write_text("# -*- coding: latin-1 -*-\nprint('caf\xe9')\n", encoding="latin-1"),
    _zipapp,
], ids=["python-shebang", "latin-1-cookie", "zip-application"])
def test_a_python_script_on_a_free_port_is_launched(tmp_path, monkeypatch, clean_device_env, write):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "train.py")
    started = []
    monkeypatch.setattr("hwdist.launch.run", lambda argv, env: started.append(argv) or 0)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free = str(probe.getsockname()[1])
    assert main(["launch", "--kind", "cpu", "--master-port", free, "--log-dir", "logs/run1", "train.py"]) == 0
    assert started and started[0][-1] == "train.py"

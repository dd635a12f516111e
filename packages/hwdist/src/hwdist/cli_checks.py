"""Every `hwdist launch | bench` option checked before anything starts (issue 27).

Types, ranges and combinations that would do nothing are refused with a `LaunchError` /
`BenchError` naming the value, the rule and the fix; nothing here starts a process or a group.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import math
import os
import re
import sys

from .errors import BenchError, LaunchError

#: torchrun's default rendezvous backend: the one that reads --master-addr/--master-port.
STATIC_RDZV = "static"


def port(value: object, flag: str, error: type[Exception] = LaunchError) -> int:
    """`value` as a TCP port 1..65535; anything else raises `error` naming `flag`."""
    text = str(value).strip()
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= 65535:
        raise error(f"{flag} {value!r} is not a TCP port: use a number 1..65535 (leave it out for torchrun's 29500).")
    return int(text)


def _integer(value: object, flag: str, minimum: int) -> int:
    text = str(value).strip()
    if not re.fullmatch(r"-?[0-9]+", text):
        raise LaunchError(f"{flag} {value!r} is not an integer; pass a whole number >= {minimum}.")
    number = int(text)
    if number < minimum:
        raise LaunchError(f"{flag} {value!r} must be >= {minimum}.")
    return number


def nnodes(value: str) -> tuple[int, int]:
    """`--nnodes N` or `MIN:MAX` (torchrun's elastic form) -> (min, max); both >= 1, min <= max."""
    low, sep, high = str(value).partition(":")
    first = _integer(low, "--nnodes", 1)
    last = _integer(high, "--nnodes", 1) if sep else first
    if last < first:
        raise LaunchError(f"--nnodes {value!r} runs backwards; write MIN:MAX with MIN <= MAX, e.g. 1:4.")
    return first, last


def _endpoint(value: str) -> None:
    text = str(value).strip()
    if not text:
        raise LaunchError(f"--rdzv-endpoint {value!r} is empty; write HOST or HOST:PORT, e.g. node0:29400.")
    host, sep, tail = text.rpartition(":")
    if sep and not tail.endswith("]"):  # HOST:PORT ([v6]:PORT too); a bare [v6] address has no port
        if not host:
            raise LaunchError(f"--rdzv-endpoint {value!r} has no host; write HOST:PORT, e.g. node0:29400.")
        port(tail, f"--rdzv-endpoint {value!r}: port")


def check_script(script: str, module: bool) -> None:
    """The script file (or, with `-m`, the module's top-level package) must exist before torchrun starts."""
    if not script:
        raise LaunchError("hwdist launch needs a script (or -m MODULE) to run, e.g. hwdist launch train.py")
    if module:
        top = script.split(".")[0]
        # searched the way `python -m` in this folder would (the folder first), without importing anything
        spec = importlib.machinery.PathFinder.find_spec(top, [os.getcwd(), *sys.path[1:]])
        if spec is None and top not in sys.builtin_module_names:
            raise LaunchError(f"module {script!r} cannot be found (no {top!r} in this folder or on sys.path); check "
                              f"the name, or pass a script path without -m.")
        return
    if not os.path.exists(script):
        raise LaunchError(f"script {script!r} does not exist (relative to {os.getcwd()!r}); check the path, or pass "
                          f"-m for a module.")
    if os.path.isdir(script) and not os.path.isfile(os.path.join(script, "__main__.py")):
        raise LaunchError(f"script {script!r} is a folder without __main__.py; pass the training script's path.")
    if not os.access(script, os.R_OK):
        raise LaunchError(f"script {script!r} is not readable; fix its permissions.")
    if os.path.isfile(script):
        check_python(script)


#: A script larger than this is not compiled before the launch (torchrun's python still reads it whole).
COMPILE_LIMIT = 16 * 1024 * 1024


def check_python(script: str) -> None:
    """torchrun runs the script with this Python: a shell script, a binary or a file with a syntax error would
    fail in every worker with torchrun's ChildFailedError traceback (issue 42). Read the shebang, then compile
    the source with this interpreter (nothing runs)."""
    with open(script, "rb") as handle:
        source = handle.read(COMPILE_LIMIT + 1)
    if len(source) > COMPILE_LIMIT or source.startswith(b"PK\x03\x04"):
        return  # too large to compile here, or a zip application (python runs its __main__.py)
    first = source.split(b"\n", 1)[0]
    if first.startswith(b"#!") and b"python" not in first:
        interpreter = first[2:].decode("utf-8", "replace").strip() or "another program"
        raise LaunchError(f"script {script!r} is a {interpreter} script, not Python, and torchrun runs its script "
                          f"with {sys.executable}. Fix: pass the Python training script it starts, or run it "
                          "directly (hwenv exec for a device selection).")
    try:
        compile(source, script, "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as error:
        where = f" (line {error.lineno}: {error.msg})" if isinstance(error, SyntaxError) and error.lineno else \
            f" ({error})"
        raise LaunchError(f"script {script!r} is not Python this interpreter can run{where}; torchrun would start "
                          f"{sys.executable} on it in every process and each would fail. Fix: pass the Python "
                          "training script, or fix that line.") from None


def check_log_dir(log_dir: str) -> None:
    """torchrun creates `--log-dir` (and its parents) when it starts: refuse a folder it cannot create or write
    (a path under a file, an unwritable parent, /proc) before, instead of its traceback."""
    path = os.path.abspath(log_dir)
    if os.path.isdir(path):
        if not os.access(path, os.W_OK | os.X_OK):
            raise LaunchError(f"--log-dir {log_dir!r} is not writable; torchrun writes its logs there. Fix its "
                              "permissions, or pass another folder.")
        return
    parent = os.path.dirname(path)
    while parent and not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise LaunchError(f"--log-dir {log_dir!r} cannot be created: {parent!r} is a file, not a folder. Pass a "
                          "folder path.")
    if not os.access(parent, os.W_OK | os.X_OK) or parent.startswith(("/proc", "/sys")):
        raise LaunchError(f"--log-dir {log_dir!r} cannot be created: {parent!r} is not writable. Fix its "
                          "permissions, or pass a folder you can write to.")


#: torchrun's default port of the static rendezvous (TCPStore on node rank 0).
DEFAULT_MASTER_PORT = 29500
_LOCAL_ADDRESSES = ("localhost", "127.0.0.1", "::1", "0.0.0.0", "::")


def check_master_port(args: argparse.Namespace) -> None:
    """On node rank 0 of a static rendezvous torchrun's store listens on --master-port (29500 by default): a port
    another process holds fails only inside torchrun, with its traceback (issue 42). Try to bind it first (as the
    store does, SO_REUSEADDR: a closed connection's TIME_WAIT does not count); nothing listens afterwards."""
    import socket

    if args.standalone or args.rdzv_backend not in (None, STATIC_RDZV) or args.rdzv_endpoint is not None:
        return
    if args.node_rank is not None and int(str(args.node_rank).strip()) != 0:
        return  # the store runs on node rank 0
    address = args.master_addr
    if address is not None and address.strip() not in (*_LOCAL_ADDRESSES, socket.gethostname()):
        return  # the store runs on another machine
    number = port(args.master_port, "--master-port") if args.master_port is not None else DEFAULT_MASTER_PORT
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("0.0.0.0", number))
    except OSError as error:
        given = "--master-port" if args.master_port is not None else "torchrun's default --master-port"
        raise LaunchError(f"{given} {number} is in use on this machine ({error.strerror or error}): torchrun's "
                          "rendezvous store listens there on node rank 0, so every process would fail. Fix: pass "
                          "another --master-port, or stop the process that holds it (an earlier launch still "
                          "running?).") from None
    finally:
        probe.close()


def check_launch(args: argparse.Namespace) -> None:
    """Validate `hwdist launch`'s options: torchrun's numbers, ports, rendezvous combinations, the script
    (not with `--dry-run`, whose command may be for another machine)."""
    for flag, dest in (("--nproc-per-node", "nproc_per_node"), ("--device-count", "device_count")):
        value = getattr(args, dest)
        if value is not None and value < 1:
            raise LaunchError(f"{flag} {value!r} must be a positive integer.")
    nodes = nnodes(args.nnodes) if args.nnodes is not None else (1, 1)
    if args.node_rank is not None:
        rank = _integer(args.node_rank, "--node-rank", 0)
        if nodes[0] == nodes[1] and rank >= nodes[1]:
            raise LaunchError(f"--node-rank {rank} is not below --nnodes {nodes[1]}: node ranks run 0..{nodes[1] - 1}.")
    if args.max_restarts is not None:
        _integer(args.max_restarts, "--max-restarts", 0)
    if args.monitor_interval is not None:
        try:
            interval = float(args.monitor_interval)
        except ValueError:
            interval = math.nan
        if not (math.isfinite(interval) and interval > 0):
            raise LaunchError(f"--monitor-interval {args.monitor_interval!r} must be a positive number of seconds.")
    if args.master_port is not None:
        port(args.master_port, "--master-port")
    if args.master_addr is not None and not str(args.master_addr).strip():
        raise LaunchError(f"--master-addr {args.master_addr!r} is empty; pass a host name or address.")
    if args.rdzv_endpoint is not None:
        _endpoint(args.rdzv_endpoint)
    if args.rdzv_conf is not None:
        bad = [item for item in str(args.rdzv_conf).split(",") if "=" not in item or not item.partition("=")[0].strip()]
        if bad:
            raise LaunchError(f"--rdzv-conf {args.rdzv_conf!r}: {bad[0]!r} is not KEY=VALUE; write e.g. "
                              f"join_timeout=600,read_timeout=60.")
    if args.log_dir is not None and os.path.exists(args.log_dir) and not os.path.isdir(args.log_dir):
        raise LaunchError(f"--log-dir {args.log_dir!r} is a file, not a folder; torchrun writes one folder of logs "
                          f"per run there. Pass a folder path.")
    rdzv = [flag for flag, dest in (("--rdzv-backend", "rdzv_backend"), ("--rdzv-endpoint", "rdzv_endpoint"),
                                    ("--rdzv-id", "rdzv_id")) if getattr(args, dest) is not None]
    if args.standalone and rdzv:
        raise LaunchError(f"--standalone chooses its own rendezvous, so {', '.join(rdzv)} would be ignored; drop "
                          f"--standalone for a multi-node rendezvous, or drop {', '.join(rdzv)}.")
    static = args.rdzv_backend in (None, STATIC_RDZV) and not args.standalone
    master = [flag for flag, dest in (("--master-addr", "master_addr"), ("--master-port", "master_port"))
              if getattr(args, dest) is not None]
    if master and not static:
        how = "--standalone" if args.standalone else f"--rdzv-backend {args.rdzv_backend}"
        raise LaunchError(f"{', '.join(master)} only apply to torchrun's static rendezvous and {how} ignores them; "
                          f"use --rdzv-endpoint HOST:PORT instead, or drop {', '.join(master)}.")
    if not args.dry_run:  # a dry run may print a command for another machine, where the script lives
        check_script(args.script, args.module)
        if args.log_dir is not None:
            check_log_dir(args.log_dir)  # the master port is checked last, just before torchrun starts (cli._launch)


def check_bench(args: argparse.Namespace) -> None:
    """Validate `hwdist bench`'s numbers and size list before any process group starts."""
    from .sizes import parse_sizes

    for name, value, minimum in (("--iters", args.iters, 1), ("--warmup", args.warmup, 0), ("--repeats", args.repeats, 1)):
        if value < minimum:
            raise BenchError(f"{name} {value} must be >= {minimum}.")
    if not (math.isfinite(args.timeout) and args.timeout > 0):
        raise BenchError(f"--timeout {args.timeout!r} must be a positive number of seconds.")
    if args.step_factor is not None:
        if args.sizes is None or ".." not in args.sizes:
            raise BenchError(f"--step-factor {args.step_factor} spaces a size range (8B..1G), and --sizes "
                             f"{args.sizes!r} is not a range; pass a range, or leave --step-factor out.")
        parse_sizes(args.sizes, args.step_factor)
    elif args.sizes is not None:
        parse_sizes(args.sizes)


__all__ = ["check_bench", "check_launch", "check_log_dir", "check_master_port", "check_python", "check_script", "nnodes",
           "port"]

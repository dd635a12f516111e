"""Bad inputs for the `hwdist` CLI (issue 27): each through `python -m hwdist` in a scratch folder."""

from __future__ import annotations

from reliability_case import (
    Case,  # tests/reliability is on sys.path (reliability_tables puts it there)
)

M = "hwdist"
LAUNCH = ("launch", "--kind", "cpu")

CASES: tuple[Case, ...] = (
    Case("hwdist-launch-missing-script", M, (*LAUNCH, "missing.py"), "traceback-from-cli",
         "torchrun's ChildFailedError report, exit 1", "one-line error before torchrun starts", "missing.py"),
    Case("hwdist-launch-missing-module", M, (*LAUNCH, "-m", "no_such_module_xyz"), "traceback-from-cli",
         "torchrun's ChildFailedError report, exit 1", "one-line error before torchrun starts",
         "no_such_module_xyz"),
    Case("hwdist-launch-port-0", M, (*LAUNCH, "--master-port", "0", "train.py"), "silently-accepted",
         "passed to torchrun", "one-line error: ports are 1..65535", "'0'"),
    Case("hwdist-launch-port-70000", M, (*LAUNCH, "--master-port", "70000", "train.py"), "traceback-from-cli",
         "passed to torchrun (not re-run here)", "one-line error: ports are 1..65535", "70000"),
    Case("hwdist-launch-port-abc", M, (*LAUNCH, "--master-port", "abc", "train.py"), "unclear-error",
         "torchrun's usage block", "one-line error: ports are 1..65535", "abc"),
    Case("hwdist-launch-by-index-on-cuda", M,
         ("launch", "--kind", "cuda", "--by", "index", "--devices", "0", "--dry-run", "train.py"),
         "silently-accepted", "exit 0, --by ignored", "one-line error: --by is Gaudi-only", "--by index"),
    Case("hwdist-launch-standalone-rdzv", M, (*LAUNCH, "--standalone", "--rdzv-endpoint", "node0:29400", "train.py"),
         "silently-accepted", "torchrun ignores the endpoint (its documented behaviour)", "one-line error naming the ignored option",
         "--rdzv-endpoint"),
    Case("hwdist-launch-master-port-with-c10d", M,
         (*LAUNCH, "--rdzv-backend", "c10d", "--master-port", "29500", "train.py"), "silently-accepted",
         "torchrun ignores --master-port (its documented behaviour)", "one-line error: use --rdzv-endpoint", "--master-port"),
    Case("hwdist-launch-node-rank-too-big", M, (*LAUNCH, "--nnodes", "2", "--node-rank", "2", "train.py"),
         "hang-unbounded", "passed to torchrun, whose rendezvous cannot complete (not re-run here)", "one-line error: node ranks run 0..1",
         "--node-rank 2"),
    Case("hwdist-launch-nnodes-backwards", M, (*LAUNCH, "--nnodes", "4:2", "train.py"), "unclear-error",
         "passed to torchrun (not re-run here)", "one-line error: MIN:MAX", "4:2"),
    Case("hwdist-launch-no-script", M, ("launch",), "unclear-error", "argparse usage block",
         "one line naming the missing argument and --help", "script"),
    Case("hwdist-no-subcommand", M, (), "unclear-error", "argparse usage block",
         "one line naming the sub-commands and --help", "{launch,bench}"),
    Case("hwdist-launch-log-dir-is-a-file", M, (*LAUNCH, "--log-dir", "README.md", "train.py"), "unclear-error",
         "passed to torchrun (not re-run here)", "one-line error: a folder is needed", "README.md"),
    Case("hwdist-launch-device-unknown", M, ("launch", "--dry-run", "train.py"), "traceback-from-cli",
         "clear error (already one line)", "one-line error naming the kinds", "bogus",
         env={"HWENV_DEVICE": "bogus"}),
    Case("hwdist-bench-size-too-big", M, ("bench", "--sizes", "1T"), "traceback-from-cli",
         "torch allocation traceback (DefaultCPUAllocator)", "one-line error with the memory available and a "
         "size that fits", "1T"),
    Case("hwdist-bench-size-malformed", M, ("bench", "--sizes", "12Q"), "unclear-error",
         "clear error (already one line)", "one-line error naming the size forms", "12Q"),
    Case("hwdist-bench-step-factor-with-list", M, ("bench", "--sizes", "1K,1M", "--step-factor", "4"),
         "silently-accepted", "exit 0, factor ignored", "one-line error: the factor spaces a range", "1K,1M"),
    Case("hwdist-bench-timeout-nan", M, ("bench", "--timeout", "nan"), "traceback-from-cli",
         "ValueError traceback from timedelta(seconds=nan) in init()", "one-line error: a positive number", "nan"),
    Case("hwdist-bench-iters-0", M, ("bench", "--iters", "0"), "unclear-error",
         "error only after the process group started", "one-line error before any group", "--iters 0"),
    Case("hwdist-bench-device-unknown", M, ("bench", "--sizes", "8B"), "traceback-from-cli",
         "DeviceOverrideError traceback from init()", "one-line error naming the kinds", "bogus",
         env={"HWENV_DEVICE": "bogus"}),
)

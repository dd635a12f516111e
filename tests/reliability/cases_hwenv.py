"""Bad inputs for the `hwenv` CLI (issue 27): each through `python -m hwenv.cli` in a scratch folder."""

from __future__ import annotations

from reliability_case import (
    Case,  # tests/reliability is on sys.path (reliability_tables puts it there)
)

M = "hwenv.cli"

CASES: tuple[Case, ...] = (
    Case("hwenv-device-unknown", M, ("env",), "traceback-from-cli", "clear error (already one line)",
         "one-line error naming the kinds", "bogus", env={"HWENV_DEVICE": "bogus"}),
    Case("hwenv-device-absent", M, ("env",), "traceback-from-cli", "clear error (already one line)",
         "one-line error: the kind is not usable here, and why", "xpu", env={"HWENV_DEVICE": "xpu"}),
    Case("hwenv-exec-missing-program", M, ("exec", "--kind", "cuda", "--devices", "0", "--", "no-such-program-xyz"),
         "traceback-from-cli", "clear error (FileNotFoundError caught)", "one-line error before exec",
         "no-such-program-xyz"),
    Case("hwenv-exec-not-executable", M, ("exec", "--kind", "cuda", "--devices", "0", "--", "./script.sh"),
         "traceback-from-cli", "PermissionError traceback from os.execvpe", "one-line error: chmod +x or use its "
         "interpreter", "./script.sh"),
    Case("hwenv-exec-directory", M, ("exec", "--kind", "cuda", "--", "./data"), "traceback-from-cli",
         "PermissionError traceback from os.execvpe", "one-line error: a directory, not a program", "./data"),
    Case("hwenv-by-index-on-xpu", M, ("env", "--kind", "xpu", "--by", "index", "--devices", "0"),
         "silently-accepted", "exit 0, --by ignored", "one-line error: --by is Gaudi-only", "--by index"),
    Case("hwenv-by-without-devices", M, ("env", "--kind", "hpu", "--by", "index"), "silently-accepted",
         "exit 0, --by ignored", "one-line error: --by needs --devices", "--by index"),
    Case("hwenv-no-pci-order-on-hpu", M, ("env", "--kind", "hpu", "--no-pci-order", "--devices", "3"),
         "silently-accepted", "exit 0, flag ignored", "one-line error: XPU-only flag", "--no-pci-order"),
    Case("hwenv-kind-unknown", M, ("env", "--kind", "gpu"), "unclear-error", "argparse usage block (3 lines)",
         "one line naming the choices and --help", "'gpu'"),
    Case("hwenv-no-subcommand", M, (), "unclear-error", "argparse usage block (3 lines)",
         "one line naming the sub-commands and --help", "{doctor,env,exec}"),
    Case("hwenv-mask-subdevice-flat", M, ("env", "--kind", "xpu", "--devices", "0.1"), "silently-accepted",
         "clear error already (the hierarchy reader refuses what the driver would skip silently)",
         "one-line error naming the hierarchy rule", "0.1"),
    Case("hwenv-mask-garbage", M, ("env", "--kind", "xpu", "--devices", "0,,x"), "unclear-error",
         "clear error (already one line)", "one-line error naming the empty item", "0,,x"),
    Case("hwenv-gaudi-group", M, ("env", "--kind", "hpu", "--devices", "0,2"), "silently-accepted",
         "clear error (already one line)", "one-line error naming the supported groups", "[0, 2]"),
    Case("hwenv-cuda-index-garbage", M, ("env", "--kind", "cuda", "--devices", "0,x"), "unclear-error",
         "clear error (already one line)", "one-line error naming the item", "0,x"),
    Case("doctor-gaudi-module-out-of-range", M, ("doctor", "--json"), "silently-accepted",
         "doctor: only the exported-selection warning", "doctor problem invalid-gaudi-selection", "[9]",
         env={"HABANA_VISIBLE_MODULES": "9"}, expect="doctor-problem", problem="invalid-gaudi-selection"),
    Case("doctor-gaudi-unsupported-group", M, ("doctor", "--json"), "silently-accepted",
         "doctor: only the exported-selection warning", "doctor problem invalid-gaudi-selection", "[0, 2]",
         env={"HABANA_VISIBLE_MODULES": "0,2"}, expect="doctor-problem", problem="invalid-gaudi-selection"),
    Case("doctor-gaudi-variables-disagree", M, ("doctor", "--json"), "silently-accepted",
         "doctor: only the exported-selection warning", "doctor problem invalid-gaudi-selection (hl-smi cannot confirm them here)",
         "HABANA_VISIBLE_DEVICES='2,3'",
         env={"HABANA_VISIBLE_MODULES": "0,1", "HABANA_VISIBLE_DEVICES": "2,3"}, expect="doctor-problem",
         problem="invalid-gaudi-selection"),
    Case("doctor-mask-subdevice-flat", M, ("doctor", "--json"), "silently-accepted",
         "doctor problem (added with the hierarchy reader)", "doctor problem invalid-affinity-mask", "0.1",
         env={"ZE_AFFINITY_MASK": "0.1"}, expect="doctor-problem", problem="invalid-affinity-mask"),
    Case("doctor-cuda-visible-garbage", M, ("doctor", "--json"), "silently-accepted",
         "doctor: only the exported-selection warning", "doctor problem invalid-device-selection", "0,x",
         env={"CUDA_VISIBLE_DEVICES": "0,x"}, expect="doctor-problem", problem="invalid-device-selection"),
    Case("doctor-hip-visible-duplicate", M, ("doctor", "--json"), "silently-accepted",
         "doctor: no problem", "doctor problem invalid-device-selection", "1,1",
         env={"HIP_VISIBLE_DEVICES": "1,1"}, expect="doctor-problem", problem="invalid-device-selection"),
    Case("doctor-lazy-mode-malformed-off-gaudi", M, ("doctor", "--json"), "silently-accepted",
         "doctor: named only on a Gaudi", "doctor problem lazy-mode-malformed on every machine", "'yes'",
         env={"PT_HPU_LAZY_MODE": "yes"}, expect="doctor-problem", problem="lazy-mode-malformed"),
    Case("doctor-int64-malformed-off-gaudi", M, ("doctor", "--json"), "silently-accepted",
         "doctor: named only on a Gaudi", "doctor problem int64-flag-malformed on every machine", "'2'",
         env={"PT_ENABLE_INT64_SUPPORT": "2"}, expect="doctor-problem", problem="int64-flag-malformed"),
)

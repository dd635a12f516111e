#!/usr/bin/env bash
# Run hwstack's benchmarks on a lent NVIDIA H200 in one call (see tools/bench/README.md).
# Usage (on the GPU machine, repo root):  bash tools/bench/run_h200.sh OUTDIR BENCH...
#   BENCH: attention compile collectives decode train (default: all)
#   TIMEOUT_<BENCH>=seconds (default 300) and ARGS_<BENCH>="--flag ..." per bench
# Wheels for our pinned transformers (and bitsandbytes) are carried in .whl/ and installed into
# /tmp/site; our packages are pure Python and come from their src/ folders via PYTHONPATH.
set -uo pipefail
out="${1:?output dir}"; shift
benches=("$@"); [ ${#benches[@]} -eq 0 ] && benches=(attention compile collectives decode train)
mkdir -p "$out"
source tools/gpu_env.sh
{
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv
    python3 -c "import torch, transformers, accelerate, peft; print('torch', torch.__version__, 'transformers', transformers.__version__, 'accelerate', accelerate.__version__, 'peft', peft.__version__)"
    python3 -c "import bitsandbytes; print('bitsandbytes', bitsandbytes.__version__)" 2>&1 | tail -1
    python3 -m hwenv.cli doctor
} > "$out/environment.txt" 2>&1
cat "$out/environment.txt"
status=0
for bench in "${benches[@]}"; do
    echo "=== $bench"
    start=$(date +%s)
    limit_var="TIMEOUT_${bench^^}"; limit="${!limit_var:-300}"  # e.g. TIMEOUT_DECODE=240
    args_var="ARGS_${bench^^}"; read -r -a extra <<< "${!args_var:-}"  # e.g. ARGS_DECODE="--profile"
    case "$bench" in
        collectives) timeout "$limit" python3 -m torch.distributed.run --nproc-per-node 1 --master-port 29533 tools/bench/collectives.py --out "$out/$bench" ;;
        *) timeout "$limit" python3 "tools/bench/$bench.py" --out "$out/$bench" "${extra[@]}" ;;
    esac
    rc=$?
    echo "=== $bench rc=$rc seconds=$(( $(date +%s) - start ))"
    [ $rc -ne 0 ] && status=1
done
exit $status

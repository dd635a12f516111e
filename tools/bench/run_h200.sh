#!/usr/bin/env bash
# Run hwstack's benchmarks on a lent NVIDIA GPU (H100/H200) in one call, offline as they are (issue 38.4).
# Usage (on the GPU machine, repo root):  bash tools/bench/run_h200.sh OUTDIR BENCH...
#   BENCH: attention compile collectives decode train (default: all), or any tools/bench/NAME.py
#   TIMEOUT_<BENCH>=seconds (default 300) and ARGS_<BENCH>="--flag ..." per bench
# Wheels for our pinned transformers (and what the image lacks: openai and its deps, ...) are carried in .whl/
# (python3 tools/carry_wheels.py [--bench quantization ...] here first; --check says whether they cover every
# bench's imports) and installed into /tmp/site; our packages are pure Python, from their src/ folders.
# Each bench writes its own JSON (command, UTC date, device, versions: tools/bench/bench_record.py); this script
# adds OUTDIR/environment.txt and OUTDIR/runs.jsonl (one line per bench: its command, exit code, seconds).
set -uo pipefail
out="${1:?output dir}"; shift
benches=("$@"); [ ${#benches[@]} -eq 0 ] && benches=(attention compile collectives decode train)
mkdir -p "$out"
source tools/gpu_env.sh
# Transformers' own side (plain from_pretrained, Trainer, generate, `transformers serve`): transformers 5.25 turns
# Hub kernels on when `use_kernels` is absent and fetches kernels-community/... from the Hub, which this machine
# cannot reach (the plain Trainer and `transformers serve` died of it on 2026-12-06). hwrun passes use_kernels=False
# itself. Set here for every bench (they also set it themselves); not in gpu_env.sh, whose gpu tests run hwrun
# without it, as a user meets it.
export USE_HUB_KERNELS="${USE_HUB_KERNELS:-NO}"
{
    date -u +"date: %Y-%m-%dT%H:%M:%SZ"
    echo "command: bash tools/bench/run_h200.sh $out ${benches[*]}"
    git rev-parse HEAD 2>/dev/null | sed 's/^/git: /'
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv
    python3 -c "import torch, transformers, accelerate, peft; print('torch', torch.__version__, 'transformers', transformers.__version__, 'accelerate', accelerate.__version__, 'peft', peft.__version__)"
    python3 -c "import openai, pydantic; print('openai', openai.__version__, 'pydantic', pydantic.__version__)" 2>&1 | tail -1
    python3 -c "import bitsandbytes; print('bitsandbytes', bitsandbytes.__version__)" 2>&1 | tail -1
    python3 -c "import torchao; print('torchao', torchao.__version__)" 2>&1 | tail -1
    echo "USE_HUB_KERNELS=$USE_HUB_KERNELS HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-} TRANSFORMERS_OFFLINE=${TRANSFORMERS_OFFLINE:-}"
    python3 -m hwenv.cli doctor
} > "$out/environment.txt" 2>&1
cat "$out/environment.txt"
status=0
for bench in "${benches[@]}"; do
    echo "=== $bench"
    start=$(date +%s)
    # a wheel missing here fails in seconds, by name, instead of minutes into the bench
    python3 tools/carry_wheels.py --probe "tools/bench/$bench.py" || echo "=== $bench: see the line above"
    limit_var="TIMEOUT_${bench^^}"; limit="${!limit_var:-300}"  # e.g. TIMEOUT_DECODE=240
    args_var="ARGS_${bench^^}"; read -r -a extra <<< "${!args_var:-}"  # e.g. ARGS_DECODE="--profile"
    case "$bench" in
        collectives) cmd=(python3 -m torch.distributed.run --nproc-per-node 1 --master-port 29533 tools/bench/collectives.py --out "$out/$bench") ;;
        *) cmd=(python3 "tools/bench/$bench.py" --out "$out/$bench" "${extra[@]}") ;;
    esac
    timeout "$limit" "${cmd[@]}"
    rc=$?
    seconds=$(( $(date +%s) - start ))
    echo "=== $bench rc=$rc seconds=$seconds"
    python3 -c 'import json, sys; print(json.dumps({"bench": sys.argv[1], "rc": int(sys.argv[2]), "seconds": int(sys.argv[3]), "timeout_s": int(sys.argv[4]), "command": sys.argv[5:]}))' \
        "$bench" "$rc" "$seconds" "$limit" "${cmd[@]}" >> "$out/runs.jsonl"
    [ $rc -ne 0 ] && status=1
done
exit $status

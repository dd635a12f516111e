#!/usr/bin/env bash
# Run the tests that need a real accelerator (pytest marker `gpu`) on a GPU machine, e.g. the lent H200:
#   bash tools/run_gpu_tests.sh OUTDIR
# Wheels in .whl/ (our locked transformers, accelerate, peft, kernels) are installed into /tmp/site;
# our packages are pure Python and come from their src/ folders. Writes OUTDIR/gpu-tests.{txt,xml}
# with the date, GPU, versions and one line per test; copy the summary into docs/gpu-tests.md.
set -uo pipefail
out="${1:?output dir}"
mkdir -p "$out"
source tools/gpu_env.sh
{
    date -u +"date: %Y-%m-%d %H:%M UTC"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'
    python3 -c "import torch, transformers; print('torch', torch.__version__, '| transformers', transformers.__version__)"
} > "$out/gpu-tests.txt" 2>&1
python3 -m pytest -m gpu -p no:cacheprovider -o addopts="" --import-mode=importlib -rA -q \
    --junitxml="$out/gpu-tests.xml" tests/gpu 2>&1 | tee -a "$out/gpu-tests.txt"
exit "${PIPESTATUS[0]}"

#!/usr/bin/env bash
# Run the tests that need a real accelerator (pytest marker `gpu`) on a GPU machine, e.g. the lent H200:
#   bash tools/run_gpu_tests.sh OUTDIR
# Wheels in .whl/ (our locked transformers, accelerate, peft, kernels) are installed into /tmp/site;
# our packages are pure Python and come from their src/ folders. Writes OUTDIR/gpu-tests.{txt,xml}
# with the date, GPU, versions and one line per test; copy the summary into docs/gpu-tests.md.
set -uo pipefail
out="${1:?output dir}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
fi
src=""
for p in hwenv hwattn hwcompile hwdist hwrun; do src="$src:$PWD/packages/$p/src"; done
export PYTHONPATH="/tmp/site${src}"
{
    date -u +"date: %Y-%m-%d %H:%M UTC"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'
    python3 -c "import torch, transformers; print('torch', torch.__version__, '| transformers', transformers.__version__)"
} > "$out/gpu-tests.txt" 2>&1
python3 -m pytest -m gpu -p no:cacheprovider -o addopts="" --import-mode=importlib -rA -q \
    --junitxml="$out/gpu-tests.xml" tests/gpu 2>&1 | tee -a "$out/gpu-tests.txt"
exit "${PIPESTATUS[0]}"

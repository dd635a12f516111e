# Sourced by tools/run_gpu_tests.sh and tools/bench/run_h200.sh on a GPU machine (repo root): NVLink
# multicast off, offline Hub, carried wheels in .whl/ installed into /tmp/site, our packages from src/.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# (USE_HUB_KERNELS=NO is not set here: the gpu tests run hwrun as a user meets it, without the variable (hwrun
# passes use_kernels=False itself); the benches set it for Transformers' side, tools/bench/bench_record.py, and
# tools/bench/run_h200.sh exports it)
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
fi
src=""
for p in hwenv hwattn hwcompile hwdist hwrun; do src="$src:$PWD/packages/$p/src"; done
export PYTHONPATH="/tmp/site${src}"

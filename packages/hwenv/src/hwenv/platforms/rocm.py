"""AMD GPUs under ROCm: torch's `cuda` device type on a HIP build (`torch.version.hip` set).

The worked example of a new kind: this file plus one row in each per-package table.
RCCL is reached through the `nccl` backend name; FlashAttention-3/4 are NVIDIA-only.
"""

from __future__ import annotations

from ..probes import ProbeResult
from .base import Platform
from .cuda import gpu_probe

PLATFORM = Platform(
    kind="rocm",
    device_type="cuda",
    display_name="AMD GPU (ROCm)",
    probe="hwenv.platforms.rocm:probe",
    priority=35,
    visible_devices=("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"),
    selection_grammar="indices",
    dist_backend="nccl",
    dist_backend_note="RCCL, reached through torch.distributed's 'nccl' backend name",
    compile_backend="inductor",
    graph_api="cuda_graphs",  # HIP graphs behind torch.cuda.CUDAGraph
    triton=True,
    memory_api="torch.cuda.get_device_properties().total_memory",
    bf16_api="torch.cuda.is_bf16_supported()",
    torch_module="torch.cuda",
    vendor="amd",
)


def probe() -> ProbeResult:
    """AMD GPU through `torch.cuda` on a ROCm (HIP) build of torch."""
    return gpu_probe("rocm", hip=True)

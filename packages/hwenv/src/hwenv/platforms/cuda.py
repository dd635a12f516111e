"""NVIDIA GPUs through `torch.cuda` (a CUDA build of torch: `torch.version.hip` is None)."""

from __future__ import annotations

from ..probes import ProbeResult, memory_of, torch_missing, torch_module
from .base import Platform

PLATFORM = Platform(
    kind="cuda",
    device_type="cuda",
    display_name="NVIDIA GPU (CUDA)",
    probe="hwenv.platforms.cuda:probe",
    priority=40,
    visible_devices=("CUDA_VISIBLE_DEVICES",),
    selection_grammar="indices",
    dist_backend="nccl",
    compile_backend="inductor",
    graph_api="cuda_graphs",
    triton=True,
    memory_api="torch.cuda.get_device_properties().total_memory",
    bf16_api="torch.cuda.is_bf16_supported()",
    torch_module="torch.cuda",
    vendor="nvidia",
)


def gpu_probe(kind: str, hip: bool) -> ProbeResult:
    """The shared `torch.cuda` probe of NVIDIA (`hip=False`) and AMD ROCm (`hip=True`) builds."""
    if (missing := torch_missing(kind)) is not None:
        return missing
    torch = torch_module()
    hip_version = getattr(getattr(torch, "version", None), "hip", None)
    if bool(hip_version) != hip:
        build = f"a ROCm build (torch.version.hip={hip_version!r})" if hip_version else "a CUDA build (no torch.version.hip)"
        return ProbeResult(kind, False, reason=f"this torch is {build}")
    if not torch.cuda.is_available():
        return ProbeResult(kind, False, reason="torch.cuda.is_available() is False")
    count = int(torch.cuda.device_count())
    names = tuple(str(torch.cuda.get_device_name(index)) for index in range(count))
    capability = tuple(torch.cuda.get_device_capability(0))
    details = {"torch.version.hip": str(hip_version)} if hip else {}
    return ProbeResult(
        kind,
        True,
        count,
        names,
        bool(torch.cuda.is_bf16_supported()),
        memory_of(torch.cuda.get_device_properties, count),
        (int(capability[0]), int(capability[1])),
        details=details,
        bf16_source="torch.cuda.is_bf16_supported()",
        memory_source="torch.cuda.get_device_properties().total_memory",
    )


def probe() -> ProbeResult:
    """NVIDIA GPU through `torch.cuda`, on a torch built for CUDA (not ROCm)."""
    return gpu_probe("cuda", hip=False)

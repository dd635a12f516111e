"""`Platform`: one device kind's facts as frozen data, readable without torch.

Every package asks a platform instead of comparing kind strings (vLLM's `Platform` class
attributes, DeepSpeed's accelerator files). Runtime calls that need torch live in
`hwenv.platforms.runtime`; per-package decisions live in tables keyed by `Platform.kind`.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Graph-capture APIs a platform can have (`Platform.graph_api`).
GRAPH_APIS = ("cuda_graphs", "xpu_graphs", "hpu_graphs", "none")
#: Grammars of the visible-devices variable (`Platform.selection_grammar`).
SELECTION_GRAMMARS = ("affinity-mask", "module-ids", "indices", "none")


@dataclass(frozen=True)
class Platform:
    """The facts of one device kind; one instance per kind, registered in `hwenv.platforms`.

    `probe` is an import path (`"package.module:function"`) to a function returning a
    `hwenv.ProbeResult`; nothing heavy is imported until detection runs it.
    """

    kind: str
    device_type: str
    display_name: str
    probe: str
    priority: int
    is_accelerator: bool = True
    indexed_device: bool = True
    visible_devices: tuple[str, ...] = ()
    selection_grammar: str = "none"
    dist_backend: str = "gloo"
    dist_backend_note: str = ""
    compile_backend: str = "inductor"
    lazy_mode_variable: str | None = None
    graph_api: str = "none"
    triton: bool = False
    memory_api: str | None = None
    bf16_api: str | None = None
    torch_module: str | None = None
    plugin_module: str | None = None
    device_calls_take_index: bool = True
    #: How many of the visible devices one process can use: None = all of them (CUDA, XPU, ROCm); 1 = only
    #: its own (Gaudi: the bridge's `HPUGuardImpl.h` refuses any other index), so a model larger than one
    #: device needs one process per device, and `device_map="auto"` in one process offloads to CPU.
    devices_per_process: int | None = None
    #: Why `devices_per_process` is what it is (the source), for plans and doctor.
    devices_per_process_note: str = ""
    #: "module:function" returning `(variables, reason)` a run of this kind needs set
    #: (`function(environ, device_names)`), or None when it needs none (`hwenv.run_environment`).
    run_env: str | None = None
    vendor: str = ""
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.kind or not self.kind.replace("_", "").isalnum() or self.kind != self.kind.lower():
            raise ValueError(f"Platform kind {self.kind!r} must be a lower-case identifier such as 'xpu'.")
        if self.graph_api not in GRAPH_APIS:
            raise ValueError(f"Platform {self.kind!r}: graph_api {self.graph_api!r} is not one of {GRAPH_APIS}.")
        if self.selection_grammar not in SELECTION_GRAMMARS:
            raise ValueError(
                f"Platform {self.kind!r}: selection_grammar {self.selection_grammar!r} is not one of {SELECTION_GRAMMARS}."
            )
        if ":" not in self.probe:
            raise ValueError(f"Platform {self.kind!r}: probe {self.probe!r} must be 'module:function'.")
        if self.devices_per_process is not None and self.devices_per_process < 1:
            raise ValueError(f"Platform {self.kind!r}: devices_per_process={self.devices_per_process!r} must be "
                             f"None (every visible device) or at least 1.")

    def usable_devices(self, visible: int) -> int:
        """How many of `visible` devices one process of this kind can place a model on."""
        return visible if self.devices_per_process is None else min(visible, self.devices_per_process)

    @property
    def device(self) -> str:
        """The torch device string of the first device: `xpu:0`, `cuda:0`, `hpu`, `mps`, `cpu`."""
        return f"{self.device_type}:0" if self.indexed_device else self.device_type

    @property
    def visible_devices_variable(self) -> str | None:
        """The primary variable that restricts which devices a process sees, or None."""
        return self.visible_devices[0] if self.visible_devices else None

    @property
    def selectable(self) -> bool:
        """Whether a device list can be given for this kind (`--devices`)."""
        return self.selection_grammar != "none"

    @property
    def has_graphs(self) -> bool:
        """Whether the device has a graph-capture API hwstack can drive."""
        return self.graph_api != "none"

"""Graph capture in the fakes: `OpTape` replays what a capture recorded on the same tensors; the Gaudi fake's
HPU graphs (lazy mode only) and the XPU fake's graphs run through `hwenv.platforms.runtime.graph_tools`
with the real APIs' names and signatures (the XPU ones checked against the installed torch).

Sources (docs/intel-fidelity.md rows hpu-graphs and xpu-graphs): gaudi-pytorch-bridge 1.19.0, commit 5a56187,
`python_packages/habana_frameworks/torch/hpu/graphs.py` (HPUGraph, graph), `hpu/streams.py`, `hpu/__init__.py`
(graphs exported only `if is_lazy()`), `HPUGraph.cpp` (capture_begin records into the lazy context); PyTorch
`torch/xpu/graphs.py` of the installed torch."""

from __future__ import annotations

import inspect

import pytest
import torch
from hwenv.platforms import get_platform, runtime
from hwenv.testing import fake_gaudi, fake_xpu
from hwenv.testing.graphs import GraphCaptureError, OpTape


class Step:
    """A decode-like step over fixed buffers: x <- tanh(W x + b), t <- t + 1, a row written at t."""

    def __init__(self):
        gen = torch.Generator().manual_seed(0)
        self.w, self.b = torch.randn(4, 4, generator=gen), torch.randn(4, generator=gen)
        self.x, self.t = torch.ones(4), torch.zeros(1, dtype=torch.long)
        self.out = torch.zeros(8, 4)

    def __call__(self):
        y = torch.tanh(self.w @ self.x + self.b)
        self.x.copy_(y)
        self.t.add_(1)
        self.out.index_copy_(0, self.t, y.unsqueeze(0))


def _eager(n):
    step = Step()
    for _ in range(n):
        step()
    return step


def test_tape_replays_the_captured_ops_on_the_same_tensors():
    step = Step()
    tape = OpTape("test")
    tape.begin()
    step()  # runs once while recording, as a real capture does not (restore below)
    tape.end()
    step.x.fill_(1.0)
    step.t.zero_()
    step.out.zero_()
    for _ in range(5):
        tape.replay()
    reference = _eager(5)
    assert torch.equal(step.out, reference.out) and torch.equal(step.t, reference.t)


def test_a_host_read_during_capture_fails_as_on_a_device():
    tape = OpTape("test")
    x = torch.ones(3)
    tape.begin()
    try:
        with pytest.raises(GraphCaptureError, match="_local_scalar_dense ran during graph capture"):
            (x * 2).sum().item()
    finally:
        tape.end()
    with pytest.raises(GraphCaptureError, match="capture_end\\(\\) without capture_begin"):
        tape.end()


def _capture_with(tools, step, device="cpu"):
    """hwrun's capture sequence: side stream, warm-up, capture, then replays."""
    side = tools.stream_class(device=device)
    side.wait_stream(tools.current_stream(device))
    with tools.use_stream(side):
        pass
    graph = tools.graph_class()
    with tools.capture(graph):
        step()
    return graph


def test_gaudi_fake_hpu_graphs_in_lazy_mode():
    with fake_gaudi(1, lazy_mode="1") as fake:
        tools = runtime.graph_tools(get_platform("hpu"))
        import habana_frameworks.torch.hpu.graphs as graphs

        assert tools.api == "hpu_graphs" and tools.graph_class is graphs.HPUGraph and tools.capture is graphs.graph
        assert tools.current_stream is torch.hpu.current_stream and tools.use_stream is torch.hpu.stream
        step = Step()
        graph = _capture_with(tools, step)
        step.x.fill_(1.0)
        step.t.zero_()
        step.out.zero_()
        for _ in range(4):
            graph.replay()
        assert torch.equal(step.out, _eager(4).out)
        assert fake.graph_events == ["wait_stream", "use_stream", "use_stream", "capture_begin", "capture_end",
                                     "replay", "replay", "replay", "replay"]


def test_gaudi_fake_has_no_hpu_graphs_in_eager_mode_or_without_the_bridge():
    assert runtime.graph_tools(get_platform("hpu")) is None  # no habana_frameworks here
    with fake_gaudi(1, lazy_mode="0"):
        assert runtime.graph_tools(get_platform("hpu")) is None
        import habana_frameworks.torch.hpu.graphs as graphs

        with pytest.raises(RuntimeError, match="lazy execution context"):
            graphs.HPUGraph().capture_begin()


def test_xpu_fake_graphs_through_torchs_own_graph_context():
    with fake_xpu(1) as fake:
        tools = runtime.graph_tools(get_platform("xpu"))
        assert tools.graph_class is torch.xpu.XPUGraph and tools.capture is torch.xpu.graph
        step = Step()
        graph = _capture_with(tools, step)
        step.x.fill_(1.0)
        step.t.zero_()
        step.out.zero_()
        for _ in range(3):
            graph.replay()
        assert torch.equal(step.out, _eager(3).out)
        assert fake.graph_events.index("capture_begin") < fake.graph_events.index("capture_end") < \
            fake.graph_events.index("replay")
    with pytest.raises(RuntimeError):
        torch.xpu.Stream()  # the fake is gone: torch's own (dummy) class again


def _signature(function, *, drop_first=True):
    params = list(inspect.signature(function).parameters.values())[1 if drop_first else 0:]
    return [(p.name, p.kind, p.default) for p in params]


def test_xpu_fake_graph_names_and_signatures_match_installed_torch():
    real_graph, real_stream = torch.xpu.XPUGraph, torch.xpu.Stream
    real_functions = {name: getattr(torch.xpu, name) for name in ("current_stream", "stream")}
    with fake_xpu(1) as fake:
        fake_graph, fake_stream = torch.xpu.XPUGraph, torch.xpu.Stream
        assert fake_graph is not real_graph
        for name, function in fake.graph_functions.items():
            assert _signature(function, drop_first=False) == _signature(real_functions[name], drop_first=False), name
    public = lambda cls: {n for n, v in vars(cls).items() if callable(v) and not n.startswith("_")}  # noqa: E731
    assert public(fake_graph) == public(real_graph)
    for name in public(real_graph):
        assert _signature(getattr(fake_graph, name)) == _signature(getattr(real_graph, name)), name
    assert _signature(fake_graph.__init__) == _signature(real_graph.__new__)
    assert public(fake_stream) <= public(real_stream)
    for name in public(fake_stream):
        assert _signature(getattr(fake_stream, name)) == _signature(getattr(real_stream, name)), name
    assert _signature(fake_stream.__init__) == _signature(real_stream.__new__)

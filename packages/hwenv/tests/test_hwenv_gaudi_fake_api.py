"""What the Gaudi fake was missing (issue 41.6): `hpu/random.py`, `default_stream`, and HPU graphs that capture.

Sources, gaudi-pytorch-bridge 1.19.0 (commit 5a56187), `python_packages/habana_frameworks/torch/`:
`hpu/random.py` (one default generator; `get_rng_state`/`set_rng_state` only for device 0; `manual_seed_all` =
`manual_seed`; `set_rng_state_all` takes exactly one state), `hpu/streams.py` `default_stream(device=None)`,
`hpu/graphs.py` `wrap_in_hpu_graph` / `wrapped_hpugraph_forward` (one graph per input hash, captured on the first
call and replayed after with the new inputs copied into the captured ones; `bypass_hpu_graphs=True` calls
through; a full cache (`max_graphs`) calls through), `make_graphed_callables`, `ModuleCacher(max_graphs=10)`.
Callers: transformers 5.25 `trainer_utils.set_seed` (`torch.hpu.manual_seed_all`), `trainer.py`
(`torch.hpu.random.get_rng_state_all()` in checkpoints).
"""

from __future__ import annotations

import pytest
import torch
from hwenv.testing import fake_gaudi


def test_transformers_set_seed_runs_under_the_fake_and_seeds_the_hpu_generator():
    import transformers

    with fake_gaudi(8) as fake:
        assert transformers.utils.is_torch_hpu_available()
        transformers.set_seed(1234)  # raised AttributeError: torch.hpu has no manual_seed_all
        assert fake.hpu.initial_seed() == 1234
        states = torch.hpu.random.get_rng_state_all()  # what Trainer saves in a checkpoint
        assert len(states) == 1 and torch.equal(states[0], fake.hpu.get_rng_state())


def test_random_follows_the_bridges_one_device_rules():
    with fake_gaudi(8) as fake:
        state = fake.hpu.get_rng_state()
        fake.hpu.manual_seed(7)
        fake.hpu.set_rng_state(state, "hpu")
        with pytest.raises(RuntimeError, match="supports only device 0"):
            fake.hpu.get_rng_state("hpu:1")
        with pytest.raises(RuntimeError, match="only states len of 1"):
            fake.hpu.set_rng_state_all([state, state])
        assert isinstance(fake.hpu.manual_seed(3), torch.Generator)


def test_default_stream_is_one_stream():
    with fake_gaudi(8) as fake:
        assert fake.hpu.default_stream() is fake.hpu.default_stream()
        assert isinstance(fake.hpu.default_stream(), fake.hpu.Stream) and fake.hpu.default_stream().is_default_stream


class Affine(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)

    def forward(self, x, scale=1.0):
        return torch.tanh(self.linear(x)) * scale


@torch.no_grad()
def test_wrap_in_hpu_graph_captures_once_per_shape_and_replays_new_inputs():
    torch.manual_seed(0)
    eager = Affine()
    with fake_gaudi(8, lazy_mode="1") as fake:
        module = fake.hpu.wrap_in_hpu_graph(Affine())
        module.load_state_dict(eager.state_dict())
        first = torch.randn(2, 4)
        out = module(first.clone())
        assert fake.graph_events.count("capture_begin") == 1 and torch.allclose(out, eager(first))
        second = torch.randn(2, 4)
        replayed = module(second)  # same shape: the captured graph, replayed on the copied-in input
        assert fake.graph_events.count("capture_begin") == 1 and fake.graph_events.count("replay") == 1
        assert replayed is out and torch.allclose(replayed, eager(second))
        module(torch.randn(5, 4))  # a new shape: a second graph
        assert len(module.hpu_graph_cache) == 2
        bypassed = module(torch.randn(2, 4), bypass_hpu_graphs=True)
        assert bypassed is not out and fake.graph_events.count("replay") == 1
        module.clear_cache()
        assert module.hpu_graph_cache == {}


@torch.no_grad()
def test_wrap_in_hpu_graph_with_a_full_cache_calls_through():
    with fake_gaudi(8, lazy_mode="1") as fake:
        module = fake.hpu.wrap_in_hpu_graph(Affine(), max_graphs=1)
        module(torch.randn(2, 4))
        module(torch.randn(3, 4))
        assert len(module.hpu_graph_cache) == 1 and fake.graph_events.count("capture_begin") == 1


@torch.no_grad()
def test_make_graphed_callables_captures_and_checks_its_arguments():
    with fake_gaudi(8, lazy_mode="1") as fake:
        function = Affine()
        graphed = fake.hpu.make_graphed_callables(function, (torch.randn(2, 4),), warmups=2)
        x = torch.randn(2, 4)
        assert torch.allclose(graphed(x.clone()), function(x))
        y = torch.randn(2, 4)
        assert torch.allclose(graphed(y), function(y)) and fake.graph_events.count("replay") == 1
        with pytest.raises(AssertionError, match="must be a tuple of Tensors"):
            fake.hpu.make_graphed_callables(function, (1.0,))


def test_module_cacher_caches_only_in_lazy_training_with_grad():
    with fake_gaudi(8, lazy_mode="1") as fake:
        cacher = fake.hpu.ModuleCacher(max_graphs=2)
        model = cacher(Affine())
        model.train()
        x = torch.randn(2, 4)
        model(x)
        model(x)
        assert sum(cacher.cached_hits_dict.values()) == 1 and fake.graph_events.count("capture_begin") == 1
        model.eval()
        model(x)
        assert cacher.uncached_eval_hits == 1


def test_hpu_graphs_do_not_capture_in_eager_mode():
    """The bridge exports the graph API from `hpu` only `if is_lazy()`, and `HPUGraph::capture_begin` records into
    the lazy context; the fake's `hpu.graphs.wrap_in_hpu_graph` therefore fails to capture in eager mode."""
    with fake_gaudi(8, lazy_mode="0") as fake:
        assert not hasattr(fake.hpu, "wrap_in_hpu_graph") and not hasattr(fake.hpu, "ModuleCacher")
        module = fake.hpu.graphs.wrap_in_hpu_graph(Affine())
        with pytest.raises(RuntimeError, match="lazy execution context"):
            module(torch.randn(2, 4))

"""route_backend: the Gaudi routing rule (G13), its once-per-backend warning, and the README table."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import hwcompile
import hwenv
import pytest
from hwcompile.testing import routing_warnings

GAUDI = hwenv.Accelerator("hpu", 8)
README = Path(__file__).resolve().parents[1] / "README.md"


def _my_backend(gm, example_inputs):
    return gm.forward


@pytest.mark.facts("G13")
@pytest.mark.parametrize("requested", [None, "inductor", "aot_eager", "cudagraphs", "indcutor", _my_backend])
def test_gaudi_reroutes_every_other_backend_to_hpu_backend_with_one_warning(requested, caplog):
    caplog.set_level(logging.WARNING)
    first = hwcompile.route_backend(GAUDI, requested)
    second = hwcompile.route_backend(GAUDI, requested)
    assert first.backend == second.backend == "hpu_backend"
    assert first.requested is requested and first.rerouted
    assert (first.warned, second.warned) == (True, False)
    [record] = routing_warnings(caplog.records)
    assert "hpu_backend" in record.getMessage() and "G13" in first.reason


@pytest.mark.facts("G13")
@pytest.mark.parametrize("requested", ["hpu_backend", "eager"])
def test_gaudi_keeps_hpu_backend_and_eager_silently(requested, caplog):
    caplog.set_level(logging.WARNING)
    decision = hwcompile.route_backend(GAUDI, requested)
    assert (decision.backend, decision.warned, decision.rerouted) == (requested, False, False)
    assert routing_warnings(caplog.records) == []


@pytest.mark.facts("G13")
def test_one_warning_per_distinct_original_backend(caplog):
    caplog.set_level(logging.WARNING)
    for backend in ["inductor", None, "aot_eager", "inductor", "aot_eager", _my_backend, _my_backend]:
        hwcompile.route_backend(GAUDI, backend)
    messages = [r.getMessage() for r in routing_warnings(caplog.records)]
    # None is the default backend, inductor: the same original backend, one warning.
    assert len(messages) == 3
    assert any("'inductor'" in m for m in messages) and any("'aot_eager'" in m for m in messages)
    assert any("_my_backend" in m for m in messages)


def test_warning_once_holds_across_threads(caplog):
    caplog.set_level(logging.WARNING)
    barrier = threading.Barrier(8)

    def decide():
        barrier.wait()
        hwcompile.route_backend(GAUDI, "inductor")

    threads = [threading.Thread(target=decide) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(routing_warnings(caplog.records)) == 1


@pytest.mark.parametrize("kind", ["cuda", "rocm", "xpu", "cpu", "mps"])
@pytest.mark.parametrize("requested", [None, "inductor", "aot_eager", "eager", _my_backend])
def test_elsewhere_the_requested_backend_stays(kind, requested, caplog):
    caplog.set_level(logging.WARNING)
    decision = hwcompile.route_backend(hwenv.Accelerator(kind), requested)
    assert decision.backend == ("inductor" if requested is None else requested)
    assert not decision.warned and not decision.rerouted and decision.kind == kind
    assert routing_warnings(caplog.records) == []


def test_accelerator_may_be_a_kind_string_or_detected(clean_device_env):
    assert hwcompile.route_backend("hpu", "inductor").backend == "hpu_backend"
    detected = hwcompile.route_backend(None, "aot_eager")  # this machine has no Gaudi
    assert detected.kind == hwenv.detect().kind != "hpu" and detected.backend == "aot_eager"


@pytest.mark.parametrize("bad", [3, "", "  ", object()])
def test_bad_backend_is_rejected_before_anything(bad):
    with pytest.raises(hwcompile.CompileArgumentError) as error:
        hwcompile.route_backend(GAUDI, bad)
    assert isinstance(error.value, ValueError) and "backend=" in str(error.value)


def test_bad_accelerator_is_rejected():
    with pytest.raises(hwcompile.CompileArgumentError, match="not an accelerator"):
        hwcompile.route_backend(42, "inductor")
    with pytest.raises(hwenv.HwenvError):
        hwcompile.route_backend("tpu", "inductor")


def test_decision_is_frozen():
    decision = hwcompile.route_backend(GAUDI, "hpu_backend")
    with pytest.raises(AttributeError):
        decision.backend = "inductor"


def test_routing_table_logs_nothing_and_is_in_the_readme(caplog):
    caplog.set_level(logging.WARNING)
    table = hwcompile.routing_table_markdown()
    assert routing_warnings(caplog.records) == []
    assert "| hpu | `'inductor'` | `'hpu_backend'` | yes, once per backend |" in table
    assert "| cuda | None (default) | `'inductor'` | no |" in table
    assert table in README.read_text(), "README's routing table is stale: paste hwcompile.routing_table_markdown()"

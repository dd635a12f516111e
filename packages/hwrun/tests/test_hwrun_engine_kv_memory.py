"""KV memory sized from the device (issue 35 point 2a): `kv_cache_memory` / `hwrun serve --kv-cache-memory` takes
bytes or a fraction of the free memory after load, bad values are refused naming them, the default is decided per
device with its reason (a fraction of free memory on an accelerator, a fixed size on a CPU, capped at what every slot
at max length holds), and what the pool holds is reported (start-up line, /metrics gauges). The 1.24B Llama figures
of hwrun's README are computed here."""

from __future__ import annotations

import argparse

import pytest
from hwrun.errors import FastDecodeError, ServeConfigError
from hwrun.inference.engine import kv_memory
from hwrun.inference.engine.block_manager import kv_bytes_per_token, requests_that_fit
from hwrun.inference.engine.kv_memory import KVReport, blocks_in, kv_budget, parse_kv_memory
from hwrun.serve.config import parse_kv_cache_memory
from hwrun.serve.metrics import Metrics

GIB = 2**30


def test_sizes_and_fractions_parse():
    assert parse_kv_memory(None) is None
    assert parse_kv_memory("4GiB") == 4 * GIB and parse_kv_memory("512 MiB") == 512 * 2**20
    assert parse_kv_memory("1.5GB") == 1_500_000_000 and parse_kv_memory("8000000000") == 8_000_000_000
    assert parse_kv_memory("2g") == 2 * GIB and parse_kv_memory("0.5GiB") == GIB // 2
    assert parse_kv_memory("0.8") == 0.8 and parse_kv_memory("1.0") == 1.0 and parse_kv_memory(0.25) == 0.25
    assert parse_kv_memory(123456) == 123456


@pytest.mark.parametrize("bad", ["0", "0.0", "1.5", "-3", "abc", "4XB", "", "1.3B", True, 0, -1, 1.2, [4]])
def test_bad_values_are_refused_naming_them(bad):
    with pytest.raises(FastDecodeError, match="kv_cache_memory") as caught:
        parse_kv_memory(bad)
    assert repr(bad) in str(caught.value) and "bytes" in str(caught.value)


def test_the_serve_option_names_itself_and_the_value():
    assert parse_kv_cache_memory("4GiB") == 4 * GIB and parse_kv_cache_memory(None) is None
    with pytest.raises(ServeConfigError, match=r"--kv-cache-memory '1\.7': .*at most 1"):
        parse_kv_cache_memory("1.7")
    from hwrun.cli.serve import add_parser, config_from

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    args = parser.parse_args(["serve", "--kv-cache-memory", "0.6"])
    args.argv = []
    assert config_from(args, environ={}).kv_cache_memory == 0.6
    with pytest.raises(ServeConfigError, match="--kv-cache-memory '12 parsecs'"):
        config_from(parser.parse_args(["serve", "--kv-cache-memory", "12 parsecs"]), environ={})


class _Device:
    type = "cpu"

    def __str__(self):
        return "cpu"


def test_the_default_is_decided_per_device_and_capped_at_what_the_slots_can_use(monkeypatch):
    cpu = _Device()
    budget, why = kv_budget(None, cpu, False, 100 * GIB)
    assert budget == 2 * GIB and "fixed 2 GiB" in why and "host memory is shared" in why
    budget, why = kv_budget(None, cpu, False, 64 * 2**20)
    assert budget == 64 * 2**20 and "capped at 64 MiB: every slot at max_cache_len" in why
    monkeypatch.setattr(kv_memory, "free_memory", lambda device: 70 * GIB)
    budget, why = kv_budget(None, cpu, True, 100 * GIB)
    assert budget == int(70 * GIB * 0.8) and "0.8 of the 70.0 GiB free after load" in why
    budget, why = kv_budget(0.5, cpu, True, 1)  # a given fraction is not capped
    assert budget == 35 * GIB and "kv_cache_memory=0.5" in why
    assert kv_budget(3 * GIB, cpu, True, 1) == (3 * GIB, f"kv_cache_memory={3 * GIB} bytes given")
    monkeypatch.setattr(kv_memory, "free_memory", lambda device: None)
    assert "cannot be read" in kv_budget(None, cpu, True, 100 * GIB)[1]
    with pytest.raises(FastDecodeError, match="fraction of the free device memory, which cannot be read"):
        kv_budget(0.5, cpu, False, 1)
    with pytest.raises(FastDecodeError, match="hold no block of 16 positions"):
        blocks_in(1000, 64, 16, "given")


def test_the_report_says_what_the_pool_holds_and_metrics_show_it():
    per_token = kv_bytes_per_token(16, 8, 64, 2)  # the 1.24B Llama: 16 layers, 8 KV heads, head dim 64, bf16
    report = KVReport(blocks_in(8 * GIB, per_token, 16, "given"), 16, per_token, 4096, "given")
    assert per_token == 32768 and report.tokens == 262144 and report.max_length_requests == 64
    assert report.line().startswith("KV cache: 16384 blocks of 16 tokens = 262144 tokens, 8.00 GiB (32768 bytes")
    metrics = Metrics()
    assert "hwrun_kv_cache" not in metrics.render()
    metrics.kv = report.as_dict()
    text = metrics.render()
    assert "hwrun_kv_cache_blocks 16384" in text and "hwrun_kv_cache_bytes_per_token 32768" in text
    assert "# TYPE hwrun_kv_cache_tokens gauge" in text and "hwrun_kv_cache_max_length_requests 64" in text


def test_the_readmes_figures_for_2000_token_requests_in_8_gib():
    per_token = kv_bytes_per_token(16, 8, 64, 2)
    # before: a slot of the server's default max length (4096) per request, whatever it uses
    assert requests_that_fit(8 * GIB, per_token, 2000, reserved_per_request=4096) == 64
    assert 4096 * per_token == 128 * 2**20
    # after: 125 blocks of 16 = 2,000 positions, 62.5 MiB a request
    assert requests_that_fit(8 * GIB, per_token, 2000) == 131
    assert 2000 * per_token == 65_536_000


#: One rank of two (gloo, a file store): its pool would hold 100 + 50 x rank blocks; prints what it agreed on.
_RANK = """
import sys
import torch.distributed as dist
from hwrun.inference.engine.kv_memory import agree_across_ranks

class TensorParallelModel:  # what agree_across_ranks reads of a model
    tp_size = 2
    device = "cpu"

rank = int(sys.argv[2])
dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=rank, world_size=2)
blocks, why = agree_across_ranks(100 + 50 * rank, "budget", TensorParallelModel())
dist.destroy_process_group()
print(f"{blocks}|{why}")
"""


def test_tensor_parallel_ranks_take_the_fewest_blocks_any_of_them_holds(tmp_path):
    """Two gloo ranks whose free memory differs would size different pools, preempt differently and stop pairing
    their collectives; both take the smaller pool, and say so. Outside tensor parallelism nothing is exchanged."""
    import subprocess
    import sys

    from hwrun.inference.engine.kv_memory import agree_across_ranks

    ranks = [subprocess.Popen([sys.executable, "-c", _RANK, str(tmp_path / "store"), str(rank)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in (0, 1)]
    answers = []
    for rank in ranks:
        out, err = rank.communicate(timeout=120)
        assert rank.returncode == 0, err[-2000:]
        answers.append(out.strip().splitlines()[-1].split("|"))
    assert [int(blocks) for blocks, _ in answers] == [100, 100]
    assert "the same on all 2 tensor-parallel ranks" in answers[0][1]
    assert "agreed on the fewest blocks any of them holds (100, this rank's 150)" in answers[1][1]

    class Alone:
        tp_size = None
        device = "cpu"

    assert agree_across_ranks(150, "budget", Alone()) == (150, "budget")

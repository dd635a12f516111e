"""`hwdist bench`: sizes, nccl-tests formulas, the single-process sweep and the CLI."""

from __future__ import annotations

import io
import json

import hwdist
import pytest
import torch.distributed as dist
from hwdist.bench import BenchResult, BenchRow, bus_factor, format_table, run_bench, summary
from hwdist.cli import main
from hwdist.progress import Progress
from hwdist.sizes import format_size, parse_size, parse_sizes


@pytest.fixture(autouse=True)
def single_process(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HWENV_DEVICE", "cpu")
    yield
    hwdist.shutdown()
    assert not dist.is_initialized()


def test_sizes():
    assert parse_size("8B") == 8 and parse_size("1K") == 1024 and parse_size("1KiB") == 1024
    assert parse_size("16M") == 16 * 2**20 and parse_size("1G") == 2**30 and parse_size("64") == 64
    assert parse_sizes("8B..64B") == [8, 16, 32, 64]
    assert parse_sizes("8B..1G")[-1] == 2**30 and len(parse_sizes("8B..1G")) == 28
    assert parse_sizes("1K..1M", factor=4) == [1024, 4096, 16384, 65536, 262144, 1048576]
    assert parse_sizes("1K,4M") == [1024, 4 * 2**20]
    assert format_size(8) == "8 B" and format_size(1536) == "1.5 KiB" and format_size(2**30) == "1 GiB"
    for bad in ("8X", "", "1G..8B", "0B"):
        with pytest.raises(hwdist.BenchError):
            parse_sizes(bad)


def test_nccl_tests_bus_factors():
    assert bus_factor("all_reduce", 8) == pytest.approx(2 * 7 / 8)
    assert bus_factor("all_gather", 8) == pytest.approx(7 / 8)
    assert bus_factor("reduce_scatter", 4) == pytest.approx(3 / 4)
    assert bus_factor("broadcast", 8) == 1.0
    assert bus_factor("all_reduce", 1) == 0.0
    with pytest.raises(hwdist.BenchError, match="alltoall"):
        bus_factor("alltoall", 2)


def test_single_process_sweep_checks_and_times_every_op():
    hwdist.init()
    result = run_bench(["all_reduce", "all_gather", "reduce_scatter", "broadcast"], [8, 1024], "fp32",
                       iters=2, warmup=1, repeats=1, progress=False)
    assert (result.world_size, result.backend, result.device) == (1, "gloo", "cpu")
    assert len(result.rows) == 8 and all(r.correct for r in result.rows)
    for row in result.rows:
        assert row.time_us > 0 and row.raw_time_us > 0
        assert row.algbw == pytest.approx(row.size / (row.time_us * 1e-6) / 1e9)
        assert row.busbw == pytest.approx(row.algbw * bus_factor(row.op, 1))
        assert row.overhead == pytest.approx(row.time_us / row.raw_time_us)
    assert [r.count for r in result.rows if r.op == "all_reduce"] == [2, 256]
    table = format_table(result)
    assert "busbw (GB/s)" in table.splitlines()[0] and "1 KiB" in table
    markdown = format_table(result, markdown=True)
    assert markdown.startswith("| op | size |") and markdown.count("\n") == 9
    assert "median overhead" in summary(result) and "all results correct" in summary(result)


def test_bad_bench_arguments():
    hwdist.init()
    with pytest.raises(hwdist.BenchError, match="--dtype 'fp8'"):
        run_bench(["all_reduce"], [8], "fp8")
    with pytest.raises(hwdist.BenchError, match="need iters >= 1"):
        run_bench(["all_reduce"], [8], iters=0)


def test_summary_names_wrong_results():
    row = BenchRow("all_reduce", 8, 2, "fp32", 2.0, 1.0, 0.0, 1.0, 0.0, 2.0, 1.5, 1.5, False)
    text = summary(BenchResult(2, "gloo", "cpu", "fp32", 1, 0, 1, (row,)))
    assert "WRONG results: all_reduce 8 B" in text and "2.00x" in text


def test_progress_line():
    stream = io.StringIO()
    bar = Progress(2, enabled=True, stream=stream)
    bar.step("all_reduce 8 B")
    bar.step("all_reduce 16 B")
    bar.close()
    text = stream.getvalue()
    assert "\r[hwdist bench] [##########..........] 1/2 all_reduce 8 B" in text
    assert "2/2" in text and text.endswith("\n")
    quiet = io.StringIO()
    Progress(2, enabled=False, stream=quiet).step("x")
    assert quiet.getvalue() == ""


def test_cli_bench_json(capsys):
    code = main(["bench", "--op", "all", "--sizes", "8B..32B", "--dtype", "fp32", "--iters", "2",
                 "--warmup", "1", "--repeats", "1", "--json", "--no-progress"])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert data["world_size"] == 1 and data["backend"] == "gloo"
    assert [r["op"] for r in data["rows"]].count("broadcast") == 3 and all(r["correct"] for r in data["rows"])


def test_cli_bench_table_and_bad_size(capsys):
    assert main(["bench", "--sizes", "64B", "--iters", "1", "--warmup", "0", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "all_reduce" in out and "bf16" in out and "overhead" in out
    assert main(["bench", "--sizes", "lots"]) == 2
    assert "hwdist bench: error: size 'lots'" in capsys.readouterr().err

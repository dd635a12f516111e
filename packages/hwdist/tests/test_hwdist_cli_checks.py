"""hwdist's CLI validation (issue 27): options, script, memory and the inherited selection, before anything starts."""

from __future__ import annotations

import pytest
from hwdist.bench import check_memory, host_available_memory, peak_bytes
from hwdist.cli import build_parser, main
from hwdist.cli_checks import check_launch, nnodes, port
from hwdist.env import read_launch_env
from hwdist.errors import BenchError, DistEnvError, LaunchError


def _launch_args(*argv):
    return build_parser().parse_args(["launch", "--kind", "cpu", *argv])


@pytest.mark.parametrize("value", ["0", "70000", "abc", "-1", "", "2²"])
def test_bad_ports(value):
    with pytest.raises(LaunchError, match="not a TCP port"):
        port(value, "--master-port")


def test_good_port_and_nnodes():
    assert port(" 29500 ", "--master-port") == 29500
    assert nnodes("2") == (2, 2) and nnodes("1:4") == (1, 4)
    with pytest.raises(LaunchError, match="runs backwards"):
        nnodes("4:2")


@pytest.mark.parametrize(("argv", "named"), [
    (("--standalone", "--rdzv-id", "7"), "--rdzv-id"),
    (("--rdzv-backend", "c10d", "--master-addr", "h"), "--master-addr"),
    (("--nnodes", "2", "--node-rank", "2"), "--node-rank 2"),
    (("--max-restarts", "-1"), "--max-restarts"),
    (("--monitor-interval", "inf"), "--monitor-interval"),
    (("--rdzv-endpoint", "h:0"), "h:0"),
    (("--nproc-per-node", "0"), "--nproc-per-node"),
    (("--rdzv-conf", "join_timeout=6,oops"), "'oops'"),
    (("--log-dir", "train.py"), "is a file"),
])
def test_launch_options_refused_before_anything(tmp_path, monkeypatch, argv, named):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")
    with pytest.raises(LaunchError) as error:
        check_launch(_launch_args(*argv, "train.py"))
    assert named in str(error.value)


def test_valid_launch_options_pass(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")
    check_launch(_launch_args("--nnodes", "2", "--node-rank", "1", "--master-addr", "h", "--master-port", "29500",
                              "train.py"))
    check_launch(_launch_args("--rdzv-backend", "c10d", "--rdzv-endpoint", "[::1]:29400", "train.py"))
    check_launch(_launch_args("--dry-run", "elsewhere.py"))  # a dry run may be for another machine
    check_launch(_launch_args("--standalone", "-m", "json"))  # standalone: no fixed port to find free (issue 42)


def test_missing_script_and_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pkg").mkdir()
    with pytest.raises(LaunchError, match="does not exist"):
        check_launch(_launch_args("missing.py"))
    with pytest.raises(LaunchError, match="without __main__.py"):
        check_launch(_launch_args("pkg"))


def test_by_refused_off_gaudi_and_without_devices(clean_device_env, capsys):
    assert main(["launch", "--kind", "cuda", "--by", "index", "--devices", "0", "--dry-run", "t.py"]) == 2
    assert "--by index applies to Gaudi" in capsys.readouterr().err
    assert main(["launch", "--kind", "hpu", "--by", "index", "--dry-run", "t.py"]) == 2
    assert "no --devices" in capsys.readouterr().err


def test_bench_options_refused_before_init(monkeypatch, capsys):
    monkeypatch.setattr("hwdist.context.init", lambda **kw: pytest.fail("init was reached"))
    for argv, named in ((["--iters", "0"], "--iters 0"), (["--timeout", "nan"], "nan"),
                        (["--sizes", "1K,1M", "--step-factor", "4"], "'1K,1M'"), (["--step-factor", "1"], "--step-factor")):
        assert main(["bench", *argv]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and named in err, err


def test_memory_check():
    assert peak_bytes("all_reduce", 1024, "bf16") == 2048
    assert peak_bytes("reduce_scatter", 1024, "bf16") == 1024 * 3 + 512 * 8
    check_memory(["all_reduce"], [2**20], "fp32", None, "host memory")  # unknown: nothing to check
    check_memory(["all_reduce"], [2**20], "fp32", 2**22, "host memory")
    with pytest.raises(BenchError, match=r"'1T' reaches 1024 GiB.*xpu:0 has 1 GiB available.*e\.g\. 8B\.\.512MiB"):
        check_memory(["all_reduce"], [2**40], "bf16", 2**30, "xpu:0", label="1T")
    with pytest.raises(BenchError, match="x 4 ranks"):
        check_memory(["all_reduce"], [2**28], "bf16", 2**30, "host memory", ranks_sharing=4)


def test_host_memory_reader(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 100 kB\nMemAvailable:     2048 kB\n")
    assert host_available_memory(str(meminfo)) == 2048 * 1024
    assert host_available_memory(str(tmp_path / "none")) is None


def test_allocation_failure_becomes_a_bench_error(monkeypatch):
    import hwdist.bench as bench
    from hwdist import init, shutdown

    def fail(*args, **kwargs):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1099511627776 bytes")

    init(backend="gloo")
    try:
        monkeypatch.setattr(bench, "bench_op", fail)
        with pytest.raises(BenchError, match="all_reduce at size 8 B"):
            bench.run_bench(["all_reduce"], [8], "fp32", iters=1, warmup=0, repeats=1)
        monkeypatch.setattr(bench, "bench_op", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("other")))
        with pytest.raises(RuntimeError, match="other"):  # not an allocation failure: not disguised
            bench.run_bench(["all_reduce"], [8], "fp32", iters=1, warmup=0, repeats=1)
    finally:
        shutdown()


@pytest.mark.parametrize("value", ["²", "--5", "1_0", "٣"])
def test_launch_env_takes_ascii_integers_only(value):
    with pytest.raises(DistEnvError, match="is not an integer"):
        read_launch_env({"RANK": value, "WORLD_SIZE": "1"})


def test_init_refuses_an_invalid_inherited_mask(clean_device_env, monkeypatch):
    import hwenv
    from hwdist import init

    monkeypatch.setenv("ZE_AFFINITY_MASK", "0.1")  # FLAT (unset): sub-devices are skipped by the driver
    monkeypatch.setattr("torch.distributed.init_process_group", lambda **kw: pytest.fail("group started"))
    with pytest.raises(DistEnvError, match="inherited is not valid.*0.1"):
        init(accel=hwenv.Accelerator("xpu", 2))


def test_init_leaves_uuid_selections_to_the_runtime(fake_cuda, monkeypatch):
    import hwenv
    from hwdist.context import _check_selection

    fake_cuda(count=1)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-8f6b")
    _check_selection(hwenv.detect())  # no error
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,x")
    with pytest.raises(DistEnvError, match="'0,x'"):
        _check_selection(hwenv.detect())

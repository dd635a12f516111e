"""`hwrun train --fsdp` / `--deepspeed` flags: what they pass to Trainer per device, and the refusals, before anything
loads (the runs themselves: test_hwrun_train_fsdp_cli.py, test_hwrun_train_deepspeed.py)."""

from __future__ import annotations

import hwenv
import hwrun
import pytest
from hwrun.cli.main import main
from hwrun.training.sharding import DEEPSPEED_CONFIGS, deepspeed_overrides, fsdp_overrides


def _plan(kind):
    return hwrun.plan(hwrun.DEFAULT_MODEL, device=hwenv.Accelerator(kind, 2) if kind != "cpu" else "cpu")


def test_fsdp_flag_is_fsdp2_with_sharded_checkpoints_and_rank0_loading():
    keywords, why = fsdp_overrides(_plan("cpu"))
    assert keywords["fsdp"] == "full_shard"
    config = keywords["fsdp_config"]
    assert config["version"] == 2 and config["cpu_ram_efficient_loading"] is True
    assert config["state_dict_type"] == "SHARDED_STATE_DICT"
    assert "another world size" in why


def test_fsdp_on_gaudi_lazy_mode_is_refused(monkeypatch):
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "1")
    with pytest.raises(hwrun.errors.TrainingConfigError, match=r"PT_HPU_LAZY_MODE=1.*eager"):
        fsdp_overrides(_plan("hpu"))
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "0")
    assert fsdp_overrides(_plan("hpu"))[0]["fsdp"] == "full_shard"


@pytest.mark.parametrize("kind", ["cpu", "cuda", "xpu", "hpu"])
def test_deepspeed_stages_where_deepspeed_runs(kind):
    zero3, _ = deepspeed_overrides(_plan(kind), "zero3")
    assert zero3["deepspeed"]["zero_optimization"] == {"stage": 3, "stage3_gather_16bit_weights_on_model_save": True}
    zero2, why = deepspeed_overrides(_plan(kind), "zero2")
    assert zero2["deepspeed"]["zero_optimization"] == {"stage": 2}
    assert ("HabanaAI" in why) == (kind == "hpu")
    zero2["deepspeed"]["zero_optimization"]["stage"] = 9
    assert DEEPSPEED_CONFIGS["zero2"]["zero_optimization"]["stage"] == 2  # each run gets its own copy


def test_deepspeed_refusals(tmp_path):
    with pytest.raises(hwrun.errors.TrainingConfigError, match=r"--deepspeed zero2 on mps .*no ZeRO"):
        deepspeed_overrides(_plan("mps"), "zero2")
    with pytest.raises(hwrun.errors.TrainingConfigError, match=r"'zero4' is neither zero2, zero3 nor"):
        deepspeed_overrides(_plan("cpu"), "zero4")
    config = tmp_path / "ds.json"
    config.write_text('{"zero_optimization": {"stage": 1}}', encoding="utf-8")
    assert deepspeed_overrides(_plan("cpu"), str(config))[0] == {"deepspeed": str(config)}


def test_cli_fsdp_on_a_cpu_plan_is_one_line_before_the_model_loads(tmp_path, capsys, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the option was rejected")

    monkeypatch.setattr("hwrun.training.run._load_model", refuse)
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(name, "x")  # recorded, so the values the CLI sets for its group of one are undone
        monkeypatch.delenv(name)
    data = tmp_path / "d.txt"
    data.write_text("The king said to the queen that the castle was cold. " * 30, encoding="utf-8")
    code = main(["train", "--data", str(data), "--fsdp", "--device", "cpu", "--max-steps", "2", "--block-size", "32",
                 "--output", str(tmp_path / "out")])
    captured = capsys.readouterr()
    assert code == 2
    assert "process group of 1" in captured.out
    assert captured.err.startswith("hwrun: error: fsdp='full_shard' cannot shard on cpu") and "hwdist launch" in captured.err
    assert not (tmp_path / "out").exists()


def test_cli_fsdp_and_deepspeed_are_exclusive(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["train", "--data", "x", "--fsdp", "--deepspeed", "zero2"])
    assert exited.value.code == 2 and "not allowed with argument" in capsys.readouterr().err

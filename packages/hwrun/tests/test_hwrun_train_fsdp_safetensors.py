"""`hwrun.training.sharded_checkpoints`: an FSDP checkpoint's DCP model shards (`pytorch_model_fsdp_0/*.distcp`, as
Accelerate's save_fsdp_model writes them: {"model": state_dict}) become one safetensors file under the state_dict
names, after the manifest's checksums verify. Here the shards are written in one process (DCP without a process
group) from a tiny model built from a config; the world-size-2 checkpoints of the real CLI are converted in
test_hwrun_train_fsdp_cli.py. Then `hwrun.training.full_checkpoints` (`--fsdp-checkpoint full`): the resume's read of
save_pretrained's safetensors and its refusals, in one process, and the two names it replaces in
`transformers.trainer` only while a FULL_STATE_DICT run trains."""

from __future__ import annotations

import pytest
from hwrun.errors import CheckpointError
from hwrun.training.checkpoints import write_manifest
from hwrun.training.sharded_checkpoints import (
    FSDP_MODEL_FOLDER,
    fsdp_checkpoint_to_safetensors,
    read_fsdp_state,
)


def _tiny_model():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, vocab_size=96,
                                        tie_word_embeddings=False))


def _checkpoint(folder, state, kind):
    """A checkpoint folder as `hwrun train --fsdp` publishes it: the DCP model shards, and hwrun's manifest."""
    import torch.distributed.checkpoint as dcp

    dcp.save({"model": state}, storage_writer=dcp.FileSystemWriter(folder / FSDP_MODEL_FOLDER), no_dist=True)
    (folder / "trainer_state.json").write_text("{}", encoding="utf-8")
    write_manifest(folder, 3, {"kind": kind, "model": "tiny"})
    return folder


def _read(path):
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        return {name: handle.get_tensor(name) for name in handle.keys()}


def test_a_full_checkpoint_becomes_model_safetensors_under_the_state_dict_names(tmp_path):
    import torch

    state = {name: tensor.detach().clone() for name, tensor in _tiny_model().state_dict().items()}
    checkpoint = _checkpoint(tmp_path / "checkpoint-3", state, "full")
    written = fsdp_checkpoint_to_safetensors(checkpoint, tmp_path / "out")
    assert written == tmp_path / "out" / "model.safetensors"
    saved = _read(written)
    assert sorted(saved) == sorted(state)  # e.g. model.layers.0.self_attn.q_proj.weight, lm_head.weight
    assert all(torch.equal(saved[name], state[name]) for name in state)
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["model.safetensors"]  # no partial file left


def test_a_lora_checkpoint_becomes_an_adapter_under_peft_names(tmp_path):
    import torch
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict

    model = get_peft_model(_tiny_model(), LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    state = {name: tensor.detach().clone() for name, tensor in get_peft_model_state_dict(model).items()}
    checkpoint = _checkpoint(tmp_path / "checkpoint-3", state, "lora")
    saved = _read(fsdp_checkpoint_to_safetensors(checkpoint, tmp_path / "out"))
    assert sorted(saved) == sorted(state) and all(torch.equal(saved[name], state[name]) for name in state)
    assert any(name.startswith("base_model.model.model.layers.0.self_attn.q_proj.lora_A") for name in saved)
    assert read_fsdp_state(checkpoint).keys() == state.keys()


def test_a_corrupted_shard_is_refused_naming_it_and_nothing_is_written(tmp_path):
    from hwrun.training import choose_resume

    state = {name: tensor.detach().clone() for name, tensor in _tiny_model().state_dict().items()}
    checkpoint = _checkpoint(tmp_path / "run" / "checkpoint-3", state, "full")
    shard = next((checkpoint / FSDP_MODEL_FOLDER).glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, one other byte
    shard.write_bytes(bytes(data))
    with pytest.raises(CheckpointError) as caught:
        fsdp_checkpoint_to_safetensors(checkpoint, tmp_path / "out")
    message = str(caught.value)
    assert f"{FSDP_MODEL_FOLDER}/{shard.name} does not match its sha256" in message and "Nothing was written" in message
    assert not (tmp_path / "out").exists()
    # a resume refuses it the same way, before anything loads
    with pytest.raises(CheckpointError, match=rf"{FSDP_MODEL_FOLDER}/{shard.name} does not match its sha256"):
        choose_resume(str(checkpoint), tmp_path / "run")
    with pytest.raises(CheckpointError, match=r"No checkpoint .* verifies"):
        choose_resume("auto", tmp_path / "run")


def test_refusals_a_checkpoint_without_fsdp_shards_and_an_existing_target(tmp_path):
    plain = tmp_path / "checkpoint-1"
    plain.mkdir()
    (plain / "model.safetensors").write_bytes(b"x")
    write_manifest(plain, 1, {"kind": "full"})
    with pytest.raises(CheckpointError, match=r"holds no FSDP model shards"):
        fsdp_checkpoint_to_safetensors(plain, tmp_path / "out")

    state = {name: tensor.detach().clone() for name, tensor in _tiny_model().state_dict().items()}
    checkpoint = _checkpoint(tmp_path / "checkpoint-3", state, "full")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "model.safetensors").write_bytes(b"user's")
    with pytest.raises(CheckpointError, match=r"exists; it was left as it is"):
        fsdp_checkpoint_to_safetensors(checkpoint, tmp_path / "mine")
    assert (tmp_path / "mine" / "model.safetensors").read_bytes() == b"user's"


# `--fsdp-checkpoint full` (hwrun.training.full_checkpoints): the resume's reading of save_pretrained's safetensors, in
# one process without FSDP (the same function torch's set_model_state_dict ends in; the world-size-2 runs are in
# test_hwrun_train_fsdp.py and test_hwrun_train_fsdp_cli.py).
def _one_process():
    import types

    return types.SimpleNamespace(num_processes=1, is_main_process=True, wait_for_everyone=lambda: None)


def _lora(r=4, trained=False):
    from peft import LoraConfig, get_peft_model

    return get_peft_model(_tiny_model(), LoraConfig(r=r, target_modules=["q_proj", "v_proj"],
                                                    init_lora_weights=not trained))


def test_a_full_checkpoint_resumes_from_save_pretrained_safetensors(tmp_path):
    import torch
    from hwrun.training.full_checkpoints import load_full_checkpoint

    trained = _lora(trained=True)  # lora_B nonzero: a fresh adapter differs from it
    trained.save_pretrained(tmp_path / "adapter")
    resumed = _lora()
    load_full_checkpoint(_one_process(), resumed, tmp_path / "adapter", adapter_only=True)
    wanted = dict(trained.named_parameters())
    assert any("lora_B" in name for name, p in resumed.named_parameters() if p.requires_grad)
    assert all(torch.equal(p, wanted[name]) for name, p in resumed.named_parameters())

    model = _tiny_model()
    model.save_pretrained(tmp_path / "model")
    torch.manual_seed(1)
    other = type(model)(model.config)  # other weights, loaded over by the checkpoint's
    assert not torch.equal(other.lm_head.weight, model.lm_head.weight)
    load_full_checkpoint(_one_process(), other, tmp_path / "model")
    assert all(torch.equal(value, model.state_dict()[name]) for name, value in other.state_dict().items())


def test_a_full_checkpoint_that_does_not_fit_is_refused_naming_it(tmp_path):
    from hwrun.training.full_checkpoints import load_full_checkpoint

    _lora(r=8, trained=True).save_pretrained(tmp_path / "r8")
    with pytest.raises(CheckpointError, match=r"adapter_model.safetensors does not fit this run's adapter \(other "
                                              r"shapes base_model.model.model.layers.0.self_attn.q_proj.lora_A"):
        load_full_checkpoint(_one_process(), _lora(r=4), tmp_path / "r8", adapter_only=True)
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match=r"holds no adapter_model.safetensors"):
        load_full_checkpoint(_one_process(), _lora(), tmp_path / "empty", adapter_only=True)
    with pytest.raises(CheckpointError, match=r"holds neither model.safetensors nor model.safetensors.index.json"):
        load_full_checkpoint(_one_process(), _tiny_model(), tmp_path / "empty")


def test_full_state_dict_trainers_get_the_safetensors_save_and_load_for_the_run_only(tmp_path):
    import types

    import transformers.trainer as library
    from hwrun.training.full_checkpoints import safetensors_full_checkpoints

    def trainer(kind):
        plugin = types.SimpleNamespace(state_dict_type=f"StateDictType.{kind}")
        return types.SimpleNamespace(is_fsdp_enabled=True,
                                     accelerator=types.SimpleNamespace(state=types.SimpleNamespace(fsdp_plugin=plugin)))

    accelerate_names = library.save_fsdp_model, library.load_fsdp_model
    reasons = {}
    with safetensors_full_checkpoints(trainer("SHARDED_STATE_DICT"), reasons):
        assert (library.save_fsdp_model, library.load_fsdp_model) == accelerate_names and not reasons
    full = trainer("FULL_STATE_DICT")
    with safetensors_full_checkpoints(full, reasons):
        assert library.save_fsdp_model is not accelerate_names[0] and library.load_fsdp_model is not accelerate_names[1]
        plugin = full.accelerator.state.fsdp_plugin
        with pytest.raises(CheckpointError, match=r"holds none of model.safetensors.*would hold no weights"):
            library.save_fsdp_model(plugin, _one_process(), None, str(tmp_path))  # save_model wrote nothing
        (tmp_path / "adapter_model.safetensors").write_bytes(b"x")
        library.save_fsdp_model(plugin, _one_process(), None, str(tmp_path))
        assert sorted(p.name for p in tmp_path.iterdir()) == ["adapter_model.safetensors"]  # no pickle beside it
    assert (library.save_fsdp_model, library.load_fsdp_model) == accelerate_names
    assert "the weights once, as save_pretrained's safetensors" in reasons["checkpoints"]


def test_the_kind_of_fsdp_checkpoint_is_told_by_its_files(tmp_path):
    from hwrun.training.sharding import checkpoint_layout

    for name, files, kind in [("sharded", ["pytorch_model_fsdp_0/.metadata", "optimizer_0/.metadata"], "sharded"),
                              ("full", ["model.safetensors", "optimizer.bin"], "full"),
                              ("older-full", ["model.safetensors", "pytorch_model_fsdp.bin", "optimizer.bin"], "full"),
                              ("no-fsdp", ["model.safetensors", "optimizer.pt"], None)]:
        for file in files:
            (tmp_path / name / file).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / name / file).write_bytes(b"x")
        assert checkpoint_layout(tmp_path / name) == kind, name

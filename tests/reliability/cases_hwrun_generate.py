"""Bad inputs for `hwrun plan` / `hwrun generate` (issue 27): each through `python -m hwrun.cli.main`.

The broken model folders are copies of the shipped tiny model with one thing damaged, built here
from the installed model so the table needs no stored binaries.
"""

from __future__ import annotations

import json
from pathlib import Path

from reliability_case import (
    Case,  # tests/reliability is on sys.path (reliability_tables puts it there)
)

M = "hwrun.cli.main"
_SHIPPED = Path(__file__).resolve().parents[2] / "packages" / "hwrun" / "src" / "hwrun" / "models" / "tiny-llama"


def _model_files(folder: str, *, config: object = None, weights: bytes | None = None,
                 extra: dict[str, str] | None = None) -> dict[str, str | bytes]:
    """A copy of the shipped model's config, tokenizer and weights under `folder`, with the given parts replaced."""
    files: dict[str, str | bytes] = {}
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        files[f"{folder}/{name}"] = (_SHIPPED / name).read_bytes()
    files[f"{folder}/model.safetensors"] = weights if weights is not None else (_SHIPPED / "model.safetensors").read_bytes()
    if config is not None:
        files[f"{folder}/config.json"] = json.dumps(config)
    files.update({f"{folder}/{name}": text for name, text in (extra or {}).items()})
    return files


def _config(**changes: object) -> dict:
    config = json.loads((_SHIPPED / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    return config


_WEIGHTS = (_SHIPPED / "model.safetensors").read_bytes()
GEN = ("generate", "The king said", "--max-new-tokens", "4")

CASES: tuple[Case, ...] = (
    Case("hwrun-model-truncated-safetensors", M, (*GEN, "--model", "broken"), "traceback-from-cli",
         "safetensors' SafetensorError traceback at load", "one-line error before loading: the file is truncated",
         "model.safetensors", files=_model_files("broken", weights=_WEIGHTS[: len(_WEIGHTS) // 2])),
    Case("hwrun-model-config-not-object", M, (*GEN, "--model", "broken"), "traceback-from-cli",
         "TypeError traceback from PreTrainedConfig", "one-line error: config.json is not an object", "list",
         files=_model_files("broken", config=[1, 2])),
    Case("hwrun-model-config-no-model-type", M, (*GEN, "--model", "broken"), "traceback-from-cli",
         "Transformers' ValueError traceback", "one-line error: config.json has no model_type", "model_type",
         files=_model_files("broken", config=_config(model_type=None))),
    Case("hwrun-model-custom-code-untrusted", M, ("plan", "broken"), "traceback-from-cli",
         "Transformers' trust_remote_code ValueError traceback at load", "one-line error naming the code and the flag",
         "--trust-remote-code",
         files=_model_files("broken", config=_config(model_type="my_custom",
                                                     auto_map={"AutoModelForCausalLM": "modeling_my.MyModel"}),
                            extra={"modeling_my.py": "raise SystemExit('model code ran')\n"})),
    Case("hwrun-hwenv-device-bogus", M, ("plan",), "traceback-from-cli", "hwenv DeviceOverrideError traceback",
         "one-line error naming the variable and the kinds", "'bogus'", env={"HWENV_DEVICE": "bogus"}),
    Case("hwrun-hwenv-device-absent", M, ("plan",), "traceback-from-cli", "hwenv DeviceOverrideError traceback",
         "one-line error: XPU not usable here", "'xpu'", env={"HWENV_DEVICE": "xpu"}),
    Case("hwrun-batch-file-binary", M, ("generate", "--batch-file", "prompts.txt"), "traceback-from-cli",
         "UnicodeDecodeError traceback", "one-line error: not UTF-8 text", "prompts.txt",
         files={"prompts.txt": b"\x00\xff\xfe\x80" * 64}),
    Case("hwrun-batch-file-dev-zero", M, ("generate", "--batch-file", "/dev/zero"), "hang-unbounded",
         "read until memory ran out", "one-line error: not a regular file", "/dev/zero"),
    Case("hwrun-temperature-without-sample", M, (*GEN, "--temperature", "0.5"), "silently-accepted",
         "ignored (greedy)", "one-line error: add --sample or drop it", "--temperature 0.5"),
    Case("hwrun-top-p-without-sample", M, (*GEN, "--top-p", "0.9"), "silently-accepted",
         "ignored (greedy)", "one-line error: add --sample or drop it", "--top-p 0.9"),
    Case("hwrun-temperature-negative", M, (*GEN, "--sample", "--temperature", "-1"), "unclear-error",
         "error after the model loaded, printed glued to the prompt", "one-line error before loading", "-1.0"),
    Case("hwrun-top-k-negative", M, (*GEN, "--sample", "--top-k", "-1"), "traceback-from-cli",
         "Transformers' ValueError traceback after loading", "one-line error before loading", "-1"),
    Case("hwrun-compile-misspelt", M, (*GEN, "--compile", "inductr"), "silently-accepted",
         "kept and never used", "one-line error naming the closest backend", "'inductor'"),
    Case("hwrun-device-unknown", M, ("plan", "--device", "tpu"), "unclear-error",
         "one-line error (kept)", "one-line error naming the kinds", "'tpu'"),
    Case("hwrun-plan-invalid-affinity-mask", M, ("plan",), "silently-accepted",
         "planned the CPU (the invalid mask hid every XPU)", "one-line error naming the mask", "ZE_AFFINITY_MASK='abc'",
         env={"ZE_AFFINITY_MASK": "abc"}),
    Case("hwrun-plan-gaudi-module-out-of-range", M, ("plan",), "silently-accepted",
         "planned as if the selection were valid", "one-line error: module IDs 0..7", "[9]",
         env={"HABANA_VISIBLE_MODULES": "9"}),
    Case("hwrun-plan-gaudi-selections-disagree", M, ("plan",), "silently-accepted",
         "planned; the two variables were never compared", "one-line error: set only HABANA_VISIBLE_MODULES",
         "HABANA_VISIBLE_DEVICES='2,3'", env={"HABANA_VISIBLE_MODULES": "0,1", "HABANA_VISIBLE_DEVICES": "2,3"}),
)

"""The root README's "Fine-tune on your chat data" step runs as written (issue 39.4): its three commands, taken from
between the `chat-step:commands` markers, run in bash (`uv run` is the project's venv, put first on PATH here) in a
fresh folder that sees the repository's `packages/`; the shipped model does not give the trained answer before and
gives it after."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
ANSWER = "The king rules the castle, and the queen rules beside him."


def readme_commands() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"<!-- chat-step:commands -->\n```bash\n(.*?)```\n<!-- /chat-step:commands -->", text, re.S)
    assert block, "the README's chat step lost its markers"
    return block.group(1)


def test_the_readme_step_is_the_three_commands():
    commands = readme_commands()
    lines = [line for line in commands.replace("\\\n", " ").splitlines() if line.strip()]
    assert len(lines) == 3 and all(line.startswith("uv run hwrun ") for line in lines)
    assert "--output my-chat" in lines[1] and "--model my-chat" in lines[2]
    assert "packages/hwrun/src/hwrun/data/chat_sample.jsonl" in lines[1]  # the shipped sample
    assert (ROOT / "packages/hwrun/src/hwrun/data/chat_sample.jsonl").is_file()


@pytest.mark.slow
def test_the_readme_chat_step_runs_as_written(tmp_path):
    script = readme_commands().replace("uv run hwrun ", "hwrun ")
    (tmp_path / "packages").symlink_to(ROOT / "packages")
    # The bytecode settings are inherited as they are: the venv's own `.pyc` (uv's compile-bytecode), or the root
    # conftest's PYTHONPYCACHEPREFIX where the venv has none. A folder of our own here made the three commands
    # compile torch's, Transformers' and PEFT's sources again on every fresh clone (issue 40.2).
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_"))}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1", HWENV_DEVICE="cpu",
               PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]))
    done = subprocess.run(["bash", "-e", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    before, _, after = done.stdout.partition("done: 80 steps")
    assert after, done.stdout[-3000:]
    assert ANSWER not in before  # the shipped model does not know it ...
    assert ANSWER in after  # ... the fine-tuned one answers with the assistant turn it was trained on
    assert (tmp_path / "my-chat" / "adapter_model.safetensors").is_file()
    assert (tmp_path / "my-chat" / "loss.png").is_file()

"""tools/tour.py (issue 40 point 4): the README's tour blocks are the script's, and the script's shortening of
`hwrun train`'s output keeps what it says it keeps. The tour itself runs for minutes: `uv run python
tools/tour.py` regenerates the README; here only its parts run."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SPEC = importlib.util.spec_from_file_location("tour", ROOT / "tools" / "tour.py")
tour = importlib.util.module_from_spec(SPEC)
sys.modules["tour"] = tour  # its dataclasses look their module up there
SPEC.loader.exec_module(tour)

TRAIN_OUTPUT = """field              value  reason
-----------------  -----  ------
model              /m     the tiny model shipped in hwrun
trust_remote_code  False  off
WARNING something the user should see
""" + "\n".join(f"step {n}/12  loss {5 - n / 10:.4f}  lr 1.00e-03" for n in range(1, 13)) + """
done: 12 steps, final loss 3.8000; LoRA adapter saved in ft"""


def test_every_tour_block_of_the_readme_is_one_the_script_writes():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    opened = re.findall(r"<!-- tour:([a-z]+) -->", text)
    closed = re.findall(r"<!-- /tour:([a-z]+) -->", text)
    assert opened == closed == ["machine", *[step.name for step in tour.STEPS]]
    for step in tour.STEPS:  # each command the README shows is one the script ran
        for command in step.commands:
            assert f"$ {command}\n" in text, command


def test_train_output_keeps_warnings_and_the_chosen_steps_and_says_what_it_left_out():
    ran = tour.Ran("uv run hwrun train ...", TRAIN_OUTPUT, 1.0, 0.5, 0)
    short = tour.shorten_train(ran)
    lines = short.output.splitlines()
    assert lines[0] == "WARNING something the user should see"  # only the plan table is dropped
    assert [line.split()[1] for line in lines if line.startswith("step ")] == ["1/12", "2/12", "10/12", "12/12"]
    assert lines.count("...") == 2 and lines[-1].startswith("done: 12 steps")
    assert short.notes == ["the plan table it prints first is left out (step 2 shows it)",
                           "8 of its 12 loss lines are left out (`...`)"]


def test_blocks_are_replaced_between_their_markers_only():
    text = "a\n<!-- tour:plan -->\nold\n<!-- /tour:plan -->\nb\n"
    assert tour.replace_block(text, "plan", "new") == "a\n<!-- tour:plan -->\nnew\n<!-- /tour:plan -->\nb\n"
    with pytest.raises(SystemExit, match="exactly one"):
        tour.replace_block(text, "doctor", "x")


def test_a_block_shows_the_commands_their_output_and_a_caption():
    step = tour.Step("generate", ("uv run hwrun generate x",))
    block = tour.render(step, [tour.Ran("uv run hwrun generate x", "x y\n[3 new tokens]", 12.34, 1.5, 0)])
    assert block.startswith("```console\n$ uv run hwrun generate x\nx y\n[3 new tokens]\n```\n<sub>")
    assert "12.3 s wall, load average 1.50 at its start" in block
    assert re.match(r"\d{4}-\d\d-\d\d, .+, \d+ cores", tour.machine())

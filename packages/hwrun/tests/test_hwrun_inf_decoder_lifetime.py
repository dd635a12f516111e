"""The graph decoders generate() keeps for a model live as long as the model, not as long as the process."""

from __future__ import annotations

import gc
import weakref

import hwrun
from hwrun.inference.generate import decoders_of


def test_a_model_given_to_generate_is_freed_with_its_decoders():
    plan = hwrun.plan(device="cpu")
    model, tokenizer = hwrun.load(plan)
    hwrun.generate(plan, ["Once upon a time"], 4, decode="graphs", model=model, tokenizer=tokenizer)
    hwrun.generate(plan, ["The king said", "It was"], 4, decode="graphs", batching="continuous", model=model,
                   tokenizer=tokenizer)
    kinds = {type(decoder).__name__ for decoder in decoders_of(model).values()}
    assert kinds == {"GraphDecoder", "EngineCore"}  # kept, so the next call replays instead of capturing again
    alive = weakref.ref(model)
    del model
    gc.collect()
    assert alive() is None, "a decoder kept the model (and its device memory) after the caller dropped it"


def test_decoders_are_reused_by_the_next_call():
    plan = hwrun.plan(device="cpu")
    model, tokenizer = hwrun.load(plan)
    hwrun.generate(plan, ["Once upon a time"], 4, decode="graphs", model=model, tokenizer=tokenizer)
    first = dict(decoders_of(model))
    hwrun.generate(plan, ["Once upon a time"], 4, decode="graphs", model=model, tokenizer=tokenizer)
    assert decoders_of(model) == first and all(decoders_of(model)[k] is v for k, v in first.items())

"""Streaming from the graph decoders: Transformers' streamer protocol (put/end) gets the prompt, then the
new tokens while decoding runs (at least once per `check_every` chunk), cut after the first EOS."""

from __future__ import annotations

import hwrun
import pytest
import torch
from hwrun.errors import FastDecodeError, GenerateError
from hwrun.inference.decode.static import GraphDecoder


class RecordingStreamer:
    """put()/end() recorder; `steps` says how many decode steps had run at each put."""

    def __init__(self):
        self.puts: list[list[int]] = []
        self.steps_at_put: list[int] = []
        self.ended = 0
        self.steps = 0

    def put(self, value):
        assert not self.ended, "put() after end()"
        self.puts.append(value.reshape(-1).tolist())
        self.steps_at_put.append(self.steps)

    def end(self):
        self.ended += 1


@pytest.fixture(scope="module")
def loaded():
    plan = hwrun.plan(hwrun.DEFAULT_MODEL, device="cpu")
    model, tokenizer = hwrun.load(plan)
    return plan, model, tokenizer


def test_tokens_arrive_while_the_decoder_runs(loaded):
    _, model, _ = loaded
    ids = torch.tensor([[5, 9, 14, 7]])
    decoder = GraphDecoder(model, max_cache_len=40, check_every=4)
    streamer = RecordingStreamer()
    step = decoder._step_fns[False]

    def counting_step():
        streamer.steps += 1
        step()

    decoder._step_fns[False] = counting_step
    out = decoder.generate(ids, 12, eos_token_id=None, streamer=streamer)
    assert streamer.puts[0] == [5, 9, 14, 7]  # the prompt first, as model.generate gives it
    assert [len(p) for p in streamer.puts[1:]] == [1, 4, 4, 3]  # the prefill token, then each chunk
    assert streamer.steps_at_put == [0, 0, 4, 8, 11]  # each chunk arrives before the next one runs
    assert sum(streamer.puts[1:], []) == out[0].tolist() and streamer.ended == 1


def test_stream_stops_after_the_first_eos(loaded):
    _, model, _ = loaded
    ids = torch.tensor([[5, 9, 14, 7]])
    free = GraphDecoder(model, max_cache_len=40).generate(ids, 12, eos_token_id=None)[0].tolist()
    eos = free[5]
    streamer = RecordingStreamer()
    GraphDecoder(model, max_cache_len=40, check_every=4).generate(ids, 12, eos_token_id=eos, streamer=streamer)
    streamed = sum(streamer.puts[1:], [])
    assert streamed == free[: free.index(eos) + 1] and streamer.ended == 1
    with pytest.raises(FastDecodeError, match="a streamer takes one row; this decoder has batch_size=2"):
        GraphDecoder(model, batch_size=2, max_cache_len=40).generate(torch.ones(2, 3, dtype=torch.long), 4,
                                                                     streamer=streamer)


def test_generate_streams_through_the_graph_decoder(loaded, capsys):
    plan, model, tokenizer = loaded
    streamer = RecordingStreamer()
    result = hwrun.generate(plan, "The king said", 20, decode="graphs", streamer=streamer, model=model,
                            tokenizer=tokenizer)
    assert result.decode == "graphs" and result.batching == "static"
    assert len(streamer.puts) >= 2 and streamer.ended == 1
    assert streamer.puts[0] == tokenizer("The king said")["input_ids"]
    assert sum(streamer.puts[1:], []) == result.token_ids[0]
    # stream=True prints with Transformers' TextStreamer, now from the graph loop too
    printed = hwrun.generate(plan, "The king said", 20, decode="graphs", stream=True, model=model,
                             tokenizer=tokenizer)
    out = capsys.readouterr().out
    assert out.strip() == printed.text.strip()


def test_generate_feeds_a_text_iterator_streamer(loaded):
    import threading

    from transformers import TextIteratorStreamer

    plan, model, tokenizer = loaded
    streamer = TextIteratorStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True, timeout=60)
    holder = {}
    thread = threading.Thread(target=lambda: holder.setdefault("r", hwrun.generate(
        plan, "Once upon a time", 16, decode="graphs", streamer=streamer, model=model, tokenizer=tokenizer)))
    thread.start()
    pieces = list(streamer)
    thread.join()
    assert "".join(pieces).strip() == holder["r"].text.strip()


def test_bad_streamers_and_many_prompts_are_refused(loaded):
    plan, model, tokenizer = loaded
    with pytest.raises(GenerateError, match="has no put\\(\\)/end\\(\\)"):
        hwrun.generate(plan, "hi", 2, streamer=object(), model=model, tokenizer=tokenizer)
    with pytest.raises(GenerateError, match="streams one prompt; got 2"):
        hwrun.generate(plan, ["a", "b"], 2, streamer=RecordingStreamer(), batching="static", decode="graphs",
                       model=model, tokenizer=tokenizer)

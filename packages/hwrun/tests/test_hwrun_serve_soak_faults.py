"""SIGTERM while `hwrun serve` is in a long prefill (issue 42's fault tests): the real server (front + engine-core
process) on a model built from a config whose prefill of the test's prompt takes seconds on one CPU thread (the
shipped tiny model has 512 positions and prefills them in milliseconds). The signal goes as soon as the stream's
headers arrive, before its first token. The request in flight ends cleanly: within `--grace-seconds` it runs to its
end (its tokens and `[DONE]`); with no grace it is cut at once with an error event (`shutting_down`) and `[DONE]`.
Either way the server exits 0 and its engine process is gone. kill -9 of the engine mid-stream is
test_hwrun_serve.py's `test_an_engine_process_killed_mid_stream_ends_every_request_with_an_error_never_a_hang`."""

from __future__ import annotations

import http.client
import json
import shutil
import sys
import time
from pathlib import Path

import hwrun
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tools"))
import soak_serve  # noqa: E402

#: The test's prompt: with the model below, a prefill of seconds on one CPU thread. Measured 2026-12-06 at load ~5:
#: the stream's headers came 0.09 s after the request, the signal right after, the first token 5.2 s after the
#: signal (so the signal landed in the prefill); the request then finished ("length") and the server exited 0.
PROMPT = "The king said to the queen that the castle was cold and the road was long. " * 190


@pytest.fixture(scope="module")
def long_context_model(tmp_path_factory) -> Path:
    """A Llama built from a config (random weights, seeded) with 4,096 positions and the shipped tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = tmp_path_factory.mktemp("model") / "long-llama"
    config = LlamaConfig(vocab_size=3072, hidden_size=256, intermediate_size=704, num_hidden_layers=4,
                         num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=4096, bos_token_id=1,
                         eos_token_id=2, pad_token_id=3, tie_word_embeddings=True)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (Path(hwrun.DEFAULT_MODEL) / name).is_file():
            shutil.copy(Path(hwrun.DEFAULT_MODEL) / name, folder / name)
    return folder


def _gone(pid: int) -> bool:
    try:
        return "\nState:\tZ" in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True


GRACE = [pytest.param("60", "finished", id="finishes-within-the-grace"),
         pytest.param("0", "cut", id="no-grace-cut-with-an-error-event")]


@pytest.mark.slow
@pytest.mark.parametrize(("grace", "ending"), GRACE)
def test_sigterm_during_a_long_prefill_ends_the_request_cleanly_and_exits_0(long_context_model, grace, ending):
    server = soak_serve.Server(str(long_context_model), "--max-model-len", "4096", "--max-concurrency", "2",
                               "--grace-seconds", grace)
    try:
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
        connection.request("POST", "/v1/completions", body=json.dumps(
            {"model": server.model, "prompt": PROMPT, "max_tokens": 8, "temperature": 0, "ignore_eos": True,
             "stream": True}), headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        assert response.status == 200  # admitted: the stream started, its prefill runs
        server.process.send_signal(soak_serve.signal.SIGTERM)
        signalled = time.monotonic()
        rest = response.read().decode()  # bounded by the socket's 120 s timeout
        connection.close()
        code = server.process.wait(120)
    finally:
        if server.process.poll() is None:
            server.kill()
    events = [event[len("data: "):] for event in rest.split("\n\n") if event.startswith("data: ")]
    assert events and events[-1] == "[DONE]", rest[-500:]
    chunks = [json.loads(event) for event in events[:-1]]
    assert chunks, rest[-500:]
    if ending == "cut":  # cut by the shutdown: said so, then [DONE]
        error = chunks[-1].get("error")
        assert error and error["code"] == "shutting_down" and error["message"], chunks[-1]
    else:  # finished in the grace period: its tokens, and its finish reason
        assert chunks[-1]["choices"][0]["finish_reason"] == "length", chunks[-1]
        assert any(c["choices"] and c["choices"][0].get("text") for c in chunks), chunks
    assert code == 0, "".join(server.lines[-20:])
    deadline = signalled + 30
    while not _gone(server.core) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _gone(server.core), f"the engine process {server.core} outlived the server"
    assert any(line.strip() == "hwrun serve: stopped" for line in server.lines), server.lines[-10:]

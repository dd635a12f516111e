"""How many prompt tokens one engine step may prefill (the chunked-prefill budget), per device and model size, and
why: the rule and the H100 measurement behind it (tools/bench/prefill_chunk.py)."""

from __future__ import annotations

from typing import Any

from ...errors import FastDecodeError

#: Prompt tokens a step prefills on an accelerator when the model's size is not known, see `prefill_chunk_for`.
ACCELERATOR_PREFILL_CHUNK = 512
#: The largest chunk measured at a prefill forward's launch floor, and the model it was measured with (H100, 1.24B
#: Llama, bf16, compiled: chunks of 128 to 1,024 tokens all made a step of 16.8-17.4 ms; tools/bench/prefill_chunk.py).
FLOOR_CHUNK, FLOOR_PARAMETERS = 1024, 1.24e9
#: Bounds of the accelerator's chunk: at least this many tokens (a big model's chunk is arithmetic-bound anyway), at
#: most this many (a 2,048-token step cost 25.4 ms eager on the H100, against 21.3 for 512).
MIN_ACCELERATOR_CHUNK, MAX_ACCELERATOR_CHUNK = 256, 2048
#: Prompt tokens a step prefills on a CPU, see `prefill_chunk_for`.
CPU_PREFILL_CHUNK = 128


def prefill_chunk_for(platform: Any, given: int | None = None, parameters: int | None = None) -> tuple[int, str]:
    """(prompt tokens one step may prefill, why) on `platform` for a model of `parameters`: `given`
    (`prefill_chunk=`) if set; on an accelerator the largest power of two whose arithmetic stays at the launch floor
    the H100 showed (1,024 tokens for 1.24B parameters, scaled by the model's size, within 256..2,048; 512 when the
    size is not known); 128 on a CPU. Every running stream waits for the step's chunk. On an accelerator a decode
    step is bound by reading the weights and a prefill forward by its kernel launches until the chunk's arithmetic
    dominates: on an H100 (1.24B Llama, bf16, 63 streams decoding; tools/bench/prefill_chunk.py) a compiled decode
    step took 7.0 ms and a step carrying a chunk of 128 to 1,024 tokens 16.8-17.4 ms (a prefill forward ~8-10 ms at
    any of those sizes), within the 4x-a-step bound of issue 35; a chunk that size costs running streams the same as
    a smaller one and takes a burst of prompts in fewer steps (the served TTFT p99 at 64 streams was ~0.9-1.2 s with
    512-token chunks). A CPU has no such floor: every prompt token costs its own arithmetic, about one decode row's,
    so its chunk is small (not measured: the CPUs here are shared)."""
    if given is not None:
        if isinstance(given, bool) or not isinstance(given, int) or given < 1:
            raise FastDecodeError(f"prefill_chunk={given!r} must be a positive number of prompt tokens per step.")
        return given, f"prefill_chunk={given} given"
    if not platform.is_accelerator:
        return CPU_PREFILL_CHUNK, (f"{CPU_PREFILL_CHUNK} prompt tokens a step on {platform.kind}: every prompt token "
                                   "costs its own arithmetic there, so a smaller chunk keeps running streams flowing")
    if not parameters:
        return ACCELERATOR_PREFILL_CHUNK, (f"{ACCELERATOR_PREFILL_CHUNK} prompt tokens a step on {platform.kind}: a "
                                           "decode step there is bound by reading the weights, so a chunk this size "
                                           "costs running streams about a step and a half more (H100, 1.24B Llama)")
    scaled = FLOOR_CHUNK * FLOOR_PARAMETERS / parameters
    chunk = MIN_ACCELERATOR_CHUNK
    while chunk * 2 <= min(scaled, MAX_ACCELERATOR_CHUNK):
        chunk *= 2
    return chunk, (f"{chunk} prompt tokens a step on {platform.kind} for {parameters / 1e9:.2f}B parameters: a "
                   f"prefill forward is launch-bound up to ~{FLOOR_CHUNK} tokens of a {FLOOR_PARAMETERS / 1e9:.2f}B "
                   "model (H100: a step with such a chunk cost running streams what a 128-token one did), scaled by "
                   f"the model's size, within {MIN_ACCELERATOR_CHUNK}-{MAX_ACCELERATOR_CHUNK}")

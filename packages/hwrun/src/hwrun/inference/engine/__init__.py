"""hwrun's engine: continuous batching over cache slots, one room per job.

    core.EngineCore        the loop: add / step / cancel / start, and generate() for whole batches
      |-- scheduler        admission, KV blocks per step (preemption), prefill chunks, packing, finishing (host)
      |     `-- prefill_budget  the prompt tokens a step may prefill, per device and model size
      |-- runner           the only code that runs the model: buffers, steps, capture/replay, warm-up
      |     |-- choosing   each row's token choice (sampling, bias, penalties, min-p, grammar mask, logprobs)
      |     |-- step_kinds FusedStep | ModelStep: one step interface, two implementations (steps: which runs)
      |     |-- adapters   per-request LoRA adapters (PEFT's mixed batch, the model step)
      |     |-- quantized  which step quantized weights run (bitsandbytes 4-bit: the model step, eager)
      |     `-- graphs     the platform's graph tools, torch.compile of a step, capture
      |-- grammar          host side of grammar-constrained choices (matchers accept tokens, fill bitmask rows)
      `-- kv_cache         paged K/V: a block pool per layer, a device block table per slot, who holds what
            |-- block_manager  the pool's bookkeeping (each request's blocks, free blocks)
            `-- kv_memory      how much memory the pool gets (kv_cache_memory, per device), what it holds, its use
    decode.paged_attention how a decode step reads the blocks (gathered, or a Triton kernel through the table)
    transfers              host <-> device copies without a stream synchronize (pinned buffers, one event wait a step)
    requests               one request's state (its choices, matcher) and the TokenEvent a step reports
    batches, buckets       generate()'s whole-batch loop; the row and column buckets a step runs over

`EngineCore`, `TokenEvent` and the bucket helpers are importable from here.
"""

from .core import EngineCore
from .requests import TokenEvent
from .scheduler import bucket_sizes, compiled_buckets, length_buckets
from .steps import slot_step_support

__all__ = ["EngineCore", "TokenEvent", "bucket_sizes", "compiled_buckets", "length_buckets", "slot_step_support"]

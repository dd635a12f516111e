"""hwrun's engine: continuous batching over cache slots, one room per job.

    core.EngineCore        the loop: add / step / cancel / start, and generate() for whole batches
      |-- scheduler        admission, prefill chunks under a token budget, packing, finishing (host only)
      |-- runner           the only code that runs the model: buffers, steps, capture/replay, warm-up
      |     |-- choosing   each row's token choice (sampling, bias, penalties, min-p, grammar mask, logprobs)
      |     |-- steps      FusedStep | ModelStep: one step interface, two implementations
      |     |-- adapters   per-request LoRA adapters (PEFT's mixed batch, the model step)
      |     `-- graphs     the platform's graph tools, torch.compile of a step, capture
      |-- grammar          host side of grammar-constrained choices (matchers accept tokens, fill bitmask rows)
      `-- kv_cache         the per-slot K/V storage and which request holds which slot
    requests               one request's state (its choices, matcher) and the TokenEvent a step reports

`EngineCore`, `TokenEvent` and the bucket helpers are importable from here.
"""

from .core import EngineCore
from .requests import TokenEvent
from .scheduler import bucket_sizes, compiled_buckets, length_buckets
from .steps import slot_step_support

__all__ = ["EngineCore", "TokenEvent", "bucket_sizes", "compiled_buckets", "length_buckets", "slot_step_support"]

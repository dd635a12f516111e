"""The token bitmask: one int32 row per batch row, bit j of word i set when token 32*i+j is allowed (the layout
xgrammar and llguidance fill), and the graph-safe step that turns it into -inf logits.

`apply_bitmask` is plain torch with fixed shapes and no host sync: it runs on CUDA, XPU and HPU alike and a
captured device graph replays it over the same buffers; a row that is all ones (-1) masks nothing, so unconstrained
requests share the step with constrained ones. On the CPU (no graphs there) it calls xgrammar's C++ kernel when
xgrammar is installed, measured 2.5x faster than the torch form (docs/benchmarks/structured_output.md), except
inside torch.compile and for vocabularies under 32 ids (where that kernel is wrong).
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from ...errors import GenerateError

logger = logging.getLogger(__name__)


def bitmask_words(vocab_size: int) -> int:
    """How many int32 words one row needs for `vocab_size` tokens: ceil(vocab_size / 32)."""
    return (vocab_size + 31) // 32


def allocate_bitmask(rows: int, vocab_size: int, device: Any = None, *, pin_memory: bool = False) -> Any:
    """An int32 [rows, ceil(vocab_size/32)] bitmask with every token allowed (all bits set), on `device`
    (None: CPU, where the grammar engines write it; `pin_memory=True` makes its copy to an accelerator asynchronous)."""
    import torch

    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
        raise GenerateError(f"bitmask rows={rows!r} must be an integer >= 1 (one row per batch row).")
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1:
        raise GenerateError(f"bitmask vocab_size={vocab_size!r} must be an integer >= 1 (the model's logits width).")
    mask = torch.full((rows, bitmask_words(vocab_size)), -1, dtype=torch.int32, device=device)
    return mask.pin_memory() if pin_memory else mask


def apply_bitmask(logits: Any, bitmask: Any) -> Any:
    """Set `logits[r, t]` to -inf in place wherever bit t of row r of `bitmask` is clear; returns `logits`.
    `logits` is [rows, vocab], `bitmask` int32 [rows, ceil(vocab/32)] on the same device; graph-safe (fixed shapes)."""
    import torch

    if logits.dim() != 2 or bitmask.dim() != 2 or bitmask.dtype != torch.int32:
        raise GenerateError(f"apply_bitmask takes logits [rows, vocab] and an int32 bitmask [rows, words]; got logits "
                            f"{tuple(logits.shape)} and bitmask {tuple(bitmask.shape)} {bitmask.dtype}.")
    rows, vocab = logits.shape
    if bitmask.shape[0] != rows or bitmask.shape[1] != bitmask_words(vocab):
        raise GenerateError(f"bitmask shape {tuple(bitmask.shape)} does not fit logits {tuple(logits.shape)}: it must "
                            f"be [{rows}, {bitmask_words(vocab)}] (allocate_bitmask(rows, vocab_size)).")
    if bitmask.device != logits.device:
        raise GenerateError(f"bitmask is on {bitmask.device} and logits on {logits.device}: copy the bitmask to the "
                            "logits' device before the step.")
    if logits.is_cpu and vocab >= _CPU_KERNEL_MIN_VOCAB and logits.dtype in (
            torch.float32, torch.bfloat16, torch.float16) and not torch.compiler.is_compiling():
        kernel = _cpu_kernel()
        if kernel is not None:
            kernel(logits, bitmask.contiguous(), vocab_size=vocab)
            return logits
    return logits.masked_fill_(blocked_tokens(bitmask)[:, :vocab], float("-inf"))


_CPU_KERNEL: list[Any] = []  # [kernel or None], looked up once
#: xgrammar 0.2.9's CPU kernel masks the wrong rows, and writes past the logits, for vocabularies of 8 or fewer ids
#: (found by hwrun's tests); at every size tried from 9 to 151,936 ids it matched the torch form bit for bit.
_CPU_KERNEL_MIN_VOCAB = 32


def _cpu_kernel() -> Any:
    """xgrammar's CPU kernel, or None (logged once) when xgrammar is not installed."""
    if not _CPU_KERNEL:
        try:
            from xgrammar.kernels import apply_token_bitmask_inplace_cpu as module

            _CPU_KERNEL.append(module.apply_token_bitmask_inplace_cpu)
        except ImportError as error:
            logger.info("structured output: the CPU masks logits with plain torch, 2.5x slower than xgrammar's "
                        "kernel, which cannot be imported (%s): pip install 'hwrun[structured]'", error)
            _CPU_KERNEL.append(None)
    return _CPU_KERNEL[0]


def blocked_tokens(bitmask: Any) -> Any:
    """A bool [rows, 32 * words] tensor, True where the token's bit is clear. Each byte of the bitmask is looked up in
    a 256 x 8 table (little-endian: byte k of word i holds tokens 32*i + 8*k ... + 7): one byte of temporaries per
    token where shifting each word 32 ways makes eight. The table is made by kernels on the device each call (no host
    copy, so a graph capture records it too)."""
    import torch

    rows, device = bitmask.shape[0], bitmask.device
    if sys.byteorder != "little":  # the word's bytes are not in token order: shift each word instead
        shifts = torch.arange(32, dtype=torch.int32, device=device)
        return ((bitmask.unsqueeze(-1) >> shifts) & 1).eq(0).view(rows, -1)
    byte = torch.arange(256, dtype=torch.int32, device=device)
    table = ((byte.unsqueeze(-1) >> torch.arange(8, dtype=torch.int32, device=device)) & 1).eq(0)
    return table[bitmask.contiguous().view(torch.uint8).int()].view(rows, -1)

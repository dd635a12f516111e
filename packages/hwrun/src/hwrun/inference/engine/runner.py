"""The model runner: the only code that runs the model on the device. It holds the fixed buffers a decode step
reads and writes (each slot's newest token, its position, its token counter, its produced tokens, its sampling
row), the step chosen once at construction (`FusedStep` or `ModelStep`, hwrun.inference.engine.step_kinds), one step
function per (greedy or sampled, rows, cache columns) bucket, compiled where asked and captured as a device graph
through hwrun.inference.engine.graphs where the platform has graph tools, and the warm-up (`start`) that captures
or compiles every bucket before the first request, telling `progress` (and the log) each bucket as it is done.

A decode step runs over the first `rows` slots through views of the fixed buffers, so each bucket has fixed shapes
and addresses and its own graph. Idle rows among them (free slots, a prompt still being prefilled) step too: their
writes land on their own row at their own position, which is rewritten before it is read, and clamp at the end.
A row's sampling noise depends only on its seed and its token counter, both of which move with it.

Six step kinds per bucket (hwrun.inference.engine.choosing: greedy or sampled, plain, processed or masked), chosen per
step by the rows it runs; one graph of a kind serves any mix of rows a smaller kind serves.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .choosing import GREEDY, KIND_NAMES, KINDS, MASKED, PROCESSED, SAMPLED, RowChoice, vocab_size
from .graphs import (
    BucketWarmed,
    FilterChoice,
    capture_graph,
    compile_step,
    warm_buckets,
    with_filter_fallback,
)
from .kv_cache import KVCache
from .scheduler import Chunk
from .step_kinds import STEP_KINDS
from .steps import prefill_attention

__all__ = ["GREEDY", "MASKED", "PROCESSED", "SAMPLED", "ModelRunner", "prefill_attention"]


class ModelRunner:
    """Runs `model` with the step `step_name` over `kv`'s slots: prefills, decode steps (graph replays where
    `use_graphs`), reads of the produced tokens and row moves."""

    def __init__(self, model: Any, step_name: str, kv: KVCache, *, platform: Any, graph_tools: Any,
                 use_graphs: bool, compile: tuple[Any, str | None, bool] = (None, None, False),
                 adapters: Any = None) -> None:
        import torch

        from .transfers import Transfers

        self.device = model.device
        self.kv = kv
        self.transfers = kv.transfers if kv.transfers is not None else Transfers(None, self.device)
        self.slots, self.max_cache_len = kv.slots, kv.max_cache_len
        long = dict(dtype=torch.long, device=self.device)
        self.token = torch.zeros((self.slots, 1), **long)  # each slot's newest token ...
        self.position = torch.zeros((self.slots, 1), **long)  # ... and its position
        self.count = torch.zeros((self.slots, 1), **long)  # tokens each slot's request has produced
        self.out = torch.zeros((self.slots, self.max_cache_len), **long)  # those tokens
        self.adapters = adapters  # each slot's LoRA adapter (AdapterRows; the model step only) or None
        self.step = STEP_KINDS[step_name](model, kv, self.position, adapters)
        self.choice = RowChoice(self.slots, vocab_size(model), self.device)
        self.sampling, self.logits = self.choice.sampling, self.choice.logits
        self.platform, self.graph_tools, self.use_graphs = platform, graph_tools, use_graphs
        self._compile = compile
        self.compiled = compile[0] is not None
        # (kind, rows, columns) -> the step over the first rows, attending over the first columns; its graph
        self.step_fns: dict[tuple[int, int, int], Any] = {}
        self.graphs: dict[tuple[int, int, int], Any] = {}
        self.warmed: set[tuple[int, int, int]] = set()
        self.sampling_fallback: str | None = None  # why a compiled sampled step's filter runs eagerly, if one does
        self.capture_seconds: float | None = None
        self.progress: Callable[[BucketWarmed], None] | None = None  # told each bucket `start` warms (set by its caller)

    # ---- one decode step ----------------------------------------------------------------------------------------

    def _step(self, kind: int, rows: int, columns: int, filter: Any = None) -> None:
        """One decode step of the first `rows` slots, attending over the first `columns` cache positions (every
        decoding row's position must be below it); fixed buffers and views of them only (capturable)."""
        part = rows != self.slots
        token = self.token[:rows] if part else self.token
        position = self.position[:rows] if part else self.position
        count = self.count[:rows] if part else self.count
        nxt = self.choice.decode(kind, self.step.decode(token, position, columns), rows, count, filter)
        token.copy_(nxt)
        self.out.scatter_(1, count, nxt)  # on the whole buffer: a smaller index writes only the stepped rows
        count.add_(1).clamp_(max=self.max_cache_len - 1)
        position.add_(1).clamp_(max=self.max_cache_len - 1)

    def step_buffers(self) -> list[Any]:
        """What one step moves (tokens, positions, counters, produced tokens): restored after capture warm-ups.
        The K/V a step writes is rewritten with the same values when the step runs again."""
        return [self.token, self.position, self.count, self.out, self.logits.counts, self.logits.logprob,
                self.logits.top_logprobs, self.logits.top_ids]

    def step_function(self, kind: int, rows: int, columns: int) -> Any:
        """The step over the first `rows` slots and `columns` positions, compiled where asked; built once per
        (kind, rows, columns). Each gets its own code object, so torch.compile keeps one entry per bucket
        instead of recompiling one past its recompile limit; the step is told the rows and columns (`select`)
        outside the compiled region."""
        kind = int(kind)
        key = (kind, rows, columns)
        if key not in self.step_fns:
            choice = FilterChoice()

            def step() -> None:
                self._step(kind, rows, columns, choice.filter)

            step.__code__ = step.__code__.replace(co_name=f"slot_step_{KIND_NAMES[kind]}_{rows}_{columns}")
            compiled = compile_step(step, *self._compile)
            if kind != GREEDY and self.compiled:
                compiled = with_filter_fallback(compiled, choice, self)

            def run() -> None:
                self.step.select(rows, columns)
                compiled()

            self.step_fns[key] = run
        return self.step_fns[key]

    def runnable(self, kind: int, rows: int, columns: int) -> Any:
        """The callable that runs one step over the first `rows` slots and `columns` positions: the captured graph's
        replay (captured now if needed) or the step itself."""
        step = self.step_function(kind, rows, columns)
        if not self.use_graphs:
            return step
        key = (int(kind), rows, columns)
        if key not in self.graphs:
            self.graphs[key], seconds = capture_graph(step, self.device, self.step_buffers(),
                                                      tools=self.graph_tools, platform=self.platform)
            self.capture_seconds = (self.capture_seconds or 0.0) + seconds
        return self.graphs[key].replay

    def run(self, kind: int, rows: int, columns: int, times: int = 1) -> None:
        """`times` decode steps of the first `rows` slots (one graph replay each where captured)."""
        import torch

        with torch.inference_mode():
            self.kv.sync()
            step = self.runnable(kind, rows, columns)
            for _ in range(times):
                step()

    def start(self, buckets: tuple[int, ...], cache_buckets: tuple[int, ...], sampling: bool = True,
              processed: bool = False) -> list[BucketWarmed]:
        """Capture every (rows, cache length) bucket's greedy step (and sampled step when `sampling`, processed and
        masked steps when `processed`) if not yet captured; without graphs, run each compiled step once (its
        compilation), restoring the buffers. Each bucket done is logged and told to `self.progress` (`warm_buckets`)."""
        kinds = KINDS if processed else (GREEDY, SAMPLED) if sampling else (GREEDY,)
        return warm_buckets(self, buckets, cache_buckets, kinds, self.progress)

    # ---- prefill, sampling rows, reads and moves -------------------------------------------------------------

    def prefill(self, forward: list[Chunk]) -> None:
        """One prefill forward: prompts starting at position 0 (padded together), or chunks continuing their rows'
        prompts (one: attention causal from its offset; several, padded together: each at its own positions). A row
        whose prompt it ends gets its first token, position and counter, and so does every row its chunk copies its
        K/V into (the other choices of its request); a row with more to come gets the position its next chunk starts
        at (where an idle decode step's write is rewritten)."""
        import torch

        with torch.inference_mode(), prefill_attention():
            self.kv.sync()
            to_device = self.transfers.to_device  # no stream synchronize (pinned host memory, non-blocking)
            rows = to_device([c.slot for c in forward])
            if forward[0].start and len(forward) == 1:  # one continued prompt (e.g. a long one's next chunk)
                (chunk,) = forward
                logits = self.step.extend(chunk.tokens, chunk.slot, chunk.start)
            elif forward[0].start:  # several continued prompts (after cached prefixes), each at its own positions
                logits = self.step.extend_rows([c.tokens for c in forward], rows, [c.start for c in forward])
            else:
                logits = self.step.prefill([c.tokens for c in forward], rows)
            ends = to_device([c.start + len(c.tokens) for c in forward])
            done = [i for i, c in enumerate(forward) if c.last and not c.resume]  # a resumed row keeps its tokens
            if len(done) < len(forward):
                index = to_device([i for i, c in enumerate(forward) if not c.last or c.resume])
                self.position[rows[index], 0] = ends[index]
            if not done:
                return
            sources = [i for i in done for _ in (None, *forward[i].copies)]  # each done row, then its copies
            slots = [slot for i in done for slot in (forward[i].slot, *forward[i].copies)]
            for i in done:
                for copy in forward[i].copies:
                    self.kv.copy(forward[i].slot, copy, forward[i].start + len(forward[i].tokens))
            index = to_device(sources)
            rows, logits, ends = to_device(slots), logits[index], ends[index]
            self.choice.logits.counts[rows] = 0  # what idle steps chose while the prompt was prefilled is not its
            first = self.choice.first(logits, rows, slots)
            self.token[rows, 0] = first
            self.position[rows, 0] = ends
            self.out[rows, 0] = first
            self.count[rows, 0] = 1

    def set_sampling(self, slot: int, params: Any, prompt: Any = (), constrained: bool = False,
                     adapter: str | None = None) -> None:
        """Give `slot` the sampling `params` (its seed resolved now), its `prompt` (for the repetition penalty),
        whether a grammar constrains it, and its LoRA `adapter` (None: the base model)."""
        import torch

        with torch.inference_mode():
            self.choice.set(slot, params, prompt, constrained)
        if self.adapters is not None:
            self.adapters.set(slot, adapter)

    def fill_sampling(self, params: Any) -> None:
        """Give every slot the sampling `params` (each drawing its own seed when `params.seed` is None)."""
        import torch

        with torch.inference_mode():
            self.choice.fill(params)

    def kind(self, slots: Any) -> int:
        """The step kind that serves `slots` (greedy, sampled, processed or masked)."""
        return self.choice.kind(slots)

    def masks(self, matchers: list[tuple[int, Any]]) -> None:
        """Fill the grammar bitmask rows of (slot, matcher or None) pairs for the next step or prefill."""
        import torch

        with torch.inference_mode():
            self.choice.masks(matchers)

    def read(self, slots: list[int], columns: list[int]) -> list[int]:
        """Token `columns[i]` of slot `slots[i]`'s produced tokens, for each i (waits for them)."""
        return self.read_later(slots, columns)()

    def read_later(self, slots: list[int], columns: list[int]) -> Any:
        """Queue the copy of token `columns[i]` of slot `slots[i]`, for each i, to the host; the returned function
        waits for that copy alone and gives the tokens (a step queued after it runs on meanwhile)."""
        import torch

        with torch.inference_mode():
            return self.transfers.read_later(self.out, slots, columns)

    def read_logprobs_later(self, slots: list[int], columns: list[int]) -> Any:
        """As `read_later`, for {slot: (logprob, top (id, logprob) pairs)} of token `columns[i]` of `slots[i]`, where
        asked."""
        import torch

        with torch.inference_mode():
            return self.choice.read_logprobs_later(slots, columns, self.transfers)

    def produced(self, rows: int) -> Any:
        """The produced tokens of the first `rows` slots, on the host (one transfer)."""
        return self.out[:rows].cpu()

    def move_row(self, source: int, target: int, columns: int) -> None:
        """Row `source`'s whole decoding state into row `target`: its token, position, token counter, produced
        tokens and choosing row (seed included, so its noise stream goes on; counts, bias, penalties, bitmask,
        logprobs). Its K/V stay in their blocks: the block table row moved with the slot (`KVCache.follow`) and
        reaches the device with the next step. Outside any graph: the next step reads the fixed buffers."""
        import torch

        with torch.inference_mode():
            for buffer in (self.token, self.position, self.count, self.out):
                buffer[target] = buffer[source]
            self.choice.move(source, target)
            if self.adapters is not None:
                self.adapters.move(source, target)

    def preempt(self, slot: int, produced: int) -> tuple[list[int], list[Any]]:
        """A decoding row preempted (its blocks freed; it keeps its slot, idle): its first `produced - 1` tokens
        (recomputed with its prompt later) and a copy of its choosing row (idle steps overwrite it)."""
        import torch

        with torch.inference_mode():
            tokens = self.out[slot, :max(produced - 1, 0)].tolist()
            return tokens, [t[slot].clone() for t in self.choice.logits.tensors()]

    def resume(self, slot: int, produced: int, saved: list[Any]) -> None:
        """A preempted row whose prompt and tokens were prefilled again: its newest token, counter and choosing row
        as they were (its position is where the prefill ended), so it goes on as if never preempted."""
        import torch

        with torch.inference_mode():
            self.token[slot, 0] = self.out[slot, produced - 1]
            self.count[slot, 0] = produced
            for tensor, value in zip(self.choice.logits.tensors(), saved, strict=True):
                tensor[slot] = value

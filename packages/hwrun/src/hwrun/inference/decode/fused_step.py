"""A functional forward for Llama-family decoders over fused weights and a plain static KV cache.

Why: at batch 1 the decode step is a chain of small kernels, and each costs a few microseconds
however little it reads. Reading q/k/v as one matrix and gate/up as one (two matrix-vector
products per layer instead of five), writing K/V into plain tensors (no cache bookkeeping) and
computing grouped-query attention as two batched products over the unrepeated KV heads leaves
fewer, larger kernels for `torch.compile` and the CUDA graph (hwrun.inference.decode.static and
hwrun.inference.engine). The arithmetic
is the model's own: RMSNorm in fp32, the model's rotary embedding and activation, softmax in fp32.
No second copy of the weights: `fuse_linears` concatenates q/k/v (and gate/up) once per layer and
makes the model's own Linear weights (and biases) views into the fused matrix, so the model and the
step read the same memory and a cached decoder costs no extra weight memory (`extra_bytes` is 0; the
transient peak while fusing is one layer's q/k/v + gate/up). The model's values, forward, state_dict
keys, `requires_grad` and later in-place loads (`load_state_dict` copies into the views) are unchanged;
a second decoder on the same model reuses the fused matrices. The fusion runs outside inference mode,
so the weights stay ordinary tensors that training can use.

torchao's quantized weights (int8/int4 weight-only, int8 dynamic: tensor subclasses on ordinary `Linear`s) run
through the same step without fusing: concatenating packed int4/int8 tensors is not an operation torchao defines,
and a dequantized copy would give the bytes back. q/k/v (and gate/up) are then separate matrix products over the
same normed input (`torchao_weights`), each dispatched to torchao's kernel, while the rest of the step (the plain
K/V writes, the attention over unrepeated KV heads, one graph) stays. Other quantized layers (bitsandbytes,
compressed-tensors, AWQ/GPTQ modules) are not plain `Linear`s and keep the model's own forward.
"""

from __future__ import annotations

from typing import Any

from ...errors import FastDecodeError
from ...model.quantization import is_torchao_tensor

#: Model types whose decoder layers are input_layernorm -> self_attn(q,k,v,o) -> residual ->
#: post_attention_layernorm -> mlp(gate, up, down) -> residual, with nothing else in between.
FUSED_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2"})


def fused_step_support(model: Any) -> str | None:
    """None when `model` can run the fused step exactly, else the reason it cannot."""
    config = model.config.get_text_config(decoder=True)
    model_type = getattr(config, "model_type", None)
    if model_type not in FUSED_MODEL_TYPES:
        return f"model_type {model_type!r} is not one of {sorted(FUSED_MODEL_TYPES)}"
    if getattr(config, "pretraining_tp", 1) not in (None, 1):
        return "config.pretraining_tp > 1"
    quantized = getattr(model, "is_quantized", False) or getattr(model, "hf_quantizer", None) is not None
    if quantized and not torchao_weights(model):
        return "quantized weights"
    if (getattr(model, "tp_size", None) or 1) > 1:
        return "tensor-parallel shards: the fused step reads whole weights"
    decoder = model.get_decoder()
    for name in ("embed_tokens", "layers", "norm", "rotary_emb"):
        if not hasattr(decoder, name):
            return f"the decoder has no {name}"
    head = model.get_output_embeddings()
    if head is None or type(head).__name__ != "Linear" or head.bias is not None:
        return "the output head is not a bias-free Linear"
    for layer in decoder.layers:
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        parts = [getattr(attn, n, None) for n in ("q_proj", "k_proj", "v_proj", "o_proj")]
        parts += [getattr(mlp, n, None) for n in ("gate_proj", "up_proj", "down_proj")]
        if any(p is None or type(p).__name__ != "Linear" for p in parts):
            return f"layer {type(layer).__name__} does not hold plain Linear q/k/v/o and gate/up/down projections"
        if not hasattr(layer, "input_layernorm") or not hasattr(layer, "post_attention_layernorm"):
            return f"layer {type(layer).__name__} has no input/post-attention norms"
    return None


def torchao_weights(model: Any) -> bool:
    """True when `model`'s quantized weights are torchao's tensor subclasses on plain `Linear`s (quantize-on-load or a
    torchao checkpoint) and nothing else is quantized: the fused step runs them unfused (see the module's note)."""
    quantizer = getattr(model, "hf_quantizer", None)
    method = getattr(getattr(quantizer, "quantization_config", None), "quant_method", None)
    if quantizer is not None and str(getattr(method, "value", method)) != "torchao":
        return False
    found = False
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if weight is None:
            continue
        if is_torchao_tensor(weight):
            if type(module).__name__ not in ("Linear", "Embedding"):
                return False
            found = True
        elif type(module).__module__.startswith(("bitsandbytes", "compressed_tensors", "gptqmodel", "awq", "hqq")):
            return False
    return found


def _views_of(fused: tuple[Any, Any], linears: list[Any]) -> bool:
    """Whether every Linear's weight (and bias) is still the view of `fused` that `fuse_linears` made."""
    weight, bias = fused
    offset = 0
    for linear in linears:
        rows = linear.weight.shape[0]
        if linear.weight.data_ptr() != weight[offset].data_ptr() or linear.weight.shape != weight[offset:offset + rows].shape:
            return False
        if (bias is None) != (linear.bias is None) or (bias is not None and linear.bias.data_ptr() != bias[offset:].data_ptr()):
            return False
        offset += rows
    return offset == weight.shape[0]


def fuse_linears(owner: Any, name: str, linears: list[Any]) -> tuple[Any, Any]:
    """(weight, bias) of `linears` stacked along the output dimension, built once: each Linear's weight and
    bias become views into them (no second copy). Kept on `owner` as `name` and reused while still shared."""
    import torch

    fused = owner.__dict__.get(name)
    if fused is not None and _views_of(fused, linears):
        return fused
    with torch.inference_mode(False), torch.no_grad():
        weight = torch.cat([linear.weight.detach() for linear in linears], dim=0).contiguous()
        has_bias = linears[0].bias is not None
        bias = torch.cat([linear.bias.detach() for linear in linears], dim=0).contiguous() if has_bias else None
        offset = 0
        for linear in linears:
            rows = linear.weight.shape[0]
            linear.weight = torch.nn.Parameter(weight[offset:offset + rows], requires_grad=linear.weight.requires_grad)
            if has_bias:
                linear.bias = torch.nn.Parameter(bias[offset:offset + rows], requires_grad=linear.bias.requires_grad)
            offset += rows
    owner.__dict__[name] = (weight, bias)  # a plain attribute: not a parameter, buffer or state_dict entry
    return weight, bias


def _held(weight: Any) -> Any:
    """The tensor the step reads for `weight`: detached, except torchao's (its subclasses cannot be detached under
    inference mode, and hold no autograd state worth dropping)."""
    return weight if is_torchao_tensor(weight) else weight.detach()


def _separate(linears: list[Any]) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """(weights, biases) of `linears` as they are (torchao's quantized weights: not concatenated)."""
    return (tuple(_held(linear.weight) for linear in linears),
            tuple(None if linear.bias is None else linear.bias.detach() for linear in linears))


def _linear(x: Any, weight: Any, bias: Any) -> Any:
    """`F.linear` over a fused matrix, or over separate (torchao) matrices with the outputs concatenated."""
    import torch
    import torch.nn.functional as F

    if isinstance(weight, tuple):
        return torch.cat([F.linear(x, w, b) for w, b in zip(weight, bias, strict=True)], dim=-1)
    return F.linear(x, weight, bias)


#: Where `fuse_linears` keeps the fused matrices on the attention and MLP modules.
FUSED_QKV = "_hwrun_fused_qkv"
FUSED_GATE_UP = "_hwrun_fused_gate_up"


def _norm(module: Any) -> tuple[Any, float]:
    eps = getattr(module, "variance_epsilon", getattr(module, "eps", 1e-6))
    return module.weight.detach(), float(eps)


class FusedLlamaStep:
    """`step(token_ids, positions) -> last-position logits` for a Llama-family CausalLM, with its own
    static K/V cache of `max_cache_len` positions for `batch_size` rows.

    By default every row decodes at the same position (one `index_copy_` per layer writes K/V);
    `per_row_positions=True` lets each row sit at its own position, which is what continuous batching
    over slots (hwrun.inference.engine) needs: K/V are then written with one `index_put_` per layer at
    (row, kv head, that row's position), and a decode step may pass fewer rows than `batch_size`: it then
    runs over the cache's first rows only, and may attend over its first `columns` positions only (views of
    the same buffers, so each row count and length has fixed shapes and addresses). `storage` (the engine's
    KV-cache manager) allocates the K/V tensors when given (`storage.allocate(layers, shape, dtype, device)`).
    """

    def __init__(self, model: Any, *, batch_size: int, max_cache_len: int, per_row_positions: bool = False,
                 storage: Any = None) -> None:
        import torch

        reason = fused_step_support(model)
        if reason is not None:
            raise FastDecodeError(f"the fused decode step cannot run {type(model).__name__}: {reason}.")
        config = model.config.get_text_config(decoder=True)
        decoder = model.get_decoder()
        first = decoder.layers[0].self_attn
        self.n_heads = config.num_attention_heads
        self.n_kv = getattr(config, "num_key_value_heads", None) or self.n_heads
        self.head_dim = getattr(first, "head_dim", None) or config.hidden_size // self.n_heads
        self.scaling = float(getattr(first, "scaling", self.head_dim ** -0.5))
        self.q_size = self.n_heads * self.head_dim
        self.kv_size = self.n_kv * self.head_dim
        self.embed = decoder.embed_tokens
        self.rotary = decoder.rotary_emb
        self.final_norm = _norm(decoder.norm)
        self.lm_head = _held(model.get_output_embeddings().weight)
        self.layers = []
        fused = 0
        #: torchao's quantized weights: q/k/v and gate/up stay separate products (tuples below), nothing is fused
        self.unfused = torchao_weights(model)
        for layer in decoder.layers:
            attn, mlp = layer.self_attn, layer.mlp
            if self.unfused:
                qkv, qkv_bias = _separate([attn.q_proj, attn.k_proj, attn.v_proj])
                gate_up, gate_up_bias = _separate([mlp.gate_proj, mlp.up_proj])
            else:
                qkv, qkv_bias = fuse_linears(attn, FUSED_QKV, [attn.q_proj, attn.k_proj, attn.v_proj])
                gate_up, gate_up_bias = fuse_linears(mlp, FUSED_GATE_UP, [mlp.gate_proj, mlp.up_proj])
                fused += qkv.numel() * qkv.element_size() + gate_up.numel() * gate_up.element_size()
            self.layers.append(dict(
                norm_in=_norm(layer.input_layernorm), qkv=qkv, qkv_bias=qkv_bias,
                o=_held(attn.o_proj.weight), o_bias=None if attn.o_proj.bias is None else attn.o_proj.bias.detach(),
                norm_post=_norm(layer.post_attention_layernorm), gate_up=gate_up, gate_up_bias=gate_up_bias,
                down=_held(mlp.down_proj.weight),
                down_bias=None if mlp.down_proj.bias is None else mlp.down_proj.bias.detach(),
                act=mlp.act_fn,
            ))
        self.fused_bytes = fused  # shared with the model's own q/k/v and gate/up weights
        self.extra_bytes = 0  # no second copy (see fuse_linears)
        self.intermediate = mlp.gate_proj.out_features
        # the embedding's (never quantized here): a torchao LM head reports its logical dtype, but is not the cache's
        dtype, device = self.embed.weight.dtype, self.embed.weight.device
        shape = (batch_size, self.n_kv, max_cache_len, self.head_dim)
        self.paged = storage if getattr(storage, "paged", False) else None  # the engine's paged KV (kv_cache)
        if self.paged is not None:
            self.paged.allocate(len(self.layers), self.n_kv, self.head_dim, dtype, device)
            self.keys = self.values = []
        elif storage is not None:
            self.keys, self.values = storage.allocate(len(self.layers), shape, dtype, device)
        else:
            self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in self.layers]
            self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in self.layers]
        self.max_cache_len = max_cache_len
        self.per_row_positions = per_row_positions
        # (row, kv head) index grids for the per-row K/V writes
        self.row_index = torch.arange(batch_size, device=device)[:, None].expand(batch_size, self.n_kv)
        self.head_index = torch.arange(self.n_kv, device=device)[None, :].expand(batch_size, self.n_kv)
        self.key_index = torch.arange(max_cache_len if self.paged is None else self.paged.span_len, device=device)
        self.batch_size = batch_size

    def reset(self) -> None:
        """Forget every cached position (not needed for correctness: positions overwrite, the mask hides the rest)."""
        for k, v in zip(self.keys, self.values, strict=True):
            k.zero_()
            v.zero_()

    def _paged(self, i: int, k: Any, v: Any, positions: Any, rows: Any, offset: int, decode: bool,
               columns: int | None, continued: Any = None) -> tuple[Any, Any, Any, Any]:
        """Layer `i`'s new K/V written into the engine's blocks; (keys, values) a decode step attends over, and the
        (k, v) a prefill attends over (a continued prompt: its row's blocks up to its last position; continued rows
        each at their own positions: their blocks up to the furthest end)."""
        if decode:
            self.paged.write_decode(i, positions, k[:, :, 0], v[:, :, 0])
            if self.paged.attention == "triton":  # the kernel reads the blocks itself (decode/paged_attention.py)
                return None, None, k, v
            keys, values = self.paged.gather_heads_first(i, k.shape[0], columns)  # (kv heads, rows, columns, dim)
            return keys, values, k, v
        if continued is not None:
            valid, end = continued
            self.paged.write_positions(i, rows, positions, valid, k, v)
            k, v = self.paged.gather_rows(i, rows, end)
            return None, None, k, v
        self.paged.write(i, rows, offset, k, v)
        if offset:
            k, v = self.paged.gather_rows(i, rows, offset + k.shape[2])
        return None, None, k, v

    @staticmethod
    def _rms(x: Any, norm: tuple[Any, float]) -> Any:
        import torch

        weight, eps = norm
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
        return weight * h.to(x.dtype)

    def __call__(self, token_ids: Any, positions: Any, *, rows: Any = None, last_index: Any = None,
                 columns: int | None = None, offset: int = 0, continued: Any = None) -> Any:
        """Logits (batch, vocab) of each row's last position; writes K/V of `positions` into the cache.

        T == 1 (`token_ids` of shape (batch, 1)) is one decode step of the cache's first `batch` rows (every
        row unless `per_row_positions` and fewer rows are passed); `positions` (batch, 1) are equal across
        rows unless `per_row_positions`. T > 1 is a prefill starting at
        position 0 (causal attention over the prompt itself), written into cache rows `rows` (a long
        tensor; default all rows); prompts of different lengths are right-padded, and `last_index`
        (one per row) says where each row's last real token is (default: the last column). `columns` bounds a
        decode step's attention to the cache's first positions (each row's position must be below it, or the
        row is idle); default: all `max_cache_len`. A prefill with `offset` > 0 continues the prompts of `rows`
        (a chunked prefill): its tokens sit at positions `offset..` (`positions` says so), their K/V go to those
        cache columns, and they attend over the row's cached columns before them too. `continued=(valid, end)`
        (paged storage only) continues several rows' prompts, each at its own positions (`positions` (batch, T),
        right-padded; `valid` (batch, T) marks the real tokens, `end` the furthest position + 1): each query attends
        over its row's columns up to its own position.
        """
        import torch
        import torch.nn.functional as F
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        batch, length = token_ids.shape
        hidden = self.embed(token_ids)
        cos, sin = self.rotary(hidden, positions)
        rep = self.n_heads // self.n_kv
        slots = positions[0]
        decode = length == 1 and rows is None  # a one-token prompt into chosen rows is a prefill
        if decode:
            columns = self.max_cache_len if columns is None else columns
            if self.paged is not None:  # attention reads whole blocks: the mask hides the positions past a row's
                columns = self.paged.span(columns)
            key_index = self.key_index if columns == self.key_index.shape[0] else self.key_index[:columns]
            visible = key_index <= positions[:, :, None]  # (batch, 1, columns)
            mask = torch.zeros(visible.shape, dtype=torch.float32, device=hidden.device)
            mask = mask.masked_fill(~visible, float("-inf"))[:, None]  # (batch, 1, 1, L)
            if self.per_row_positions:
                write_at = positions.expand(batch, self.n_kv)  # (batch, kv heads): each row's position
                # the first `batch` rows: index grids and cache views with fixed shapes and addresses
                part = batch != self.batch_size
                row_index = self.row_index[:batch] if part else self.row_index
                head_index = self.head_index[:batch] if part else self.head_index
        elif continued is not None:
            # each row's queries sit at their own positions: a key is visible up to the query's position (the
            # columns before the row's start are its cached prompt)
            visible = (self.key_index[:continued[1]][None, None, :] <= positions[:, :, None])[:, None]
        elif offset:
            from torch.nn.attention.bias import causal_lower_right

            # the queries are the last `length` of `offset + length` keys: causal, aligned to the bottom right (flash
            # and memory-efficient kernels take it without a mask tensor; on an H100 a materialised mask cost 33 ms
            # for 1,024 queries over 2,048 keys)
            visible = causal_lower_right(length, offset + length)
        for i, layer in enumerate(self.layers):
            x = self._rms(hidden, layer["norm_in"])
            qkv = _linear(x, layer["qkv"], layer["qkv_bias"])
            q, k, v = qkv.split((self.q_size, self.kv_size, self.kv_size), dim=-1)
            q = q.view(batch, length, self.n_heads, self.head_dim).transpose(1, 2)
            k = k.view(batch, length, self.n_kv, self.head_dim).transpose(1, 2)
            v = v.view(batch, length, self.n_kv, self.head_dim).transpose(1, 2)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            if self.paged is not None:  # written through the block table; attention reads the rows' blocks
                keys, values, k, v = self._paged(i, k, v, positions, rows, offset, decode, columns, continued)
            elif decode and self.per_row_positions:
                # index_put_ on the cache itself: inductor updates it in place. (The same write through
                # a flattened view was functionalised into a copy of the whole cache, ~1 ms per step
                # at 64 rows on an H200: tools/bench/profile_decoders.py.)
                where = (row_index, head_index, write_at)
                self.keys[i].index_put_(where, k[:, :, 0])
                self.values[i].index_put_(where, v[:, :, 0])
            elif rows is not None:
                self.keys[i][rows, :, offset:offset + length] = k
                self.values[i][rows, :, offset:offset + length] = v
            else:
                self.keys[i].index_copy_(2, slots, k)
                self.values[i].index_copy_(2, slots, v)
            if decode:
                # grouped-query attention over the unrepeated KV heads: (B, kv, rep, d) x (B, kv, d, L)
                if self.paged is None:
                    keys, values = self.keys[i], self.values[i]
                    if batch != keys.shape[0] or columns != self.max_cache_len:
                        keys, values = keys[:batch, :, :columns], values[:batch, :, :columns]
                qg = q.reshape(batch, self.n_kv, rep, self.head_dim)
                if keys is None:  # paged, read by the Triton kernel through the block table
                    from .paged_attention import paged_decode_attention

                    out = paged_decode_attention(q[:, :, 0], self.paged.keys[i], self.paged.values[i],
                                                 self.paged.table[:batch], positions, self.scaling)
                    out = out.reshape(batch, 1, self.q_size)
                elif self.paged is not None:  # the gathered blocks are heads first: batch over (kv heads, rows)
                    qg = qg.transpose(0, 1)
                    scores = torch.matmul(qg, keys.transpose(2, 3)).to(torch.float32) * self.scaling
                    probs = torch.softmax(scores + mask.transpose(0, 1), dim=-1).to(q.dtype)
                    out = torch.matmul(probs, values).transpose(0, 1).reshape(batch, 1, self.q_size)
                else:
                    scores = torch.matmul(qg, keys.transpose(2, 3)).to(torch.float32) * self.scaling
                    probs = torch.softmax(scores + mask, dim=-1).to(q.dtype)
                    out = torch.matmul(probs, values).reshape(batch, 1, self.q_size)
            else:
                if offset or continued is not None:  # continued prompts: over their cached columns and themselves
                    if self.paged is None:
                        k, v = self.keys[i][rows, :, :offset + length], self.values[i][rows, :, :offset + length]
                    out = F.scaled_dot_product_attention(q, k, v, attn_mask=visible, scale=self.scaling,
                                                         enable_gqa=rep > 1)
                else:
                    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scaling,
                                                         enable_gqa=rep > 1)
                out = out.transpose(1, 2).reshape(batch, length, self.q_size)
            hidden = hidden + F.linear(out, layer["o"], layer["o_bias"])
            x = self._rms(hidden, layer["norm_post"])
            if self.unfused:
                gate, up = (F.linear(x, w, b) for w, b in zip(layer["gate_up"], layer["gate_up_bias"], strict=True))
            else:
                gate, up = F.linear(x, layer["gate_up"], layer["gate_up_bias"]).split(self.intermediate, dim=-1)
            hidden = hidden + F.linear(layer["act"](gate) * up, layer["down"], layer["down_bias"])
        if last_index is None:
            last = hidden[:, -1]
        else:
            last = hidden[torch.arange(batch, device=hidden.device), last_index]
        return F.linear(self._rms(last, self.final_norm), self.lm_head)

"""Token ids to streamed text: incremental detokenization and OpenAI `stop` strings (backend-neutral).

The server's reader thread detokenizes (never the engine's loop, never the event loop): `detokenizer_factory`
picks `StreamDetokenizer` (tokenizers' `DecodeStream`, which keeps its own offsets and decodes only the
newest tokens) where the tokenizer is fast, else `Detokenizer`. `Detokenizer` decodes a window of the newest tokens and sends only text that is complete: a token that
ends inside a multi-byte character (the decode ends in U+FFFD) waits for the next one, and the window
starts at the previous piece's tokens so tokenizers that drop a leading space at a sequence's start (SentencePiece)
still give the right spaces (the method of TGI's and vLLM's detokenizers). `StopMatcher` holds back the
tail of the text that could be the start of a stop string, so a stop string never reaches the client.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class StreamDetokenizer:
    """Incremental detokenization with tokenizers' `DecodeStream` over a Rust `tokenizers.Tokenizer`: `push(ids)`
    returns the new complete text, `flush()` what is still held at the end (as `tokenizer.decode` of the whole
    sequence gives it, an incomplete character included)."""

    def __init__(self, tokenizer: Any, *, skip_special_tokens: bool = True,
                 drop_ids: frozenset[int] | None = None) -> None:
        from tokenizers.decoders import DecodeStream

        self.tokenizer = tokenizer
        self.drop = drop_ids  # set: these ids are dropped and every other token kept (special or not)
        self.skip = skip_special_tokens and drop_ids is None
        self.stream = DecodeStream(skip_special_tokens=self.skip)
        self.ids: list[int] = []
        self.pieces: list[str] = []
        self.held = False  # tokens pushed whose text has not come out yet

    def push(self, ids: list[int] | tuple[int, ...]) -> str:
        """Text the new `ids` complete (one `DecodeStream.step` per token)."""
        out = []
        step, tokenizer, drop = self.stream.step, self.tokenizer, self.drop
        for token in ids:
            if drop is not None and token in drop:
                continue
            self.ids.append(token)
            piece = step(tokenizer, token)
            if piece is None:
                self.held = True
            else:
                self.held = False
                out.append(piece)
        text = "".join(out)
        if text:
            self.pieces.append(text)
        return text

    def flush(self) -> str:
        """The text of tokens still held (one decode of the whole sequence, only when some are)."""
        if not self.held:
            return ""
        self.held = False
        full = self.tokenizer.decode(self.ids, skip_special_tokens=self.skip)
        sent = "".join(self.pieces)
        return full[len(sent):] if full.startswith(sent) else ""


def special_ids(tokenizer: Any) -> frozenset[int]:
    """Ids a decode with `skip_special_tokens=True` drops: the tokenizer's special tokens and its added tokens
    marked special."""
    ids = set(getattr(tokenizer, "all_special_ids", ()) or ())
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    ids.update(int(i) for i, token in decoder.items() if getattr(token, "special", False))
    return frozenset(ids)


def detokenizer_factory(tokenizer: Any, skip_special_tokens: bool = True,
                        keep_ids: tuple[int, ...] = ()) -> tuple[Callable[[], Any], str]:
    """(a function making one request's detokenizer, which kind and why). A fast tokenizer whose decode adds no
    clean-up gets `StreamDetokenizer` over its own copy of the Rust tokenizer (the server encodes prompts with
    the original in another thread; a fast tokenizer is not shared across threads); else `Detokenizer`.
    `keep_ids`: special tokens kept in the text all the same (a tool-call parser's markers)."""
    drop = special_ids(tokenizer) - set(keep_ids) if keep_ids and skip_special_tokens else None
    backend = getattr(tokenizer, "backend_tokenizer", None) if getattr(tokenizer, "is_fast", False) else None
    cleanup = bool(getattr(tokenizer, "clean_up_tokenization_spaces", False))
    try:
        from tokenizers.decoders import DecodeStream  # noqa: F401 - tokenizers >= 0.21
    except ImportError:
        backend, why = None, "this tokenizers has no DecodeStream"
    else:
        why = ("its decode cleans up tokenization spaces (DecodeStream does not)" if cleanup else
               "a slow (Python) tokenizer")
    if backend is not None and not cleanup:
        from tokenizers import Tokenizer

        own = Tokenizer.from_str(backend.to_str())
        return (lambda: StreamDetokenizer(own, skip_special_tokens=skip_special_tokens, drop_ids=drop),
                "tokenizers' DecodeStream (fast tokenizer)")
    return (lambda: Detokenizer(tokenizer, skip_special_tokens=skip_special_tokens, drop_ids=drop),
            f"incremental decode of a window of tokens ({why})")


class Detokenizer:
    """Feed token ids with `push(ids)`; it returns the new, complete text (possibly '')."""

    def __init__(self, tokenizer: Any, *, skip_special_tokens: bool = True,
                 drop_ids: frozenset[int] | None = None) -> None:
        self.tokenizer = tokenizer
        self.drop = drop_ids  # set: these ids are dropped and every other token kept (special or not)
        self.skip = skip_special_tokens and drop_ids is None
        self.ids: list[int] = []
        self.prefix_offset = 0  # where the decode window starts
        self.read_offset = 0  # tokens whose text has been sent

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip) if ids else ""

    def push(self, ids: list[int] | tuple[int, ...]) -> str:
        """Text the new `ids` complete (held back while it ends in an incomplete character)."""
        drop = self.drop
        self.ids.extend(int(i) for i in ids if drop is None or int(i) not in drop)
        before = self._decode(self.ids[self.prefix_offset:self.read_offset])
        after = self._decode(self.ids[self.prefix_offset:])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
            return after[len(before):]
        return ""

    def flush(self) -> str:
        """Whatever text is still held (the end of the output, even an incomplete character)."""
        before = self._decode(self.ids[self.prefix_offset:self.read_offset])
        after = self._decode(self.ids[self.prefix_offset:])
        self.read_offset = len(self.ids)
        return after[len(before):] if len(after) > len(before) else ""


class StopMatcher:
    """Cuts the text at the first of `stops` (the stop string itself is never sent), holding back a tail that
    could still become one."""

    def __init__(self, stops: tuple[str, ...] | list[str]) -> None:
        self.stops = tuple(s for s in stops if s)
        self.pending = ""
        self.stopped = False

    def push(self, text: str) -> str:
        """Text that is safe to send now; sets `stopped` when a stop string appeared."""
        if self.stopped:
            return ""
        if not self.stops:
            return text
        self.pending += text
        hits = [(index, stop) for stop in self.stops if (index := self.pending.find(stop)) >= 0]
        if hits:
            index = min(hits)[0]
            out, self.pending, self.stopped = self.pending[:index], "", True
            return out
        keep = self._held_tail()
        out = self.pending[: len(self.pending) - keep]
        self.pending = self.pending[len(self.pending) - keep:]
        return out

    def flush(self) -> str:
        """The held tail at the end of the output (it never became a stop string)."""
        out, self.pending = ("" if self.stopped else self.pending), ""
        return out

    def _held_tail(self) -> int:
        """Length of the longest end of `pending` that is the start of a stop string."""
        longest = 0
        for stop in self.stops:
            for size in range(min(len(stop) - 1, len(self.pending)), longest, -1):
                if self.pending.endswith(stop[:size]):
                    longest = size
                    break
        return longest


class TextStream:
    """Detokenizer plus stop matcher for one request: `push(ids)` -> text to send (or `push_text(text)` with text
    the server's reader already detokenized); `stopped` once a stop string was seen (the caller then cancels the
    request and finishes with `finish_reason="stop"`)."""

    def __init__(self, tokenizer: Any, stops: tuple[str, ...] | list[str] = (),
                 drop_ids: frozenset[int] | None = None) -> None:
        self.detokenizer = Detokenizer(tokenizer, drop_ids=drop_ids)
        self.matcher = StopMatcher(stops)
        self.text = ""

    @property
    def stopped(self) -> bool:
        """Whether a stop string ended the text."""
        return self.matcher.stopped

    def push(self, ids: list[int] | tuple[int, ...]) -> str:
        """New text to send for `ids` (stop strings cut and held back)."""
        out = self.matcher.push(self.detokenizer.push(ids))
        self.text += out
        return out

    def push_text(self, text: str) -> str:
        """New text to send for already detokenized `text` (stop strings cut and held back)."""
        out = self.matcher.push(text)
        self.text += out
        return out

    def finish_text(self, tail: str = "") -> str:
        """The last text at the end of the output when the reader detokenized it (`tail`: its flushed end)."""
        out = self.matcher.push(tail) if not self.stopped else ""
        out += self.matcher.flush()
        self.text += out
        return out

    def finish(self) -> str:
        """The last text at the end of the output."""
        out = self.matcher.push(self.detokenizer.flush()) if not self.stopped else ""
        out += self.matcher.flush()
        self.text += out
        return out


#: GPT-2's byte-level alphabet reversed: the character a byte-level BPE token spells each byte with -> the byte.
def _byte_decoder() -> dict[str, int]:
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\u00a1"), ord("\u00ac") + 1)) + list(
        range(ord("\u00ae"), ord("\u00ff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=True)}


class TokenTexts:
    """Each token id's text and exact bytes (for `logprobs`), cached: a byte-level BPE token's bytes from its
    alphabet, a `<0xNN>` byte token's byte, else the UTF-8 of its decode."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
        self.byte_level = "ByteLevel" in type(decoder).__name__ or "ByteLevel" in repr(decoder)[:200]
        self.bytes_of = _byte_decoder() if self.byte_level else {}
        self.cache: dict[int, tuple[str, bytes]] = {}

    def __call__(self, token_id: int) -> tuple[str, bytes]:
        """(text, bytes) of `token_id`."""
        hit = self.cache.get(token_id)
        if hit is not None:
            return hit
        piece = self.tokenizer.convert_ids_to_tokens(int(token_id))
        data: bytes | None = None
        if isinstance(piece, str):
            if self.byte_level and all(c in self.bytes_of for c in piece):
                data = bytes(self.bytes_of[c] for c in piece)
            elif len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
                try:
                    data = bytes([int(piece[3:5], 16)])
                except ValueError:
                    data = None
        text = self.tokenizer.decode([int(token_id)])
        if data is None:
            data = text.encode("utf-8", "surrogatepass")
        self.cache[token_id] = hit = (text, data)
        return hit

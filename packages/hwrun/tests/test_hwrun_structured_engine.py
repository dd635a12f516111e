"""The grammar engine of structured output (hwrun.inference.structured), on the shipped tiny model's tokenizer:
matchers driven by seeded random tokens drawn uniformly from their own masks must end in JSON that parses and
validates against the schema, whichever engine (xgrammar, llguidance) runs; disallowed, padded and special ids are
never allowed; a schema the engines cannot enforce is refused with the keyword and where it is."""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path
from types import SimpleNamespace

import hwrun
import jsonschema
import pytest
import torch
from hwrun.errors import GenerateError, GrammarBackendError, StructuredOutputError
from hwrun.inference.structured import (
    StructuredOutput,
    allocate_bitmask,
    apply_bitmask,
    choose_backend,
    structured_compiler,
)
from hwrun.inference.structured import bitmask as bitmask_module
from hwrun.inference.structured import compiler as compiler_module
from transformers import AutoTokenizer

PADDING = 40  # the model's vocabulary is padded past the tokenizer's 3,072 ids, as many real models' are
TOOL_CALL = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "enum": ["get_weather", "search"]},
        "arguments": {"type": "object", "properties": {
            "city": {"type": "string", "pattern": "^[A-Za-z ]{1,12}$"},
            "days": {"type": "integer", "minimum": 1, "maximum": 14},
            "units": {"enum": ["metric", "imperial"]}},
            "required": ["city", "days", "units"], "additionalProperties": False},
    },
    "required": ["name", "arguments"], "additionalProperties": False,
}
NESTED = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "score": {"type": "number"},
        "ok": {"type": "boolean"},
        "kind": {"enum": ["a", "b", None]},
        "tags": {"type": "array", "items": {"type": "string", "pattern": "^[a-z]{1,6}$"}, "maxItems": 3},
        "points": {"type": "array", "minItems": 1, "maxItems": 2, "items": {
            "type": "object", "properties": {"x": {"type": "integer", "minimum": -5, "maximum": 5},
                                             "label": {"anyOf": [{"type": "string", "format": "date"},
                                                                 {"type": "null"}]}},
            "required": ["x", "label"], "additionalProperties": False}},
        "ref": {"$ref": "#/$defs/pair"},
    },
    "required": ["id", "score", "ok", "kind", "tags", "points", "ref"], "additionalProperties": False,
    "$defs": {"pair": {"type": "array", "prefixItems": [{"type": "integer"}, {"const": "x"}], "items": False,
                       "minItems": 2}},
}

KEYWORDS = {  # the keywords both engines enforce, each once
    "type": "object",
    "properties": {
        "int": {"type": "integer", "exclusiveMinimum": 3, "exclusiveMaximum": 9},
        "seven": {"type": "integer", "multipleOf": 7},
        "num": {"type": "number", "minimum": -1.5, "maximum": 2.25},
        "maybe": {"type": ["integer", "null"]},
        "const": {"const": {"a": [1, 2]}},
        "mixed": {"enum": [1, "x", None, True]},
        "when": {"type": "string", "format": "date-time"},
        "uuid": {"type": "string", "format": "uuid"},
        "flags": {"type": "array", "items": {"type": "boolean"}, "minItems": 2, "maxItems": 3},
        "counts": {"type": "object", "additionalProperties": {"type": "integer"}, "maxProperties": 2},
        "tree": {"$ref": "#/$defs/node"},
    },
    "required": ["int", "seven", "num", "maybe", "const", "mixed", "when", "uuid", "flags", "tree"],
    "additionalProperties": False,
    "$defs": {"node": {"type": "object", "properties": {"kids": {"type": "array", "maxItems": 2,
                                                                 "items": {"$ref": "#/$defs/node"}}},
                       "required": ["kids"], "additionalProperties": False}},
}


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(hwrun.DEFAULT_MODEL)


@pytest.fixture(scope="module")
def texts(tokenizer):
    return [tokenizer.decode([i]) for i in range(len(tokenizer))]


@pytest.fixture(scope="module", params=["xgrammar", "llguidance"])
def compiler(request, tokenizer):
    pytest.importorskip(request.param)
    return structured_compiler(tokenizer, len(tokenizer) + PADDING, backend=request.param)


def allowed_ids(row: torch.Tensor, vocab_size: int) -> list[int]:
    bits = (row.unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1
    return bits.flatten()[:vocab_size].nonzero().flatten().tolist()


def drive(matcher, texts, seed: int, budget: int = 120, limit: int = 1500) -> list[int]:
    """Sample uniformly among the allowed ids until the grammar is finished; past `budget` tokens, prefer tokens that
    close a string, array or object (uniform sampling alone can nest and wander for thousands of tokens)."""
    rng = random.Random(seed)
    bitmask = allocate_bitmask(1, matcher.vocab.vocab_size)
    tokens: list[int] = []
    for step in range(limit):
        matcher.fill(bitmask, 0)
        allowed = allowed_ids(bitmask[0], matcher.vocab.vocab_size)
        assert allowed, f"nothing allowed after {tokens}"
        if step >= budget:
            solid = [i for i in allowed if i >= len(texts) or texts[i].strip()]
            closing = [i for i in solid if i < len(texts) and set(texts[i].strip()) <= set('"}]')]
            allowed = closing or solid or allowed
        token = rng.choice(allowed)
        assert matcher.accept(token), f"a token from the mask was rejected: {token} after {tokens}"
        if token in matcher.stop_token_ids:
            break
        tokens.append(token)
        if matcher.finished:
            break
    assert matcher.finished, f"not finished after {limit} tokens"
    return tokens


@pytest.mark.parametrize("schema", [None, TOOL_CALL, NESTED, KEYWORDS], ids=["json_object", "tool_call", "nested",
                                                                              "keywords"])
def test_random_allowed_tokens_give_valid_json(compiler, tokenizer, texts, schema):
    spec = StructuredOutput("json_object") if schema is None else StructuredOutput.json_schema(schema)
    for seed in range(12):
        text = tokenizer.decode(drive(compiler.matcher(spec), texts, seed))
        value = json.loads(text)
        assert isinstance(value, dict), text
        if schema is not None:
            jsonschema.validate(value, schema)  # formats are annotations here: the engines check their syntax only


@pytest.fixture(scope="module")
def byte_fallback_tokenizer():
    """A Llama-2 / Mistral-style tokenizer (SentencePiece BPE: "▁" for spaces, <0xNN> byte tokens), trained here on
    the shipped text: the grammar engines read this vocabulary differently from a byte-level one."""
    from tokenizers import Tokenizer, decoders, models, normalizers, trainers
    from transformers import PreTrainedTokenizerFast

    text = (Path(hwrun.DEFAULT_MODEL) / "sample_train.txt").read_text()
    trained = Tokenizer(models.BPE())
    trained.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    trained.train_from_iterator([text], trainers.BpeTrainer(vocab_size=600, show_progress=False))
    learned = json.loads(trained.to_str())["model"]
    # as SentencePiece models convert: <unk> <s> </s>, the 256 byte tokens, then the learned pieces (normal tokens)
    pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)]
    pieces += sorted(learned["vocab"], key=learned["vocab"].get)
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in learned["merges"]]
    tokenizer = Tokenizer(models.BPE({piece: i for i, piece in enumerate(pieces)}, merges, unk_token="<unk>",
                                     byte_fallback=True, fuse_unk=True))
    tokenizer.normalizer = trained.normalizer
    tokenizer.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                           decoders.Strip(" ", 1, 0)])
    tokenizer.add_special_tokens(["<unk>", "<s>", "</s>"])
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance"])
def test_a_byte_fallback_tokenizer_gives_valid_json_too(byte_fallback_tokenizer, backend):
    pytest.importorskip(backend)
    tokenizer = byte_fallback_tokenizer
    assert "<0xE2>" in tokenizer.tokenize("€") and tokenizer.decode(tokenizer.encode("€ {", add_special_tokens=False)) == "€ {"
    compiler = structured_compiler(tokenizer, len(tokenizer) + 4, backend=backend)
    texts = [tokenizer.decode([i]) for i in range(len(tokenizer))]
    for seed in range(4):
        value = json.loads(tokenizer.decode(drive(compiler.matcher(StructuredOutput.json_schema(TOOL_CALL)), texts,
                                                  seed)))
        jsonschema.validate(value, TOOL_CALL)


def test_padded_and_special_ids_are_never_allowed(compiler, tokenizer, texts):
    matcher = compiler.matcher(StructuredOutput("json_object"))
    for token in tokenizer.encode('{"key": "', add_special_tokens=False):
        assert matcher.accept(token)
    bitmask = allocate_bitmask(2, compiler.vocab.vocab_size)
    matcher.fill(bitmask, 1)
    allowed = set(allowed_ids(bitmask[1], compiler.vocab.vocab_size))
    assert len(allowed) > 1000  # inside a string nearly every token fits
    assert max(allowed) < len(tokenizer), "a padded id past the tokenizer's vocabulary was allowed"
    assert not allowed & set(tokenizer.all_special_ids), "a special token was allowed inside a string"
    assert allowed_ids(bitmask[0], compiler.vocab.vocab_size) == list(range(compiler.vocab.vocab_size))  # row 0 kept


def test_disallowed_token_is_rejected_and_the_matcher_then_allows_only_stop(compiler, tokenizer):
    matcher = compiler.matcher(StructuredOutput.json_schema(TOOL_CALL))
    bitmask = allocate_bitmask(1, compiler.vocab.vocab_size)
    matcher.fill(bitmask, 0)
    assert tokenizer.decode(allowed_ids(bitmask[0], compiler.vocab.vocab_size)).strip() == "{"
    assert not matcher.accept(tokenizer.convert_tokens_to_ids("}"))
    assert matcher.failed and not matcher.finished
    assert not matcher.accept(tokenizer.convert_tokens_to_ids("{"))  # never moves again
    matcher.fill(bitmask, 0)
    assert allowed_ids(bitmask[0], compiler.vocab.vocab_size) == [tokenizer.eos_token_id]
    assert not compiler.matcher(StructuredOutput("json_object")).accept(compiler.vocab.vocab_size + 5)


def test_finished_once_the_object_closes_and_eos_is_allowed(compiler, tokenizer):
    matcher = compiler.matcher(StructuredOutput.json_schema({"type": "object", "properties": {"n": {"type": "integer"}},
                                                             "required": ["n"], "additionalProperties": False}))
    bitmask = allocate_bitmask(1, compiler.vocab.vocab_size)
    for token in tokenizer.encode('{"n": 12', add_special_tokens=False):
        assert matcher.accept(token) and not matcher.finished
    matcher.fill(bitmask, 0)
    assert tokenizer.eos_token_id not in allowed_ids(bitmask[0], compiler.vocab.vocab_size)
    assert matcher.accept(tokenizer.convert_tokens_to_ids("}")) and matcher.finished
    matcher.fill(bitmask, 0)
    assert allowed_ids(bitmask[0], compiler.vocab.vocab_size) == [tokenizer.eos_token_id]
    assert compiler.stop_token_ids == (tokenizer.eos_token_id,)


def test_a_top_level_number_is_not_finished_while_digits_may_follow(compiler, tokenizer):
    matcher = compiler.matcher(StructuredOutput.json_schema({"type": "integer"}))
    assert matcher.accept(tokenizer.convert_tokens_to_ids("4"))
    assert not matcher.finished  # "4" is complete but "42" may follow: the model chooses, eos is allowed
    assert matcher.accept(tokenizer.eos_token_id) and matcher.finished


@pytest.mark.parametrize(("schema", "words"), [
    ({"type": "object", "properties": {"a": {"type": "array", "uniqueItems": True}}}, ["'uniqueItems'", "#/properties/a"]),
    ({"type": "object", "properties": {"a": {"not": {"type": "string"}}}}, ["'not'", "#/properties/a"]),
    ({"type": "object", "if": {"required": ["a"]}, "then": {"required": ["b"]}}, ["'if'", "at #"]),
    ({"type": "object", "properties": {"a": {"type": "string", "pattern": "^(?=x)x+$"}}}, ["look-around", "^(?=x)x+$"]),
    ({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}, ["missing"]),
    ({"type": "object", "properties": {"a": {"type": "bogus"}}}, ["bogus"]),
    ({"type": "object", "properties": {"a": {"items": 5}}}, ["#/properties/a/items", "not int"]),
    ({"type": "object", "required": ["a"], "additionalProperties": False}, ["['a'] are not in properties"]),
])
def test_schemas_that_cannot_be_enforced_are_refused_with_the_problem(compiler, schema, words):
    with pytest.raises(StructuredOutputError) as caught:
        compiler.matcher(StructuredOutput.json_schema(schema))
    assert all(word in str(caught.value) for word in words), str(caught.value)
    assert isinstance(caught.value, GenerateError) and isinstance(caught.value, ValueError)


def test_batch_fill_equals_filling_row_by_row(compiler, tokenizer, texts):
    specs = [StructuredOutput("json_object"), StructuredOutput.json_schema(TOOL_CALL), StructuredOutput.json_schema(NESTED)]
    matchers = [compiler.matcher(specs[i % 3]) for i in range(7)]
    rng = random.Random(0)
    one = allocate_bitmask(1, compiler.vocab.vocab_size)
    for index, matcher in enumerate(matchers):  # each at its own point of its grammar
        for _ in range(index * 5):
            matcher.fill(one, 0)
            matcher.accept(rng.choice(allowed_ids(one[0], compiler.vocab.vocab_size)))
    assert not matchers[3].accept(tokenizer.eos_token_id if not matchers[3].finished else 0)  # a failed one
    rows = [(9 - index, matcher) for index, matcher in enumerate(matchers)]  # rows 3..9; 0..2 unconstrained
    together = allocate_bitmask(10, compiler.vocab.vocab_size)
    compiler.fill(together, rows)
    apart = allocate_bitmask(10, compiler.vocab.vocab_size)
    for row, matcher in rows:
        matcher.fill(apart, row)
    assert torch.equal(together, apart)
    assert (together[:3] == -1).all()
    other = structured_compiler(tokenizer, compiler.vocab.vocab_size, backend=compiler.backend)
    with pytest.raises(StructuredOutputError, match="made by another compiler"):
        other.fill(together, rows[:1])


def test_compiled_grammars_are_cached_per_spec(compiler):
    spec = StructuredOutput.json_schema(TOOL_CALL)
    first = compiler.compiled(spec)
    assert compiler.compiled(StructuredOutput.json_schema(json.dumps(TOOL_CALL))) is first
    assert compiler.compiled(StructuredOutput("json_object")) is not first
    one, two = compiler.matcher(spec), compiler.matcher(spec)
    assert one.accept(one.stop_token_ids[0]) is False and one.failed  # eos is not allowed first
    assert not two.failed  # each request has its own state


@pytest.mark.parametrize(("subschema", "words"), [
    ({"type": "string", "maxLength": 10}, "maxLength: raw control characters"),
    ({"allOf": [{"type": "integer"}, {"minimum": 2}]}, "allOf with several subschemas"),
    ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, "treats oneOf as anyOf"),
    ({"type": "number", "multipleOf": 0.5}, "multipleOf only as an integer multiple"),
])
def test_xgrammar_refuses_what_it_would_not_enforce(tokenizer, subschema, words):
    """Each of these compiled in xgrammar 0.2.9 and let random allowed tokens build JSON the schema rejects."""
    pytest.importorskip("xgrammar")
    compiler = structured_compiler(tokenizer, len(tokenizer), backend="xgrammar")
    schema = {"type": "object", "properties": {"v": subschema}, "required": ["v"]}
    with pytest.raises(StructuredOutputError, match=words.split(":")[0]) as caught:
        compiler.matcher(StructuredOutput.json_schema(schema))
    assert "#/properties/v" in str(caught.value) and "use backend llguidance" in str(caught.value)
    assert words.split(": ")[-1] in str(caught.value)


def test_backend_choice_and_its_errors(monkeypatch, caplog, tokenizer):
    with pytest.raises(StructuredOutputError, match="backend='outlines' is not one of auto, xgrammar, llguidance"):
        choose_backend("outlines")
    first, second = compiler_module.AUTO_ORDER
    installed = {first: False, second: True}
    monkeypatch.setattr(compiler_module, "_installed", lambda name: installed[name])
    with caplog.at_level(logging.WARNING, logger=compiler_module.__name__):
        assert choose_backend("auto")[0] == second
    assert f"{first} (auto's first choice) is not installed" in caplog.text
    with pytest.raises(GrammarBackendError, match=rf"'{first}' is not installed: pip install 'hwrun\[structured\]'"):
        choose_backend(first)
    installed[second] = False
    with pytest.raises(GrammarBackendError, match=r"pip install 'hwrun\[structured\]'"):
        structured_compiler(tokenizer, len(tokenizer))


def test_bad_vocabulary_and_stop_ids_are_refused(tokenizer):
    with pytest.raises(GenerateError, match="vocab_size=0 must be an integer >= 1"):
        structured_compiler(tokenizer, 0)
    with pytest.raises(GenerateError, match="beyond the model's vocab_size=100"):
        structured_compiler(tokenizer, 100)
    with pytest.raises(GenerateError, match=r"stop_token_ids \[99999\] are not ids"):
        structured_compiler(tokenizer, len(tokenizer), stop_token_ids=[99999])


@pytest.mark.parametrize("form", ["cpu kernel", "little-endian", "big-endian"])
def test_apply_bitmask_matches_the_bit_layout(monkeypatch, form):
    """Every form against the layout bit by bit: xgrammar's CPU kernel, and plain torch (a byte table on little-endian
    hosts, shifted words otherwise), which accelerators run."""
    if form == "cpu kernel":
        pytest.importorskip("xgrammar")
    else:
        monkeypatch.setattr(bitmask_module, "_CPU_KERNEL", [None])
        monkeypatch.setattr(bitmask_module, "sys", SimpleNamespace(byteorder=form.split("-")[0]))
    generator = torch.Generator().manual_seed(0)
    for vocab in (1, 8, 31, 32, 33, 100, 3112):  # xgrammar's CPU kernel is wrong up to 8: the torch form runs there
        logits = torch.randn(3, vocab, generator=generator)
        bitmask = torch.randint(-(2**31), 2**31 - 1, (3, (vocab + 31) // 32), dtype=torch.int32, generator=generator)
        bitmask[1] = -1  # an unconstrained row masks nothing
        expected = logits.clone()
        for row in range(3):
            for token in range(vocab):
                if not (int(bitmask[row, token // 32]) >> (token % 32)) & 1:
                    expected[row, token] = float("-inf")
        assert apply_bitmask(logits, bitmask) is logits
        assert torch.equal(logits, expected)
        assert torch.isfinite(logits[1]).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
def test_apply_bitmask_keeps_the_dtype_and_refuses_a_mask_that_does_not_fit(dtype):
    logits = torch.zeros(2, 40, dtype=dtype)
    bitmask = allocate_bitmask(2, 40)
    bitmask[0, 1] = 0  # tokens 32..39 of row 0
    apply_bitmask(logits, bitmask)
    assert logits.dtype == dtype and torch.isinf(logits[0, 32:]).all() and torch.isfinite(logits[0, :32]).all()
    assert torch.isfinite(logits[1]).all()
    with pytest.raises(GenerateError, match=r"must be \[2, 2\]"):
        apply_bitmask(logits, allocate_bitmask(2, 100))
    with pytest.raises(GenerateError, match="int32 bitmask"):
        apply_bitmask(logits, bitmask.to(torch.int64))
    with pytest.raises(GenerateError, match="rows=0 must be an integer >= 1"):
        allocate_bitmask(0, 40)


def test_a_json_schema_keeps_its_property_order():
    """The engines emit properties in schema order: a tool call's "name" must come before its "arguments"."""
    from hwrun.inference.structured import StructuredOutput

    spec = StructuredOutput.json_schema({"type": "object", "properties": {"name": {}, "arguments": {}}})
    assert list(spec.schema_dict()["properties"]) == ["name", "arguments"]
    assert spec == StructuredOutput.json_schema(spec.schema)  # the string form round-trips to the same spec


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance"])
def test_no_free_whitespace_so_a_bounded_schema_gives_bounded_output(backend):
    """Only the separators ", " and ": ": a model cannot write whitespace until its budget ends."""
    from hwrun.inference.structured import StructuredOutput, allocate_bitmask, structured_compiler
    from hwrun.model.source import DEFAULT_MODEL
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(DEFAULT_MODEL)
    compiler = structured_compiler(tokenizer, len(tokenizer), backend=backend)
    matcher = compiler.matcher(StructuredOutput.json_schema(
        {"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"], "additionalProperties": False}))
    bitmask = allocate_bitmask(1, len(tokenizer))
    for text in ('{"a": ', "true}"):
        for token in tokenizer.encode(text, add_special_tokens=False):
            assert matcher.accept(token), text
        if text.endswith(" "):  # after ": " the value must come: no space, newline or tab is allowed
            matcher.fill(bitmask, 0)
            for blank in (" ", "\n", "\t"):
                for token in tokenizer.encode(blank, add_special_tokens=False):
                    assert not (int(bitmask[0, token // 32]) >> (token % 32)) & 1, (blank, token)
    assert matcher.finished

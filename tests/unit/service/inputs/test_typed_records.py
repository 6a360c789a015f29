"""JSONL records decoded into their format's shape (typed_records.py): whatever the typed
decoder returns is exactly what the general path (msgspec or json.loads, then records.py's
parser) returns for the line, and it refuses every line the parser would skip, so skips keep
their reason and detail; the common shapes are taken."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packfeed.service.inputs import read, typed_records
from packfeed.service.inputs.read import Piece, WindowSpec, read_window
from packfeed.service.inputs.records import RECORD_PARSERS, InvalidRecord
from packfeed.service.inputs.typed_records import TYPED_DECODERS

FORMATS = sorted(RECORD_PARSERS)


def general(fmt: str, line: bytes):
    """("ok", type, record) or ("skip", reason, detail) by the general path."""
    try:
        record = read._parse_jsonl_line(line, RECORD_PARSERS[fmt], bom=False)
    except InvalidRecord as bad:
        return "skip", bad.reason, bad.detail
    return "ok", type(record), record


def typed(fmt: str, line: bytes):
    record = TYPED_DECODERS[fmt](line)
    return None if record is None else ("ok", type(record), record)


def same_where_taken(fmt: str, line: bytes) -> bool:
    """The typed decoder refused the line, or gave the general path's record; True if taken."""
    got = typed(fmt, line)
    if got is not None:
        assert got == general(fmt, line), line
    return got is not None


# ---- values a field may hold: the shapes the typed decoders take and their near misses ----------
strings = st.sampled_from(["hi", "", "  ", "\n\t", "Q: hi A: yes", "Q: hi A: no", "héllo ✓", "a" * 40, "\u3000"])
roles = st.sampled_from(["system", "user", "assistant", "tool", "bob", "", "USER"])
json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.floats(allow_nan=False), strings)
message = st.one_of(
    st.fixed_dictionaries({"role": roles, "content": strings}),
    st.fixed_dictionaries({"content": strings, "role": roles}),  # keys in the other order
    st.fixed_dictionaries({"role": roles, "content": strings}, optional={"name": json_scalars, "x": strings}),
    st.fixed_dictionaries({"role": roles}, optional={"content": json_scalars,
                                                     "tool_calls": st.just([{"type": "function"}])}),
    st.fixed_dictionaries({"role": roles, "content": st.lists(st.fixed_dictionaries(
        {"type": st.sampled_from(["text", "image"]), "text": strings}), max_size=2)}),
    json_scalars,
)
messages = st.lists(message, max_size=4)
field_value = st.one_of(json_scalars, messages, st.just([]), st.just({"a": 1}))
tools = st.one_of(st.none(), st.just([{"name": "f"}]), st.just("[]"), st.just("x"), st.integers(0, 1))
junk = st.recursive(json_scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                          st.dictionaries(st.text(max_size=3), inner, max_size=3)),
                    max_leaves=6)


good_message = st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant", "tool"]),
                                      "content": strings})
SHAPES = {  # each format's fields as the typed decoders take them
    "text": ["text"], "messages": ["messages"], "prompt_completion": ["prompt", "completion"],
    "preference": ["prompt", "chosen", "rejected"], "implicit preference": ["chosen", "rejected"],
}
FIELDS = ["text", "messages", "prompt", "completion", "chosen", "rejected"]


@st.composite
def records(draw) -> bytes:
    """One JSONL line: a format's shape with likely values, then a few changes (a field
    removed, added or given another value or type, tools, other fields, a duplicate key),
    ASCII-escaped or not, compact or not."""
    obj = {}
    for name in SHAPES[draw(st.sampled_from(sorted(SHAPES)))]:
        obj[name] = draw(st.lists(good_message, min_size=1, max_size=3) if name == "messages" else strings)
    for _ in range(draw(st.integers(0, 2))):
        name = draw(st.sampled_from(FIELDS))
        change = draw(st.sampled_from(["remove", "string", "messages", "other"]))
        if change == "remove":
            obj.pop(name, None)
        else:
            obj[name] = draw(strings if change == "string" else messages if change == "messages" else field_value)
    if draw(st.booleans()):
        obj["tools"] = draw(tools)
    obj.update(draw(st.dictionaries(st.sampled_from(["id", "meta", "score"]), junk, max_size=2)))
    if draw(st.booleans()) and obj:  # a duplicate key: the last wins
        key = draw(st.sampled_from(sorted(obj)))
        return (json.dumps(obj)[:-1] + ", " + json.dumps(key) + ": " + json.dumps(draw(field_value)) + "}").encode()
    return json.dumps(obj, ensure_ascii=draw(st.booleans()),
                      separators=(",", ":") if draw(st.booleans()) else None).encode()


@pytest.mark.parametrize("fmt", FORMATS)
@settings(max_examples=400, deadline=None)
@given(line=records())
def test_a_typed_record_is_the_general_paths_record(fmt, line):
    same_where_taken(fmt, line)


def test_the_sweep_is_not_vacuous():
    """Each format's typed decoder takes some of the sweep's lines and refuses others."""
    taken = {fmt: set() for fmt in FORMATS}

    @settings(max_examples=300, deadline=None, database=None)
    @given(line=records())
    def sweep(line):
        for fmt in FORMATS:
            taken[fmt].add(same_where_taken(fmt, line))

    sweep()
    assert all(seen == {True, False} for seen in taken.values()), taken


COMMON = [
    ("text", b'{"text": "def f():\\n    return 1\\n", "id": 7}'),
    ("messages", b'{"messages": [{"role": "system", "content": ""}, {"role": "user", "content": "hi"}, '
                 b'{"role": "assistant", "content": "hello"}]}'),
    ("messages", '{"messages": [{"content": "héllo", "role": "user", "name": "x"}], "tools": null}'.encode()),
    ("prompt_completion", b'{"prompt": "", "completion": " 4", "meta": {"a": [1, 2.5, null]}}'),
    ("preference", b'{"prompt": "Q?", "chosen": " yes", "rejected": " no"}'),
    ("preference", b'{"chosen": "Q: hi A: yes", "rejected": "Q: hi A: no"}'),  # the prompt extracted
]


@pytest.mark.parametrize("fmt,line", COMMON, ids=[f"{f}-{i}" for i, (f, _) in enumerate(COMMON)])
def test_the_common_shapes_are_taken(fmt, line):
    assert same_where_taken(fmt, line)
    assert same_where_taken("auto", line)


NEAR_MISSES = [
    b'{"text": "  \\n"}',  # blank: empty_field
    b'{"text": null, "prompt": "a"}',
    b'{"text": "a", "x": "\xff"}',  # an ignored field that is not UTF-8: invalid_utf8
    b'{"text": "a", "x": "\xed\xa0\x80"}',  # an encoded surrogate: invalid_utf8
    b'{"text": "a", "x": NaN}',  # json.loads takes it
    b'{"text": "a", "x": "\\ud800"}',  # a lone surrogate escape: json.loads takes it
    b'{"text": "a", "x": ' + b"[" * 5000 + b"]" * 5000 + b"}",  # past msgspec's depth limit
    b'\xef\xbb\xbf{"text": "a"}',
    b'{"messages": []}', b'{"messages": [{"role": "bob", "content": "a"}]}',
    b'{"messages": [{"role": "user", "content": null}]}',
    b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]}]}',
    b'{"messages": [{"role": "user", "content": "a"}], "tools": [{"name": "f"}]}',
    b'{"prompt": "a", "completion": " "}', b'{"prompt": [], "completion": []}',
    b'{"chosen": "same", "rejected": "same"}',  # nothing left after the shared prompt
    b'{"chosen": "a"}', b'{"text": "a", "text": "  "}',
]


@pytest.mark.parametrize("line", NEAR_MISSES, ids=range(len(NEAR_MISSES)))
@pytest.mark.parametrize("fmt", FORMATS)
def test_a_near_miss_is_refused_or_the_same(fmt, line):
    same_where_taken(fmt, line)


@pytest.mark.parametrize("line", NEAR_MISSES[2:4])
def test_an_ignored_field_that_is_not_utf8_is_left_to_the_general_path(line):
    assert typed("text", line) is None and general("text", line)[:2] == ("skip", "invalid_utf8")


def _comparable(record):
    """A record's type and its value as JSON (dict key order kept)."""
    return type(record), json.dumps(record)


def test_a_window_reads_the_same_records_and_skips_either_way(tmp_path, monkeypatch):
    """read_window over a real file of good and bad lines of every format: the same records
    (types and values) and the same skips with the typed decoders as with none."""
    lines = [line for _, line in COMMON] + NEAR_MISSES + [b"", b"not json", b"[1]", b'{"x": 1}']
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    for fmt in FORMATS:
        piece = Piece(path=str(path), kind="jsonl", format=fmt, source=0, start_row=0, num_rows=len(lines),
                      first_sample_id=100)
        spec = WindowSpec(index=0, epoch=0, pieces=(piece,))
        with_typed = read_window(spec)
        with monkeypatch.context() as m:
            m.setattr(read, "TYPED_DECODERS", {f: (lambda line: None) for f in FORMATS})
            general_only = read_window(spec)
        assert [_comparable(r) for r in with_typed.records] == [_comparable(r) for r in general_only.records]
        assert with_typed.sample_ids.tolist() == general_only.sample_ids.tolist()
        assert with_typed.skips == general_only.skips
        assert with_typed.skips and with_typed.records  # both kinds present: not vacuous


def test_typed_records_names_what_it_decodes():
    assert set(typed_records.TYPED_DECODERS) == set(RECORD_PARSERS)


def test_a_piece_the_typed_decode_mostly_refuses_stops_trying_it(tmp_path, monkeypatch):
    """Chats that are not ASCII with an id field beside them (refused, see the module doc):
    after its first TYPED_TRIAL lines the piece reads the general way alone, the same records;
    a piece of lines it takes keeps taking them."""
    refused = [json.dumps({"id": i, "messages": [{"role": "user", "content": f"héllo {i}"}]}, ensure_ascii=False)
               for i in range(5 * read.TYPED_TRIAL)]
    taken = [json.dumps({"messages": [{"role": "user", "content": f"héllo {i}"}]}, ensure_ascii=False)
             for i in range(5 * read.TYPED_TRIAL)]
    for lines, tries in ((refused, read.TYPED_TRIAL), (taken, len(taken))):
        path = tmp_path / "chats.jsonl"
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        piece = Piece(path=str(path), kind="jsonl", format="auto", source=0, start_row=0, num_rows=len(lines),
                      first_sample_id=0)
        calls = []

        def counted(line, decode=TYPED_DECODERS["auto"]):
            calls.append(line)
            return decode(line)

        monkeypatch.setattr(read, "TYPED_DECODERS", {**TYPED_DECODERS, "auto": counted})
        got = read_window(WindowSpec(index=0, epoch=0, pieces=(piece,)))
        assert len(calls) == tries
        assert [r.messages for r in got.records] == [json.loads(line)["messages"] for line in lines]

"""A JSONL line decoded by msgspec (read.py's fast path) gives exactly what json.loads gives:
the same record, or the same skip with the same reason and detail."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packfeed.service.inputs import read
from packfeed.service.inputs.records import InvalidRecord


def fields(get) -> dict:
    """The record parser that keeps the whole object (read.py hands it the line's fields)."""
    return {k: get(k) for k in get.keys()}


def outcome(decode, line: bytes, *, bom: bool = False):
    """("ok", object) or ("skip", reason, detail), with NaN made comparable."""
    try:
        return "ok", _comparable(decode(line, bom))
    except InvalidRecord as bad:
        return "skip", bad.reason, bad.detail


def fast(line: bytes, bom: bool):
    return read._parse_jsonl_line(line, fields, bom=bom)


def reference(line: bytes, bom: bool):
    return read._json_object(line, bom=bom)


def _comparable(value):
    """Values with their types (1 and 1.0 and True differ), NaN equal to itself."""
    if isinstance(value, dict):
        return ("dict", [(k, _comparable(v)) for k, v in value.items()])
    if isinstance(value, list):
        return ("list", [_comparable(v) for v in value])
    if isinstance(value, float) and math.isnan(value):
        return ("float", "nan")
    if isinstance(value, float):
        return ("float", value.hex() if math.isfinite(value) else repr(value))
    return (type(value).__name__, value)


TRICKY = [
    b'{"text": "hi"}\n',
    b'{"text": "hi"}',  # the last line of a file, no newline
    b'  {"text": "hi"}  \r\n',
    b'{"a": 1, "a": 2}\n',  # duplicate keys: the last wins
    b'{"a": NaN}\n', b'{"a": Infinity, "b": -Infinity}\n',  # json.loads accepts them
    b'{"a": 1e400}\n', b'{"a": -1e400}\n', b'{"a": 1.5e-400}\n', b'{"a": -0.0}\n', b'{"a": -0}\n',
    b'{"a": 123456789012345678901234567890}\n', b'{"a": -9223372036854775809}\n', b'{"a": 18446744073709551616}\n',
    b'{"a": 0.1, "b": 1E5, "c": 2.5e-3, "d": 1.7976931348623157e308}\n',
    b'{"a": "\\ud800"}\n', b'{"a": "\\udc00x"}\n', b'{"a": "\\ud83d\\ude00"}\n',  # lone and paired surrogates
    b'{"a": "\\u00e9\\n\\t\\"\\\\/\\b\\f\\r"}\n', '{"a": "héllo ✓ 😀"}\n'.encode(),
    b'{"a": "x\x01"}\n', b'{"a": "x\x7f"}\n',  # a control character in a string; DEL is not one
    b'{"a": "\xed\xa0\x80"}\n', b'{"a": "\xff"}\n', b'{"a": "\xc3"}\n',  # not UTF-8
    b'\xef\xbb\xbf{"a": 1}\n',  # a byte order mark (not at the start of the file)
    b'', b'\n', b'   \t\r\n', b'{"a": 1} {"b": 2}\n', b'{"a": 1,}\n', b'{a: 1}\n', b"{'a': 1}\n",
    b'[1, 2]\n', b'"text"\n', b'3\n', b'null\n', b'true\n', b'{}\n',
    b'{"a": ' + b'[' * 300 + b']' * 300 + b'}\n',  # nested deep
    b'{"a": ' + b'[' * 5000 + b']' * 5000 + b'}\n',  # past both decoders' depth limits
    b'{"a": {"b": [true, false, null, {"c": []}]}}\n',
    b'{"a": 01}\n', b'{"a": .5}\n', b'{"a": 1.}\n', b'{"a": +1}\n', b'{"a": 0x10}\n',
    b'{"\\u0000": "\\u0000"}\n',
]


@pytest.mark.parametrize("line", TRICKY, ids=range(len(TRICKY)))
def test_a_tricky_line_decodes_as_json_loads_decodes_it(line):
    assert outcome(fast, line) == outcome(reference, line)


def test_msgspec_decodes_plain_lines_and_json_loads_only_what_it_refuses(monkeypatch):
    judged, judge = [], read._json_object
    monkeypatch.setattr(read, "_json_object", lambda line, bom: judged.append(line) or judge(line, bom=bom))
    plain = [b'{"text": "hi"}\n', '{"messages": [{"role": "user", "content": "é ✓"}]}\n'.encode(),
             b'{"a": 123456789012345678901234567890}\n']
    for line in plain:
        fast(line, False)
    assert judged == []
    for line in (b'{"a": NaN}\n', b'{"a": "\\ud800"}\n', b'[1]\n', b'\n'):
        outcome(fast, line)
    assert len(judged) == 4


def test_the_first_line_of_a_file_may_start_with_a_byte_order_mark():
    line = b'\xef\xbb\xbf{"text": "hi"}\n'
    assert outcome(fast, line, bom=True) == ("ok", _comparable({"text": "hi"}))
    assert outcome(fast, line, bom=False) == outcome(reference, line, bom=False)
    assert outcome(fast, line)[0] == "skip"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(obj=st.dictionaries(st.text(max_size=8), json_values, max_size=6), ascii_only=st.booleans(),
       compact=st.booleans())
def test_any_object_decodes_as_json_loads_decodes_it(obj, ascii_only, compact):
    line = json.dumps(obj, ensure_ascii=ascii_only, separators=(",", ":") if compact else None)
    raw = line.encode("utf-8", "surrogatepass") + b"\n"
    assert outcome(fast, raw) == outcome(reference, raw)

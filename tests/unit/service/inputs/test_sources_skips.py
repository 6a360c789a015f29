"""Readers on bad input: every skip reason reported once (JSONL and columnar rows), a corrupt
row group or a missing column costing its own rows only, strict mode naming file, row and
line, and the format of each row detected or asked for. The writers and ``read_all`` are
test_sources.py's."""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from packfeed.service.inputs.read import read_window
from packfeed.service.inputs.records import SKIP_REASONS, BadSampleError, Conversation, PromptCompletion
from packfeed.service.storage import StorageError

from support.inputs import plan_windows
from test_sources import CHAT, read_all, write_columnar, write_jsonl


# ---- skip reasons ----------------------------------------------------------------------------
GOOD = {
    "text": {"text": "fine"},
    "prompt_completion": {"prompt": "p", "completion": "c"},
    "messages": {"messages": CHAT},
}
BAD_ROWS = [
    pytest.param("text", b"", "blank_line", id="blank"),
    pytest.param("text", b"  \t ", "blank_line", id="whitespace-line"),
    pytest.param("text", b'{"text": "caf\xe9"}', "invalid_utf8", id="invalid-utf8"),
    pytest.param("text", b'{"text": "unterminated', "malformed_json", id="malformed"),
    pytest.param("text", b"[1, 2]", "not_an_object", id="array"),
    pytest.param("text", b'"just a string"', "not_an_object", id="string"),
    pytest.param("text", {"body": "x"}, "missing_field", id="text-missing"),
    pytest.param("text", {"text": None}, "empty_field", id="text-null"),
    pytest.param("text", {"text": " \n"}, "empty_field", id="text-blank"),
    pytest.param("text", {"text": 3}, "wrong_type", id="text-int"),
    pytest.param("prompt_completion", {"prompt": "p"}, "missing_field", id="completion-missing"),
    pytest.param("prompt_completion", {"prompt": "p", "completion": ""}, "empty_field", id="completion-empty"),
    pytest.param("prompt_completion", {"prompt": None, "completion": "c"}, "empty_field", id="prompt-null"),
    pytest.param("prompt_completion", {"prompt": "p", "completion": CHAT}, "wrong_type", id="mixed-pc"),
    pytest.param("prompt_completion", {"prompt": [], "completion": CHAT}, "empty_field", id="empty-prompt-list"),
    pytest.param("messages", {"text": "x"}, "missing_field", id="messages-missing"),
    pytest.param("messages", {"messages": []}, "empty_field", id="messages-empty"),
    pytest.param("messages", {"messages": "hi"}, "wrong_type", id="messages-str"),
    pytest.param("messages", {"messages": ["hi"]}, "wrong_type", id="message-not-object"),
    pytest.param("messages", {"messages": [{"content": "x"}]}, "missing_field", id="role-missing"),
    pytest.param("messages", {"messages": [{"role": "user"}]}, "missing_field", id="content-missing"),
    pytest.param("messages", {"messages": [{"role": "user", "content": 5}]}, "wrong_type", id="content-int"),
    pytest.param("messages", {"messages": [{"role": "robot", "content": "x"}]}, "unknown_role", id="unknown-role"),
    pytest.param("messages", {"messages": [{"role": "user", "content": [{"type": "image", "url": "u"}]}]},
                 "unsupported_content", id="image-part"),  # fmt: skip
    pytest.param("messages", {"messages": CHAT, "tools": "{not json"}, "wrong_type", id="tools-bad-json"),
]


@pytest.mark.parametrize("fmt, bad, reason", BAD_ROWS)
def test_each_skip_reason_is_reported_once(tmp_path, fmt, bad, reason):
    path = write_jsonl(tmp_path / "x.jsonl", [GOOD[fmt], bad, GOOD[fmt]])
    ids, records, skips = read_all([path], window_samples=2, format=fmt)
    assert ids == [0, 2] and len(records) == 2
    assert [(s.sample_id, s.source, s.row, s.reason) for s in skips] == [(1, path, 1, reason)]
    assert reason in SKIP_REASONS and skips[0].detail


@pytest.mark.parametrize("kind", ["parquet", "arrow-stream"])
def test_columnar_rows_are_validated_too(tmp_path, kind):
    rows = [
        {"messages": CHAT},
        {"messages": None},
        {"messages": [{"role": "robot", "content": "x"}]},
        {"messages": [{"role": "user", "content": ""}, {"role": "assistant", "content": "ok"}]},
    ]
    path = write_columnar(tmp_path / f"x.{kind.split('-')[0]}", rows, kind)
    ids, records, skips = read_all([path])
    assert ids == [0, 3] and [s.reason for s in skips] == ["empty_field", "unknown_role"]
    assert records[1].messages[0] == {"role": "user", "content": ""}  # empty content is allowed


def corrupt_second_row_group(path) -> None:
    """Garbage in the middle of row group 1's column chunk (the footer stays readable)."""
    chunk = pq.ParquetFile(path).metadata.row_group(1).column(0)
    with open(path, "r+b") as f:
        f.seek(chunk.data_page_offset + chunk.total_compressed_size // 2)
        f.write(b"\xff" * 64)


def test_a_corrupt_row_group_costs_its_own_rows_only(tmp_path):
    from packfeed.service.data.config import DataConfig
    from packfeed.service.data.plan import build_plan

    path = tmp_path / "x.parquet"
    texts = [f"row {i} " + "abcdefghij" * 20 for i in range(200)]
    pq.write_table(pa.table({"text": texts}), path, row_group_size=100, compression="none", use_dictionary=False)
    corrupt_second_row_group(path)
    with pytest.raises(Exception, match="BYTE_ARRAY"):
        pq.ParquetFile(path).read_row_group(1)  # the corruption is real
    # blocks of 2 rows (a window of 100 draws 50 blocks): none straddles the row groups' boundary at row 100
    config = DataConfig.from_inputs([str(path)], tokenizer="-", seq_len=2, window_samples=100, block_samples=2)
    plan = build_plan(config)
    for k in range(plan.num_windows):  # each window: blocks of both row groups
        raw = read_window(plan.window(k))
        assert sorted(map(int, raw.sample_ids)) == sorted(i for i in plan.window(k).sample_ids() if i < 100)
        assert raw.records == [texts[int(i)] for i in raw.sample_ids]
        assert sorted(s.sample_id for s in raw.skips) == sorted(i for i in plan.window(k).sample_ids() if i >= 100)
        assert {s.reason for s in raw.skips} == {"unreadable"}


def test_a_columnar_file_gone_after_planning_is_an_error_not_bad_data(tmp_path):
    path = write_columnar(tmp_path / "x.parquet", [{"text": "a"}, {"text": "b"}], "parquet")
    (spec,) = plan_windows([path], window_samples=10)
    os.remove(path)  # a node without the shared volume, a deleted file: not rows to skip
    with pytest.raises(StorageError, match=f"{path}: no such file"):
        read_window(spec)


def test_missing_column_skips_every_row(tmp_path):
    path = write_columnar(tmp_path / "x.parquet", [{"body": "a"}, {"body": "b"}], "parquet")
    ids, _, skips = read_all([path], format="text")
    assert ids == [] and [(s.sample_id, s.reason) for s in skips] == [(0, "missing_field"), (1, "missing_field")]


def test_message_normalisation(tmp_path):
    row = {
        "messages": [
            {"role": "user", "name": None,
             "content": [{"type": "text", "text": "what "}, {"type": "text", "text": "color"}]},  # fmt: skip
            {"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "f", "arguments": {}}}]},
            {"role": "tool", "content": "blue"},
            {"role": "assistant", "content": "blue"},
        ],
        "tools": json.dumps([{"type": "function", "function": {"name": "f"}}]),
    }
    path = write_jsonl(tmp_path / "x.jsonl", [row, {"prompt": [CHAT[0]], "completion": [CHAT[1]]}])
    _, records, skips = read_all([path], format="messages")
    conv = records[0]
    assert conv.messages[0] == {"role": "user", "content": "what color"}  # parts joined, null keys dropped
    assert conv.messages[1] == {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": {}}}]}
    assert conv.tools == [{"type": "function", "function": {"name": "f"}}]  # JSON string decoded
    assert [(s.sample_id, s.reason) for s in skips] == [(1, "missing_field")]  # row 1 is not a messages row
    _, records, skips = read_all([path], format="prompt_completion")
    assert records == [PromptCompletion([CHAT[0]], [CHAT[1]], None)] and skips[0].reason == "missing_field"
    _, records, skips = read_all([path])  # auto: each row in its own format, nothing skipped
    assert [type(r) for r in records] == [Conversation, PromptCompletion] and not skips


# ---- strict mode -----------------------------------------------------------------------------
def test_strict_names_file_row_and_line(tmp_path):
    path = write_jsonl(tmp_path / "bad.jsonl", [{"text": "ok"}, {"text": "ok"}, b"{broken"])
    with pytest.raises(BadSampleError) as e:
        read_all([path], window_samples=2, strict=True)
    msg = str(e.value)
    assert path in msg and "row 2 (line 3)" in msg and "malformed_json" in msg
    assert isinstance(e.value, ValueError) and e.value.skip.sample_id == 2

    pq_path = write_columnar(tmp_path / "bad.parquet", [{"text": "ok"}, {"text": None}], "parquet")
    with pytest.raises(BadSampleError, match=r"bad\.parquet: row 1, sample 1: empty_field") as e:
        read_all([pq_path], strict=True)
    assert "line" not in str(e.value)


# ---- formats ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "row, expected",
    [
        pytest.param({"messages": CHAT, "text": "x"}, Conversation, id="messages-wins"),
        pytest.param({"prompt": "p", "completion": "c", "text": "t"}, PromptCompletion, id="prompt-completion-over-text"),
        pytest.param({"text": "t", "meta": 1}, str, id="text"),
        pytest.param({"messages": None, "text": "t"}, str, id="null-messages-is-absent"),
        pytest.param({"prompt": "p", "text": "t"}, str, id="half-a-pair-falls-to-text"),
    ],
)
def test_format_auto_detection_per_row(tmp_path, row, expected):
    _, records, skips = read_all([write_jsonl(tmp_path / "x.jsonl", [row])])
    assert [type(r) for r in records] == [expected] and not skips


def test_a_mixed_format_file_keeps_every_well_formed_sample(tmp_path):
    """Issue: one messages row then prompt/completion and text rows packed 1 of 6."""
    rows = [{"messages": CHAT}, {"prompt": "p1", "completion": "c1"}, {"text": "t1"},
            {"prompt": "p2", "completion": "c2"}, {"text": "t2"}, {"prompt": [CHAT[0]], "completion": [CHAT[1]]}]
    for path in (write_jsonl(tmp_path / "mixed.jsonl", rows),
                 write_columnar(tmp_path / "mixed.parquet", [{"messages": None, "prompt": None, "completion": None,
                                                               "text": None, **r} for r in rows[:5]], "parquet")):
        ids, records, skips = read_all([path])
        assert not skips and ids == list(range(len(ids)))
        assert [type(r).__name__ for r in records][:5] == ["Conversation", "PromptCompletion", "str",
                                                           "PromptCompletion", "str"]


def test_rows_of_no_known_format_name_their_fields(tmp_path):
    path = write_jsonl(tmp_path / "odd.jsonl", [{"question": "q", "answer": "a"}, {"text": None}, {"prompt": "p"}])
    _, records, skips = read_all([path])
    assert not records
    assert [s.reason for s in skips] == ["missing_field", "empty_field", "missing_field"]
    assert "'answer', 'question'" in skips[0].detail and "'text' is null" in skips[1].detail
    assert "'completion'" in skips[2].detail  # half a prompt/completion pair: the missing half is named
    garbage = write_jsonl(tmp_path / "garbage.jsonl", [b"{", b"nope", b"\x00\xff"])
    _, records, skips = read_all([garbage])  # garbage lines are counted skips, not a crash
    assert not records and [s.reason for s in skips] == ["malformed_json", "malformed_json", "invalid_utf8"]


def test_explicit_format_and_per_input_detection(tmp_path):
    both = write_jsonl(tmp_path / "both.jsonl", [{"text": "as text", "messages": CHAT}])
    chat = write_columnar(tmp_path / "chat.parquet", [{"messages": CHAT}], "parquet")
    _, records, _ = read_all([both, chat], format="text")
    assert records[0] == "as text"
    _, records, _ = read_all([both, chat])
    assert [type(r) for r in records] == [Conversation, Conversation]


def test_bad_arguments():
    with pytest.raises(ValueError, match="window_samples"):
        plan_windows(["x.jsonl"], window_samples=0)
    with pytest.raises(ValueError, match="format must be one of"):
        plan_windows(["x.jsonl"], window_samples=1, format="chat")

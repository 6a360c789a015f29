"""Readers and window planning: every row of every input is returned or skipped exactly once,
with its global sample id (0-based position over the inputs in order, bad rows counted)."""

from __future__ import annotations

import glob
import json
import os
import pickle
import random
import threading
from collections import Counter

import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packfeed.service.inputs import files as input_files
from packfeed.service.inputs import scan as input_scan
from packfeed.service.inputs.read import Piece, read_window
from packfeed.service.inputs.records import BadSampleError, Conversation
from packfeed.service.storage import local_glob

from support.inputs import plan_windows, write_arrow_ipc

CHAT = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
RECORDS = [
    {"messages": CHAT},
    {"messages": [{"role": "system", "content": "be brief"}, *CHAT, {"role": "user", "content": "bye"}]},
    {"messages": [{"role": "user", "content": "two plus two"}, {"role": "assistant", "content": "four"}]},
]


# ---- writers ---------------------------------------------------------------------------------
def write_jsonl(path, rows, *, final_newline=True):
    """rows: dicts (JSON-encoded) or raw bytes lines written as they are."""
    lines = [r if isinstance(r, bytes) else json.dumps(r).encode() for r in rows]
    with open(path, "wb") as f:
        f.write(b"\n".join(lines) + (b"\n" if final_newline and lines else b""))
    return str(path)


def write_columnar(path, rows, kind, *, batch_rows=2):
    table = rows if isinstance(rows, pa.Table) else pa.Table.from_pylist(rows)
    if kind == "parquet":
        pq.write_table(table, path, row_group_size=batch_rows)
    elif kind in ("arrow-file", "arrow-stream"):
        write_arrow_ipc(str(path), table, stream=kind == "arrow-stream", batch_rows=batch_rows)
    elif kind == "feather":
        feather.write_feather(table, str(path), chunksize=batch_rows)
    return str(path)


def write_hf(path, rows, num_shards=2):
    from datasets import Dataset

    Dataset.from_list(rows).save_to_disk(str(path), num_shards=num_shards)
    return str(path)


def read_all(inputs, window_samples=1000, format="auto", strict=False):
    """(ids, records, skips) over all windows, checking each window covers its ids once."""
    ids, records, skips = [], [], []
    for spec in plan_windows(inputs, window_samples=window_samples, format=format):
        raw = read_window(spec, strict=strict)
        got = sorted([int(i) for i in raw.sample_ids] + [s.sample_id for s in raw.skips])
        assert got == sorted(spec.sample_ids().tolist())
        assert list(raw.sample_ids) == sorted(raw.sample_ids)
        ids += [int(i) for i in raw.sample_ids]
        records += raw.records
        skips += raw.skips
    return ids, records, skips


def as_dicts(records):
    return [{"messages": r.messages} if isinstance(r, Conversation) else r for r in records]


# ---- every input kind ------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["jsonl", "parquet", "arrow-file", "arrow-stream", "feather", "hf-save-to-disk"])
def test_every_kind_reads_the_same_records(tmp_path, kind):
    rows = RECORDS * 3  # 9 rows: several Parquet row groups / Arrow batches / HF shards
    path = {
        "jsonl": lambda: write_jsonl(tmp_path / "d.jsonl", rows),
        "parquet": lambda: write_columnar(tmp_path / "d.parquet", rows, kind),
        "arrow-file": lambda: write_columnar(tmp_path / "d.arrow", rows, kind),
        "arrow-stream": lambda: write_columnar(tmp_path / "d.arrow", rows, kind),
        "feather": lambda: write_columnar(tmp_path / "d.feather", rows, kind),
        "hf-save-to-disk": lambda: write_hf(tmp_path / "ds", rows),
    }[kind]()
    for w in (1, 2, 4, 100):
        ids, records, skips = read_all([path], window_samples=w)
        assert ids == list(range(9)) and skips == []
        assert as_dicts(records) == rows


def test_hf_dataset_reads_arrow_files_in_state_json_order(tmp_path):
    rows = [{"text": f"doc {i}"} for i in range(9)]
    path = write_hf(tmp_path / "ds", rows, num_shards=3)  # shards of rows 0-2, 3-5, 6-8
    state_path = os.path.join(path, "state.json")
    state = json.load(open(state_path))
    state["_data_files"].reverse()  # state.json, not the file names, defines the order
    json.dump(state, open(state_path, "w"))
    expanded = input_files.list_inputs([path])
    assert [f.path for f in expanded] == [os.path.join(path, d["filename"]) for d in state["_data_files"]]
    expected = [r["text"] for r in rows[6:] + rows[3:6] + rows[:3]]
    assert read_all([path], window_samples=2)[1] == expected


def test_hf_dataset_dict_asks_for_one_split(tmp_path):
    from datasets import Dataset, DatasetDict

    d = Dataset.from_list([{"text": "a"}])
    DatasetDict({"train": d, "test": d}).save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(ValueError, match=r"DatasetDict.*'train', 'test'.*one split"):
        plan_windows([str(tmp_path / "dd")], window_samples=4)
    assert read_all([str(tmp_path / "dd" / "test")])[1] == ["a"]


def test_text_files_one_document_each_sorted(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    for name, body in [("b.txt", b"second doc\n"), ("a.txt", b"first doc"), ("c.md", "\ufeffthird \u00e9".encode()),
                       ("d.txt", b"  \n"), ("e.txt", b"bad \xff byte"), ("notes.csv", b"ignored"), (".hidden.txt", b"x")]:  # fmt: skip
        (docs / name).write_bytes(body)
    ids, records, skips = read_all([str(docs)], window_samples=2)
    assert records == ["first doc", "second doc\n", "third \u00e9"]  # BOM dropped, text kept as is
    assert ids == [0, 1, 2]
    assert [(s.sample_id, os.path.basename(s.source), s.row, s.reason) for s in skips] == [
        (3, "d.txt", 0, "empty_field"),
        (4, "e.txt", 0, "invalid_utf8"),
    ]
    # a glob expands sorted, too; a single file is one sample
    assert read_all([str(docs / "*.txt")])[0] == [0, 1]
    assert read_all([str(docs / "a.txt")])[1] == ["first doc"]
    with pytest.raises(ValueError, match="plain-text file"):
        plan_windows([str(docs / "a.txt")], window_samples=2, format="messages")


def test_text_pieces_group_files_and_stay_small(tmp_path):
    for i in range(50):
        (tmp_path / f"{i:03d}.txt").write_text(f"doc {i}")
    windows = plan_windows([str(tmp_path)], window_samples=20)
    assert [w.num_samples for w in windows] == [20, 20, 10]
    assert [len(w.pieces) for w in windows] == [1, 1, 1]
    assert windows[1].pieces[0].files[0].endswith("020.txt")
    assert read_window(windows[2]).records == [f"doc {i}" for i in range(40, 50)]


def test_directory_expands_sorted_and_mixes_kinds(tmp_path):
    write_jsonl(tmp_path / "b.jsonl", [{"text": "b0"}, {"text": "b1"}])
    write_columnar(tmp_path / "a.parquet", [{"text": "a0"}], "parquet")
    (tmp_path / "c.txt").write_text("c0")
    (tmp_path / "README").write_text("not data")
    assert read_all([str(tmp_path)])[1] == ["a0", "b0", "b1", "c0"]
    with pytest.raises(ValueError, match="does not exist"):
        plan_windows([str(tmp_path / "nope.jsonl")], window_samples=1)
    with pytest.raises(ValueError, match="unknown file type"):
        plan_windows([str(tmp_path / "README")], window_samples=1)


def test_a_recursive_glob_through_a_symlinked_directory_loop_reads_each_file_once(tmp_path, caplog):
    data = tmp_path / "data"
    (data / "sub").mkdir(parents=True)
    write_jsonl(data / "top.jsonl", [{"text": "t0"}])
    write_jsonl(data / "sub" / "deep.jsonl", [{"text": "d0"}, {"text": "d1"}])
    (data / "sub" / "up").symlink_to(data)  # data/sub/up/sub/up/... : a loop glob follows
    pattern = str(data / "**" / "*.jsonl")
    assert len(glob.glob(pattern, recursive=True)) > 2  # the loop is really walked
    with caplog.at_level("WARNING", logger=input_files.logger.name):
        files = input_files.list_inputs([pattern, str(data / "top.jsonl")])  # and one file given twice
    assert [os.path.relpath(f.path, data) for f in files] == [os.path.join("sub", "deep.jsonl"), "top.jsonl"]
    assert "symlink loop" in caplog.text and "each directory is walked once" in caplog.text  # the glob's
    assert "each file is read once" in caplog.text  # the file given twice
    assert sorted(read_all([pattern])[1]) == ["d0", "d1", "t0"]


def test_a_recursive_glob_through_two_symlink_loops_ends_and_reads_each_file_once(tmp_path, caplog):
    """Two loops made glob walk ~2**40 paths (a hang); each real directory is walked once."""
    data = tmp_path / "data"
    (data / "sub").mkdir(parents=True)
    write_jsonl(data / "top.jsonl", [{"text": "t0"}])
    write_jsonl(data / "sub" / "deep.jsonl", [{"text": "d0"}])
    (data / "self").symlink_to(data)
    (data / "sub" / "up").symlink_to(data)
    result: list = []
    worker = threading.Thread(target=lambda: result.append(input_files.list_inputs([str(data / "**" / "*.jsonl")])),
                              daemon=True)
    with caplog.at_level("WARNING", logger=input_files.logger.name):
        worker.start()
        worker.join(60)
    assert result, "expanding the glob did not end in 60 s"
    assert [os.path.relpath(f.path, data) for f in result[0]] == [os.path.join("sub", "deep.jsonl"), "top.jsonl"]
    assert "each directory is walked once" in caplog.text


@pytest.mark.parametrize("seed", range(12))
def test_the_recursive_glob_lists_what_glob_lists_on_trees_without_links(tmp_path, seed, monkeypatch):
    """Same matches as ``glob.glob(recursive=True)`` over random trees (hidden names included)."""
    rng = random.Random(seed)
    names = ["a", "b", ".h", "d1", "x.jsonl", "y.txt", ".z.jsonl", "b.jsonl"]
    for _ in range(25):
        path = tmp_path.joinpath(*rng.sample(names, rng.randint(1, 4)))
        if not any(p.is_file() for p in [path, *path.parents]):
            path.parent.mkdir(parents=True, exist_ok=True)
            if not path.exists():
                path.write_text("") if rng.random() < 0.6 else path.mkdir()
    monkeypatch.chdir(tmp_path)
    patterns = ["**", "**/*.jsonl", "a/**", "a/**/*", "*/**/b*", "**/.h/*", "**/d1/**/*.jsonl", ".h/**",
                "**/*/x.jsonl", "b/**/**/*.jsonl"]
    for pattern in patterns + [str(tmp_path / p) for p in patterns]:
        files = sorted(m for m in glob.glob(pattern, recursive=True) if os.path.isfile(m))  # directories are not read
        assert sorted(m for m in local_glob(pattern) if os.path.isfile(m)) == files, pattern


@pytest.mark.parametrize("kind", ["parquet", "arrow-file", "arrow-stream", "feather"])
def test_a_string_cell_that_is_not_utf8_skips_its_own_row(tmp_path, kind):
    """Arrow does not check UTF-8 on write or read: one bad cell failed the whole run, naming no file."""
    text = pa.array([b"ok", b"bad \xff", b"fine"], pa.binary()).view(pa.string())
    ext = {"arrow-file": "arrow", "arrow-stream": "ipc"}.get(kind, kind)
    path = tmp_path / f"t.{ext}"
    table = pa.table({"text": text, "note": pa.array([b"\xfe", b"x", b"y"]).view(pa.string())})  # unused column
    write_columnar(path, table, kind)
    ids, records, skips = read_all([str(path)])
    assert (ids, records) == ([0, 2], ["ok", "fine"])
    assert [(s.row, s.reason) for s in skips] == [(1, "invalid_utf8")] and "'text'" in skips[0].detail
    messages = pa.array([[{"role": "user", "content": b"hi"}], [{"role": "user", "content": b"\xc3("}]],
                        pa.list_(pa.struct([("role", pa.string()), ("content", pa.binary())])))
    write_columnar(path, pa.table({"messages": messages.view(pa.list_(pa.struct([("role", pa.string()),
                                                                                  ("content", pa.string())])))}), kind)
    ids, records, skips = read_all([str(path)])
    assert ids == [0] and [(s.row, s.reason) for s in skips] == [(1, "invalid_utf8")]


@pytest.mark.parametrize(("name", "content", "message"), [
    ("state.json", b"[1]", "not a valid JSON object \\(it holds a list\\)"),
    ("state.json", b'{"_data_files": [{"name": "x"}]}', "not a Hugging Face datasets state.json"),
    ("state.json", b"{oops", "not a valid JSON object"),
    ("dataset_dict.json", b"\xff\xfe", "not a valid JSON object"),
])
def test_a_damaged_datasets_directory_is_named(tmp_path, name, content, message):
    (tmp_path / name).write_bytes(content)
    with pytest.raises(ValueError, match=f"{name}.*{message}"):
        input_files.list_inputs([str(tmp_path)])


# ---- global sample ids and windows -----------------------------------------------------------
def test_global_ids_count_skipped_rows_across_files(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", [{"text": "a0"}, b"{oops", {"text": "a2"}])
    b = write_columnar(tmp_path / "b.parquet", [{"text": "b0"}, {"text": None}, {"text": "b2"}], "parquet")
    c = write_jsonl(tmp_path / "c.jsonl", [b"", {"text": "c1"}], final_newline=False)
    ids, records, skips = read_all([a, b, c], window_samples=2)
    assert list(zip(ids, records)) == [(0, "a0"), (2, "a2"), (3, "b0"), (5, "b2"), (7, "c1")]
    assert [(s.sample_id, os.path.basename(s.source), s.row, s.reason) for s in skips] == [
        (1, "a.jsonl", 1, "malformed_json"),
        (4, "b.parquet", 1, "empty_field"),
        (6, "c.jsonl", 0, "blank_line"),
    ]


def test_windows_span_files_golden(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", [{"text": "a0"}, {"text": "a1"}, {"text": "a2"}])  # 3 rows
    b = write_columnar(tmp_path / "b.parquet", [{"text": "b0"}, {"text": "b1"}], "parquet")  # 2 rows
    windows = plan_windows([a, b], window_samples=2)
    assert [(w.index, w.epoch, w.sample_ids().tolist()) for w in windows] == [(0, 0, [0, 1]), (1, 0, [2, 3]), (2, 0, [4])]
    # row 2 of a.jsonl: the reader seeks to the nearest known offset (row 0) and skips 2 lines,
    # reading no further than the file's end (no seek point after it); each piece carries the
    # version of its file the plan saw
    seen = {p: dict(size=os.stat(p).st_size, mtime_ns=os.stat(p).st_mtime_ns) for p in (a, b)}
    assert windows[1].pieces == (
        Piece(a, "jsonl", "auto", source=0, start_row=2, num_rows=1, first_sample_id=2, byte_offset=0, seek_row=0,
              end_offset=os.stat(a).st_size, **seen[a]),
        Piece(b, "parquet", "auto", source=0, start_row=0, num_rows=1, first_sample_id=3, **seen[b]),
    )
    assert windows[2].pieces == (Piece(b, "parquet", "auto", 0, 1, 1, 4, **seen[b]),)
    assert [read_window(w).records for w in windows] == [["a0", "a1"], ["a2", "b0"], ["b1"]]


def test_window_spec_is_small_and_picklable(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", [{"text": str(i)} for i in range(1000)])
    spec = plan_windows([a], window_samples=300)[1]
    assert pickle.loads(pickle.dumps(spec)) == spec
    assert len(pickle.dumps(spec)) < 500
    with pytest.raises(Exception):
        spec.index = 3  # frozen


@pytest.mark.parametrize(
    "content, expected_rows",
    [
        pytest.param(b"", 0, id="empty-file"),
        pytest.param(b"{}\n", 1, id="final-newline-adds-no-row"),
        pytest.param(b"{}", 1, id="last-line-without-newline"),
        pytest.param(b"{}\n{}", 2, id="two-lines-no-final-newline"),
        pytest.param(b"\n", 1, id="one-blank-line"),
        pytest.param(b"{}\n\n  \n{}\n", 4, id="blank-lines-are-rows"),
        pytest.param(b"{}\r\n{}\r\n", 2, id="crlf"),
    ],
)
def test_jsonl_row_counting(tmp_path, content, expected_rows):
    path = tmp_path / "x.jsonl"
    path.write_bytes(content)
    assert input_scan.scan_file(str(path), "jsonl", stride=1).num_rows == expected_rows
    if expected_rows == 0:  # an input with no rows makes a source with no rows: an error naming it
        with pytest.raises(ValueError, match="has no rows"):
            read_all([str(path)], window_samples=1, format="text")
        return
    ids, _, skips = read_all([str(path)], window_samples=1, format="text")
    assert len(ids) + len(skips) == expected_rows


def test_jsonl_byte_offsets_with_tiny_scan_chunks(tmp_path, monkeypatch):
    rows = [{"text": "x" * (i % 7 + 1)} for i in range(200)]
    path = write_jsonl(tmp_path / "a.jsonl", rows)
    monkeypatch.setattr(input_scan, "SCAN_CHUNK", 5)  # boundaries fall in many chunks
    for w in (1, 3, 64, 199, 200, 201):
        assert read_all([path], window_samples=w)[1] == [r["text"] for r in rows]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sizes=st.lists(st.integers(0, 9), min_size=1, max_size=4), window=st.integers(1, 12))
def test_windows_cover_every_id_exactly_once(tmp_path_factory, sizes, window):
    d = tmp_path_factory.mktemp("sweep")
    inputs, expected, next_id = [], [], 0
    for k, n in enumerate(sizes):
        rows = [{"text": f"{k}-{i}"} for i in range(n)]
        kind = ("jsonl", "parquet", "arrow-stream")[k % 3]
        if kind == "jsonl":
            path = write_jsonl(d / f"{k}.jsonl", rows)
        else:
            path = write_columnar(d / f"{k}.{kind.split('-')[0]}", rows, kind, batch_rows=3)
        inputs.append(path)
        expected += [r["text"] for r in rows]
        next_id += n
    if next_id == 0:
        with pytest.raises(ValueError, match="has no rows"):
            plan_windows(inputs, window_samples=window)
        return
    windows = plan_windows(inputs, window_samples=window)
    assert [w.sample_ids().tolist() for w in windows] == [
        list(range(start, min(start + window, next_id))) for start in range(0, next_id, window)
    ]
    ids, records, skips = read_all(inputs, window_samples=window, format="text")
    assert ids == list(range(next_id)) and records == expected and not skips


# ---- property: random mixes of good and bad rows ---------------------------------------------
ROW_KINDS = {
    "good": (lambda i: json.dumps({"text": f"t{i}"}).encode(), None),
    "blank": (lambda i: b"   ", "blank_line"),
    "utf8": (lambda i: b'{"text": "\xc3("}', "invalid_utf8"),
    "json": (lambda i: b'{"text": ', "malformed_json"),
    "array": (lambda i: b"[]", "not_an_object"),
    "missing": (lambda i: b'{"txt": "x"}', "missing_field"),
    "empty": (lambda i: b'{"text": ""}', "empty_field"),
    "type": (lambda i: b'{"text": ["x"]}', "wrong_type"),
}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    files=st.lists(st.lists(st.sampled_from(sorted(ROW_KINDS)), min_size=1, max_size=12), min_size=1, max_size=3),
    window=st.integers(1, 10),
    final_newline=st.booleans(),
)
def test_random_rows_returned_or_skipped_exactly_once(tmp_path_factory, files, window, final_newline):
    d = tmp_path_factory.mktemp("prop")
    inputs, expected_good, expected_skips, gid = [], [], [], 0
    for k, kinds in enumerate(files):
        lines = []
        for kind in kinds:
            make, reason = ROW_KINDS[kind]
            lines.append(make(gid))
            if reason is None:
                expected_good.append((gid, f"t{gid}"))
            else:
                expected_skips.append((gid, reason))
            gid += 1
        inputs.append(write_jsonl(d / f"{k}.jsonl", lines, final_newline=final_newline))
    ids, records, skips = read_all(inputs, window_samples=window, format="text")
    assert list(zip(ids, records)) == expected_good
    assert sorted((s.sample_id, s.reason) for s in skips) == expected_skips
    assert Counter(ids + [s.sample_id for s in skips]) == Counter(range(gid))


def test_bad_sample_error_survives_pickling_across_processes():
    """Raised inside a Ray actor, it must reach the driver intact (strict mode's message)."""
    import pickle

    from packfeed.service.inputs.records import Skip

    error = BadSampleError(Skip(7, "a.jsonl", 7, "malformed_json", "bad", line=8))
    again = pickle.loads(pickle.dumps(error))
    assert isinstance(again, BadSampleError) and str(again) == str(error) and again.skip == error.skip
    assert "a.jsonl: row 7 (line 8), sample 7: malformed_json: bad" in str(again)

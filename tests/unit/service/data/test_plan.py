"""The stream plan over real files: which rows of which source every window of every epoch
holds. Sweeps of source sizes, repeats, weights, epochs, windows and shuffle blocks check the
contract of docs/design.md ("Mixtures and epochs"); a golden small enough to read by eye."""

from __future__ import annotations

import json
import os
from collections import Counter, defaultdict
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packfeed.service.data.config import DataConfig, SourceConfig
from packfeed.service.data.mixture import SourceOrder
from packfeed.service.data.plan import auto_window, build_plan
from packfeed.service.inputs.read import read_window


def write_source(directory, name: str, rows: int, files: int = 1) -> list[str]:
    """``rows`` text rows "name-i" split over ``files`` JSONL files."""
    paths, per = [], -(-rows // files)
    for f in range(files):
        chunk = range(f * per, min((f + 1) * per, rows))
        if not len(chunk):
            continue
        path = directory / f"{name}-{f}.jsonl"
        path.write_text("".join(json.dumps({"text": f"{name}-{i}"}) + "\n" for i in chunk))
        paths.append(str(path))
    return paths


def config(sources, **kw) -> DataConfig:
    return DataConfig(sources=tuple(sources), tokenizer="-", seq_len=8, **kw)


def rows_by_window(plan):
    """window -> {source index: [source-local rows in piece order]}"""
    out = {}
    for k in range(plan.num_windows):
        per = defaultdict(list)
        for piece in plan.window(k).pieces:
            s = plan.sources[piece.source]
            local = piece.first_sample_id - s.first_sample_id
            per[piece.source] += list(range(local, local + piece.num_rows))
        out[k] = dict(per)
    return out


def test_golden_two_sources_three_windows(tmp_path):
    """a: 6 rows repeat 1, b: 2 rows repeat 1.5, window 4, block 2 (the plan.py docstring)."""
    a = write_source(tmp_path, "a", 6)
    b = write_source(tmp_path, "b", 2)
    plan = build_plan(config([SourceConfig(name="a", paths=a), SourceConfig(name="b", paths=b, repeat=1.5)],
                             window_samples=4, block_samples=2, epochs=2))
    assert plan.counts.tolist() == [6, 3] and plan.windows_per_epoch == 3 and plan.num_windows == 6
    assert [plan.window_counts(k).tolist() for k in range(3)] == [[3, 1], [2, 2], [1, 0]]
    assert [s.first_sample_id for s in plan.sources] == [0, 6]  # b's rows are samples 6 and 7
    texts = [read_window(plan.window(k)).records for k in range(plan.num_windows)]
    epoch0 = Counter(t for w in texts[:3] for t in w)
    assert {t: n for t, n in epoch0.items() if t.startswith("a")} == {f"a-{i}": 1 for i in range(6)}
    b0 = sorted(t for t in epoch0.elements() if t.startswith("b"))
    assert b0 in (["b-0", "b-0", "b-1"], ["b-0", "b-1", "b-1"]), "1.5 passes: one row twice"
    b_all = Counter(t for w in texts for t in w if t.startswith("b"))
    assert b_all == {"b-0": 3, "b-1": 3}, "two epochs of 1.5 passes: 3 whole passes"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    sizes=st.lists(st.integers(1, 40), min_size=1, max_size=4),
    shares=st.lists(st.sampled_from([0.3, 0.5, 1.0, 1.5, 2.0, 2.5]), min_size=4, max_size=4),
    weighted=st.booleans(),
    epochs=st.integers(1, 3),
    window=st.integers(1, 50),
    block=st.sampled_from([0, 1, 3, 8, 64]),
    files=st.integers(1, 3),
)
def test_plan_contract_over_sweeps(tmp_path_factory, sizes, shares, weighted, epochs, window, block, files):
    d = tmp_path_factory.mktemp("plan")
    names = [f"s{i}" for i in range(len(sizes))]
    if weighted:
        sources = [SourceConfig(name=n, paths=write_source(d, n, r, files), weight=w) for n, r, w in zip(names, sizes, shares)]
        per_epoch = max(len(sizes), sum(sizes) // 2)
        cfg = config(sources, samples_per_epoch=per_epoch, epochs=epochs, window_samples=window, block_samples=block)
    else:
        sources = [SourceConfig(name=n, paths=write_source(d, n, r, files), repeat=w) for n, r, w in zip(names, sizes, shares)]
        cfg = config(sources, epochs=epochs, window_samples=window, block_samples=block)
    try:
        plan = build_plan(cfg)
    except ValueError as e:  # a source whose share rounds to nothing is refused by name
        assert "contributes 0 samples per epoch" in str(e)
        return
    counts = plan.counts.tolist()
    T = sum(counts)
    if weighted:
        assert T == per_epoch
    else:
        assert counts == [int(np.floor(r * n + 0.5)) for r, n in zip(shares, sizes)]
    by_window = rows_by_window(plan)
    per_epoch_rows: dict[tuple[int, int], list[int]] = defaultdict(list)
    for k, per in by_window.items():
        e = plan.epoch_of(k)
        last = k % plan.windows_per_epoch == plan.windows_per_epoch - 1
        for s, rows in per.items():
            per_epoch_rows[(e, s)] += rows
        if not last:  # every window but an epoch's last holds each source within one of its share
            for s, c in enumerate(counts):
                assert abs(len(per.get(s, [])) - Fraction(plan.window_samples * c, T)) < 1
    for e in range(epochs):
        for s, c in enumerate(counts):
            got = per_epoch_rows[(e, s)]
            assert len(got) == c, "every source's count per epoch is exact"
    for s, c in enumerate(counts):
        # over all epochs, every pass visits every row once: (sample, repetition) exactly once
        whole = [r for e in range(epochs) for r in per_epoch_rows[(e, s)]]
        assert plan.sources[s].block == (block and max(1, min(block, min(window, T) * c // (T * 32))))
        order = SourceOrder(sizes[s], block=plan.sources[s].block, seed=0, source=s)
        assert whole == [r for lo, hi in order.ranges(0, epochs * c) for r in range(lo, hi)]
        n = sizes[s]
        passes, rest = divmod(len(whole), n)
        assert all(v in (passes, passes + 1) for v in Counter(whole).values())
        assert len(Counter(whole)) == (n if passes else rest)


def test_epochs_differ_in_order_and_the_plan_is_a_function_of_the_seed(tmp_path):
    a = write_source(tmp_path, "a", 300, files=3)
    b = write_source(tmp_path, "b", 100)
    sources = [SourceConfig(name="a", paths=a), SourceConfig(name="b", paths=b, repeat=2.0)]
    plan = build_plan(config(sources, epochs=2, window_samples=64, block_samples=8))
    again = build_plan(config(sources, epochs=2, window_samples=64, block_samples=8))
    other = build_plan(config(sources, epochs=2, window_samples=64, block_samples=8, seed=1))
    windows = [plan.window(k) for k in range(plan.num_windows)]
    assert windows == [again.window(k) for k in range(again.num_windows)] and plan.fingerprint() == again.fingerprint()
    assert windows != [other.window(k) for k in range(other.num_windows)]
    e0 = [r for k in range(plan.windows_per_epoch) for r in rows_by_window(plan)[k].get(0, [])]
    e1 = [r for k in range(plan.windows_per_epoch, plan.num_windows) for r in rows_by_window(plan)[k].get(0, [])]
    assert sorted(e0) == sorted(e1) == list(range(300)) and e0 != e1, "each epoch a different seeded order"
    # shuffled across the source: windows draw from several of a's three files, not one at a time
    files_per_window = [len({p.path for p in plan.window(k).pieces if p.source == 0}) for k in range(plan.num_windows)]
    assert np.mean(files_per_window) > 2.5


def test_a_sorted_source_is_mixed_across_windows(tmp_path):
    """Issue: windows of consecutive samples made long single-topic runs. With blocks, every
    window holds rows from all over the source."""
    topics = write_source(tmp_path, "t", 4000, files=4)  # file f holds "topic" f
    plan = build_plan(config([SourceConfig(name="t", paths=topics)], window_samples=1000, block_samples=64))
    for k in range(plan.num_windows):
        files = Counter(p.path for p in plan.window(k).pieces for _ in range(p.num_rows))
        assert len(files) == 4 and max(files.values()) < 500, "every window mixes the four topics"


def test_auto_window_depends_on_the_data_only():
    assert auto_window(7500) == 1024 and auto_window(100) == 1024
    assert auto_window(50_000) == 6250 and auto_window(10**8) == 8192


@pytest.mark.parametrize("bad, message", [
    pytest.param({"repeat": 1e-9}, "contributes 0 samples per epoch", id="rounds-to-nothing"),
])
def test_plan_errors_name_the_source(tmp_path, bad, message):
    a = write_source(tmp_path, "a", 5)
    with pytest.raises(ValueError, match=f"source 'web'.*{message}|{message}"):
        build_plan(config([SourceConfig(name="web", paths=a, **bad)]))


def test_an_empty_source_is_refused_by_name(tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(ValueError, match="source 'web' has no rows"):
        build_plan(config([SourceConfig(name="web", paths=[str(tmp_path / "empty.jsonl")])]))


@pytest.mark.parametrize("ext", ["jsonl", "parquet", "arrow", "txt"])
def test_an_empty_file_among_others_is_warned_about_and_the_rest_planned(tmp_path, caplog, ext):
    """A 0-byte Parquet/Arrow file (an export never finished) stopped the run as corrupt."""
    a = write_source(tmp_path, "a", 5)
    (tmp_path / f"empty.{ext}").write_bytes(b"")
    with caplog.at_level("WARNING", logger="packfeed"):
        plan = build_plan(config([SourceConfig(name="web", paths=[*a, str(tmp_path / f"empty.{ext}")])]))
    assert plan.samples_per_epoch == 5 and f"empty.{ext} holds no rows" in caplog.text


def test_plan_pickles_small_and_rebuilds_its_orders(tmp_path):
    import pickle

    a = write_source(tmp_path, "a", 1000)
    plan = build_plan(config([SourceConfig(name="a", paths=a)], window_samples=100, block_samples=16))
    w = plan.window(3)
    blob = pickle.dumps(plan)
    assert len(blob) < 20_000
    assert pickle.loads(blob).window(3) == w


def test_block_samples_per_source_overrides_the_data_config(tmp_path):
    ordered = write_source(tmp_path, "ordered", 300)
    shuffled = write_source(tmp_path, "shuffled", 300)
    plan = build_plan(config([SourceConfig(name="ordered", paths=ordered, block_samples=0),
                              SourceConfig(name="shuffled", paths=shuffled)], window_samples=100, block_samples=8))
    rows = rows_by_window(plan)
    first = [r for k in range(plan.num_windows) for r in rows[k].get(0, [])]
    second = [r for k in range(plan.num_windows) for r in rows[k].get(1, [])]
    assert first == list(range(300)), "block 0: file order"
    assert sorted(second) == list(range(300)) and second != list(range(300)), "the config's blocks: shuffled"


@pytest.mark.parametrize("block", [1, 3, 16, 0])
def test_jsonl_pieces_seek_to_their_block_and_carry_their_files_version(tmp_path, block):
    """Seek points fall on the source's block boundaries, whatever the files' sizes: a piece
    that starts a block seeks right to it (no line passed over); every piece seeks at most a
    stride back, and names the size and mtime its file was scanned at."""
    paths = write_source(tmp_path, "a", 203, files=7)
    plan = build_plan(config([SourceConfig(name="a", paths=paths)], window_samples=50, block_samples=block, epochs=2))
    stride = block or 4096
    starts_a_block = 0
    for k in range(plan.num_windows):
        for p in plan.window(k).pieces:
            s = plan.sources[p.source]
            local = p.first_sample_id - s.first_sample_id  # the piece's first row within the source
            assert p.seek_row <= p.start_row < p.seek_row + stride
            if block and local % block == 0:
                starts_a_block += 1
                assert p.seek_row == p.start_row
            with open(p.path, "rb") as f:
                f.seek(p.byte_offset)
                lines = f.read().split(b"\n")
            assert json.loads(lines[p.start_row - p.seek_row])["text"] == f"a-{local}"
            st = os.stat(p.path)
            assert (p.size, p.mtime_ns, p.etag) == (st.st_size, st.st_mtime_ns, None)
    assert starts_a_block > 10 or not block


def test_text_pieces_carry_their_version_when_they_hold_one_file(tmp_path):
    docs = []
    for i in range(5):
        (tmp_path / f"doc{i}.txt").write_text(f"document {i}")
        docs.append(str(tmp_path / f"doc{i}.txt"))
    plan = build_plan(config([SourceConfig(name="t", paths=docs)], window_samples=5, block_samples=0))
    (piece,) = plan.window(0).pieces  # consecutive documents: one piece of five files
    assert len(piece.files) == 5 and (piece.size, piece.mtime_ns, piece.etag) == (-1, -1, None)
    single = build_plan(config([SourceConfig(name="t", paths=docs[:1])], window_samples=5)).window(0).pieces[0]
    assert (single.size, single.mtime_ns) == (os.path.getsize(docs[0]), os.stat(docs[0]).st_mtime_ns)


@pytest.mark.parametrize("rows, block, quiet_bytes, warned", [
    (5000, 256, 0, True), (5000, 32, 0, True), (5000, 3, 0, False), (5000, 0, 0, False),
    (5000, 256, None, False),  # the default threshold: a small source's extra reads are not worth a word
])
def test_a_block_capped_below_the_jsonl_seek_stride_is_warned_about_with_the_block_that_aligns(
        tmp_path, caplog, monkeypatch, rows, block, quiet_bytes, warned):
    """Window 100 caps a source's block at 100 / 32 = 3 rows: with seek points every ``block``
    rows (> 3) each block reads about half that many rows before its start, and the warning names
    block_samples = 3; configured at 3 (or 0: file order) there is nothing to warn about, nor for
    a source whose extra reads stay under ``QUIET_EXTRA_BYTES`` per epoch (the bundled corpus
    must pack without a warning)."""
    from packfeed.service.data import plan as plan_module
    if quiet_bytes is not None:
        monkeypatch.setattr(plan_module, "QUIET_EXTRA_BYTES", quiet_bytes)
    paths = write_source(tmp_path, "a", rows)
    with caplog.at_level("WARNING", logger="packfeed"):
        plan = build_plan(config([SourceConfig(name="a", paths=paths)], window_samples=100, block_samples=block))
    said = [r.getMessage() for r in caplog.records if "seek points" in r.getMessage()]
    assert plan.sources[0].block == (3 if block else 0)
    if warned:
        assert len(said) == 1 and f"{block} rows apart" in said[0] and "block_samples = 3" in said[0], said
    else:
        assert said == []

"""inputs/extents.py: the byte ranges a window draws, checked by eye on small files."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from packfeed.service.inputs.extents import num_bytes, union, window_extents
from packfeed.service.inputs.read import Piece, WindowSpec


def jsonl_piece(start_row: int, num_rows: int, byte_offset: int, end_offset: int, *, path: str = "a.jsonl") -> Piece:
    return Piece(path, "jsonl", "text", 0, start_row, num_rows, start_row, byte_offset=byte_offset,
                 seek_row=start_row - start_row % 10, end_offset=end_offset, size=400)


@pytest.mark.parametrize(("pieces", "expected"), [
    pytest.param([jsonl_piece(0, 5, 0, 100), jsonl_piece(25, 3, 250, 400)], {"a.jsonl": [(0, 100), (250, 400)]},
                 id="two-stretches-apart"),
    pytest.param([jsonl_piece(0, 5, 0, 100), jsonl_piece(12, 3, 100, 180)], {"a.jsonl": [(0, 180)]},
                 id="adjacent-stretches-merge"),
    pytest.param([jsonl_piece(3, 2, 0, 100), jsonl_piece(0, 2, 0, 100)], {"a.jsonl": [(0, 100)]},
                 id="one-stretch-drawn-twice-counts-once"),
    pytest.param([jsonl_piece(35, 5, 300, -1)], {"a.jsonl": [(300, 400)]}, id="no-end-known-to-the-file-end"),
])
def test_jsonl_pieces_draw_their_seek_stretches(pieces, expected):
    assert window_extents(WindowSpec(0, 0, tuple(pieces))) == expected


def test_union_merges_windows_per_file_and_num_bytes_sums_them():
    first = {"a": [(0, 100)], "b": [(10, 20)]}
    second = {"a": [(50, 150), (300, 310)]}
    assert union([first, second]) == {"a": [(0, 150), (300, 310)], "b": [(10, 20)]}
    assert num_bytes(union([first, second])) == 150 + 10 + 10


def test_a_parquet_piece_draws_the_footer_and_the_format_columns_of_its_row_groups(tmp_path):
    path = str(tmp_path / "t.parquet")
    table = pa.table({"text": [f"document {i} " * (i % 7 + 1) for i in range(30)], "id": list(range(30))})
    pq.write_table(table, path, row_group_size=10)  # row groups: rows 0-9, 10-19, 20-29
    meta = pq.ParquetFile(path).metadata
    size = len(open(path, "rb").read())
    piece = Piece(path, "parquet", "text", 0, 12, 9, 12)  # rows 12-20: row groups 1 and 2

    extents = window_extents(WindowSpec(0, 0, (piece,)))

    def chunk(g: int, c: int) -> tuple[int, int]:
        column = meta.row_group(g).column(c)
        start = min(o for o in (column.dictionary_page_offset, column.data_page_offset) if o is not None)
        return start, start + column.total_compressed_size

    assert [meta.row_group(0).column(c).path_in_schema for c in (0, 1)] == ["text", "id"]
    footer = (size - 8 - meta.serialized_size, size)
    assert extents == union([{path: [chunk(1, 0), chunk(2, 0), footer]}])
    assert num_bytes(extents) == sum(b - a for a, b in (chunk(1, 0), chunk(2, 0), footer)) < size
    for outside in (chunk(0, 0), chunk(0, 1), chunk(1, 1), chunk(2, 1)):  # row group 0; the id column
        assert all(outside[0] >= b or outside[1] <= a for a, b in extents[path]), outside

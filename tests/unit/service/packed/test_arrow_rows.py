import numpy as np
import pyarrow.parquet as pq

from packfeed.client.rows import PackedRows, check_rows, positions_from_seq_lens
from packfeed.service.packed.arrow_rows import ROW_SCHEMA, rows_from_arrow, rows_to_arrow


def golden_rows() -> PackedRows:
    """L=6: row 0 = samples 4 ([1]) and 9 ([2,2]) + 3 pad; row 1 = sample 2 ([3,3,3,3,3,3])."""
    return PackedRows(
        input_ids=np.array([[1, 2, 2, 0, 0, 0], [3, 3, 3, 3, 3, 3]], np.int32),
        labels=np.array([[-100, -100, 2, -100, -100, -100], [-100, 3, 3, 3, 3, 3]], np.int32),
        position_ids=np.array([[0, 0, 1, 0, 1, 2], [0, 1, 2, 3, 4, 5]], np.int32),
        seq_lens=np.array([1, 2, 3, 6], np.int32),
        sample_ids=np.array([4, 9, -1, 2], np.int64),
        segment_splits=np.array([0, 3, 4], np.int64),
        row_index=np.array([10, 11], np.int64),
    )


def assert_rows_equal(a: PackedRows, b: PackedRows) -> None:
    for name in PackedRows.__dataclass_fields__:
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and np.array_equal(x, y), name


def test_golden_rows_follow_the_convention():
    check_rows(golden_rows(), 6)


def test_arrow_round_trip_is_exact_and_typed(tmp_path):
    rows = golden_rows()
    table = rows_to_arrow(rows)
    assert table.schema == ROW_SCHEMA
    assert table.column("seq_lens").to_pylist() == [[1, 2, 3], [6]]
    assert table.column("sample_ids").to_pylist() == [[4, 9, -1], [2]]
    assert_rows_equal(rows_from_arrow(table), rows)
    pq.write_table(table, tmp_path / "rows.parquet")
    assert_rows_equal(rows_from_arrow(pq.read_table(tmp_path / "rows.parquet")), rows)


def test_round_trip_of_a_slice_and_of_chunked_tables():
    import pyarrow as pa

    rows = golden_rows()
    table = rows_to_arrow(rows)
    tail = rows_from_arrow(table.slice(1, 1))
    assert tail.sample_ids.tolist() == [2] and tail.segment_splits.tolist() == [0, 1]
    chunked = pa.concat_tables([table.slice(0, 1), table.slice(1, 1)])
    assert_rows_equal(rows_from_arrow(chunked), rows)


def test_positions_restart_at_every_segment():
    assert positions_from_seq_lens(np.array([3, 2, 1])).tolist() == [0, 1, 2, 0, 1, 0]

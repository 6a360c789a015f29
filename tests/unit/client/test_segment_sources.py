"""The source of each segment from its sample id (client/sources.py): the per-source signal a
training loop reweights from, without a column of its own."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packfeed.client import SourceInfo, first_sample_ids, per_source_sums, source_index


@pytest.mark.parametrize("ids, firsts, expected", [
    pytest.param([7, 3000, 6500, -1], [0, 3000, 6000], [0, 1, 2, -1], id="docstring"),
    pytest.param([2999, 3000, 5999, 6000], [0, 3000, 6000], [0, 1, 1, 2], id="edges"),
    pytest.param([-1, -1], [0], [-1, -1], id="padding-only"),
    pytest.param([], [0, 5], [], id="no-segments"),
])
def test_source_index_golden(ids, firsts, expected):
    assert source_index(np.asarray(ids, dtype=np.int64), firsts).tolist() == expected


@settings(max_examples=200, deadline=None)
@given(rows=st.lists(st.integers(1, 50), min_size=1, max_size=6), data=st.data())
def test_every_id_maps_to_the_source_holding_it(rows, data):
    firsts = np.concatenate(([0], np.cumsum(rows)[:-1]))
    owner = [s for s, n in enumerate(rows) for _ in range(n)]
    ids = data.draw(st.lists(st.integers(-1, sum(rows) - 1), max_size=40))
    got = source_index(ids, firsts)
    assert got.tolist() == [owner[i] if i >= 0 else -1 for i in ids]
    values = data.draw(st.lists(st.floats(0, 10), min_size=len(ids), max_size=len(ids)))
    sums = per_source_sums(values, got, len(rows))
    expected = [sum(v for v, s in zip(values, got.tolist()) if s == k) for k in range(len(rows))]
    assert np.allclose(sums, expected) and sums.shape == (len(rows),)


def test_the_source_table_comes_from_describe_or_a_packed_directory():
    info = [SourceInfo("chat", 3000, 4500, 0.6, 0), SourceInfo("instruct", 3000, 1500, 0.2, 3000)]
    assert first_sample_ids(info).tolist() == [0, 3000]
    packed = [{"name": "a", "rows": 10, "first_sample_id": 0}, {"name": "b", "rows": 4, "first_sample_id": 10}]
    assert first_sample_ids(packed).tolist() == [0, 10]
    with pytest.raises(ValueError, match="reports no source table"):  # an older server: every first id 0
        first_sample_ids([SourceInfo("a", 3, 3, 0.5), SourceInfo("b", 3, 3, 0.5)])
    with pytest.raises(ValueError, match="reports no source table"):
        first_sample_ids([])
    with pytest.raises(ValueError, match="one value per segment"):
        per_source_sums([1.0], [0, 1], 2)

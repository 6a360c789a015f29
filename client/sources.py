"""Which source each segment came from: the per-source signal of adaptive mixing. Numpy only.

A stream's global sample ids are laid out source after source (service/data/plan.py): source
i holds the ids [first_i, first_i + rows_i), and a sample repeated by a mixture keeps its id.
So the source of a segment is a lookup of its ``sample_ids`` entry in the stream's *source
table*, the sorted first ids, which the server reports (``PackedStream.describe().sources``,
each with ``first_sample_id``) and a packed directory keeps (``.packfeed/config.json``,
``plan.sources``). No column is added to the rows.

For first ids (0, 3000, 6000) the sample ids [7, 3000, 6500, -1] are sources [0, 1, 2, -1]:
padding segments (``PAD_SAMPLE_ID``, -1) get -1.

A training loop that reweights from per-source losses (docs: "Changing the mixture during a
run") sums a per-segment loss by source with ``per_source_sums``.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

import numpy as np


def first_sample_ids(sources: Iterable[Any]) -> np.ndarray:
    """The source table (int64 [S]) of ``StreamInfo.sources`` or of the ``plan`` ``sources``
    dicts of a packed directory's config.json. ValueError unless each source starts where the
    one before ends (first 0, then the running sum of ``rows``): a server or packed directory
    from before source tables reports every first id as 0."""
    entries = [(s["first_sample_id"], s["rows"]) if isinstance(s, Mapping) else (s.first_sample_id, s.rows)
               for s in sources]
    firsts = np.asarray([int(f) for f, _ in entries], dtype=np.int64)
    expected = np.concatenate(([0], np.cumsum([int(n) for _, n in entries], dtype=np.int64)[:-1]))
    if len(firsts) == 0 or not np.array_equal(firsts, expected):
        raise ValueError(f"the first sample ids {firsts.tolist()} are not the running sum of the sources' rows "
                         f"{[int(n) for _, n in entries]}: the server or packed directory reports no source table "
                         "(packfeed before issue 26)")
    return firsts


def source_index(sample_ids: np.ndarray | Sequence[int], first_ids: np.ndarray | Sequence[int]) -> np.ndarray:
    """The source (int64, index into the stream's sources) of each sample id; -1 for padding
    (ids < 0). ``first_ids``: the source table (``first_sample_ids``)."""
    ids = np.asarray(sample_ids, dtype=np.int64)
    firsts = np.asarray(first_ids, dtype=np.int64)
    out = np.searchsorted(firsts, ids, side="right") - 1
    return np.where(ids < 0, -1, out)


def per_source_sums(values: np.ndarray | Sequence[float], sources: np.ndarray | Sequence[int],
                    num_sources: int) -> np.ndarray:
    """float64 [num_sources]: ``values`` (one per segment, e.g. a segment's summed loss or its
    token count) added up by ``sources`` (``source_index``); padding (-1) is left out."""
    src = np.asarray(sources, dtype=np.int64)
    vals = np.asarray(values, dtype=np.float64)
    if src.shape != vals.shape:
        raise ValueError(f"one value per segment: {vals.shape} values for {src.shape} sources")
    keep = src >= 0
    return np.bincount(src[keep], weights=vals[keep], minlength=num_sources).astype(np.float64)

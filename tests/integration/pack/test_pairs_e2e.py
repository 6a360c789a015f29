"""Preference pairs end to end: the bundled preference JSONL packs with ``packfeed pack`` and
streams from ``packfeed serve`` like any other format, each pair's two segments in one row
(chosen, then rejected, one sample id), the stream's rows equal to the packed directory's, and
the stats count every pair."""

from __future__ import annotations

import json

import numpy as np
import pytest
from support.serve import REPO, TOKENIZER, ServerProcess

from packfeed.client.rows import PAIR_CHOSEN, PAIR_REJECTED, check_rows, concat_rows
from packfeed.client.stream import PackedStream
from packfeed.service.cli import main
from packfeed.service.packed.writer import read_packed_dir

pytestmark = pytest.mark.integration

PAIRS = str(REPO / "examples" / "preference.jsonl")
SEQ_LEN = 256
ARGS = [PAIRS, "--tokenizer", TOKENIZER, "--seq-len", str(SEQ_LEN), "--window-samples", "200"]


def pairs_of(rows) -> dict[int, int]:
    """sample id -> the row holding the pair, checking each pair is chosen then rejected there."""
    where = {}
    for r in range(rows.num_rows):
        roles, sids = rows.row_pair_roles(r), rows.row_sample_ids(r)
        for j in np.flatnonzero(roles == PAIR_CHOSEN):
            assert roles[j + 1] == PAIR_REJECTED and sids[j + 1] == sids[j]
            assert int(sids[j]) not in where, "a pair delivered twice"
            where[int(sids[j])] = r
    return where


def test_pairs_pack_and_serve_whole(ray_cluster, tmp_path):
    total = sum(1 for _ in open(PAIRS))
    out = tmp_path / "packed"
    assert main(["pack", *ARGS, "--output", str(out), "--validate"]) == 0
    stats = json.loads((out / ".packfeed" / "stats.json").read_text())
    assert stats["pairs"] == {"read": total, "packed": total, "truncated": 0, "dropped": 0}
    assert stats["formats"] == {"preference": total}
    packed = read_packed_dir(out)
    check_rows(packed, SEQ_LEN)
    assert len(pairs_of(packed)) == total and packed.num_rows < total / 2  # several pairs per row

    with ServerProcess([*ARGS, "--num-workers", "1"], log=tmp_path / "serve.log", state_dir=tmp_path / "state",
                       env={"RAY_ADDRESS": ""}) as server:
        with PackedStream(server.target, batch_rows=8) as stream:
            batches = list(stream)
    streamed = concat_rows([b.rows for b in batches])
    check_rows(streamed, SEQ_LEN)
    assert pairs_of(streamed).keys() == pairs_of(packed).keys()
    # the same config: the stream's rows are the packed directory's, pair_roles included
    real = np.flatnonzero(~np.concatenate([b.padding_rows for b in batches]))
    by_index = {int(streamed.row_index[i]): int(i) for i in real}
    assert sorted(by_index) == packed.row_index.tolist()
    for r in range(packed.num_rows):
        s = by_index[int(packed.row_index[r])]
        for name in ("input_ids", "labels", "position_ids"):
            np.testing.assert_array_equal(getattr(streamed, name)[s], getattr(packed, name)[r], err_msg=name)
        for column in ("row_seq_lens", "row_sample_ids", "row_pair_roles"):
            np.testing.assert_array_equal(getattr(streamed, column)(s), getattr(packed, column)(r), err_msg=column)

"""An --output holding a pack that never finished (killed: no stats.json; failed: its status) is
named as such when a second pack is refused there, with what --overwrite does (a pack does not
resume); a finished one keeps the plain message. On disk and on a store alike."""

from __future__ import annotations

import numpy as np
import pytest
from support.stores import local_or_store, memory_store  # noqa: F401 - the fixtures "where", "store"

from packfeed.client.rows import PackedRows
from packfeed.service.packed.location import previous_output
from packfeed.service.packed.writer import ParquetRowWriter, prepare_output

SEQ = 8


def rows(n: int) -> PackedRows:
    ids = np.arange(n * SEQ, dtype=np.int32).reshape(n, SEQ) + 1
    return PackedRows(input_ids=ids, labels=ids.copy(), position_ids=np.tile(np.arange(SEQ, dtype=np.int32), (n, 1)),
                      seq_lens=np.full(n, SEQ, np.int32), sample_ids=np.arange(n, dtype=np.int64),
                      segment_splits=np.arange(n + 1, dtype=np.int64), row_index=np.arange(n))


def pack(out: str, end: str) -> None:
    writer = ParquetRowWriter(out, seq_len=SEQ, config_hash="abc")
    writer.write(rows(3))
    if end == "killed":
        writer.abandon()  # what a killed run leaves: parts listed, no metadata
    else:
        writer.close(config={"config_hash": "abc"}, stats={"rows": 3}, status=end)


@pytest.mark.parametrize("end, state", [
    pytest.param("killed", "an interrupted pack: 1 part file(s) listed, no .packfeed/stats.json", id="killed"),
    pytest.param("failed: nothing packed", "a failed pack: status 'failed: nothing packed'", id="failed"),
])
def test_an_unfinished_output_is_named_when_refused(where, end, state, caplog):
    pack(where, end)
    assert previous_output(where)[0] is False and previous_output(where)[1].startswith(state)
    with pytest.raises(ValueError) as refused:
        prepare_output(where, inputs=[], overwrite=False)
    message = str(refused.value)
    assert "already holds packed output; pass --overwrite to replace it (it holds " + state in message
    assert message.endswith("a pack does not resume: --overwrite packs it again from the start)")
    with caplog.at_level("INFO", logger="packfeed"):
        prepare_output(where, inputs=[], overwrite=True)  # --overwrite replaces it, saying what it was
    assert [r.getMessage() for r in caplog.records if "--overwrite replaces it" in r.getMessage()][0].startswith(
        f"--output {where} holds {state}")
    assert previous_output(where) is None


def test_a_finished_output_keeps_the_plain_message(where, caplog):
    pack(where, "complete")
    assert previous_output(where) == (True, "a complete pack of 1 part file(s)")
    with pytest.raises(ValueError, match="already holds packed output; pass --overwrite to replace it$"):
        prepare_output(where, inputs=[], overwrite=False)
    with caplog.at_level("INFO", logger="packfeed"):
        prepare_output(where, inputs=[], overwrite=True)
    assert "--overwrite replaces it" not in caplog.text, "a finished output is replaced without a word"


def test_nothing_there_is_no_previous_output(where):
    assert previous_output(where) is None

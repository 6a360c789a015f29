"""An online mixture change end to end, as a data-parallel loop makes one over ``packfeed serve``:

* two ranks call ``set_mixture`` at the same step: one change, the same answer for both; bad
  weights raise INVALID_ARGUMENT and the stream goes on;
* the server's reader, ahead of the ranks with the old weights, packs again from the change's
  window with the new ones;
* the server is SIGKILLed after the change and started again on its state dir; the consumers
  resume from their saved state with another world size and read to the end: every row index
  exactly once, each row byte-identical to ``packfeed pack --config`` of the config with the
  recorded change written as a ``[[data.schedule]]`` entry;
* the change did something: the paused source gives no sample after it.

Small data (1,000 samples of the bundled corpus, windows of 100) and a 128-row server buffer, so
the reader is still windows short of the end when the change comes.
"""

from __future__ import annotations

import threading
from collections import Counter

import grpc
import pytest
from packfeed.client.mixture_record import schedule_toml
from packfeed.client.stream import PackedStream, StreamError
from support.serve import CORPUS, TOKENIZER, ServerProcess
from stream_client import row_digest, row_records

from packfeed.service.cli import main
from packfeed.service.packed.writer import read_packed_dir

pytestmark = pytest.mark.integration

ROWS = {"chat": 800, "stories": 200}  # the first rows of each bundled file; ids: chat 0..799, then stories
PAUSE_CHAT = {"chat": 0.0, "stories": 1.0}
AFTER_CHANGE = 30  # steps of 4 rows each rank reads after the change, before the SIGKILL, at least
MAX_AFTER_CHANGE = 60  # ... and at most: rows enough left for the resumed reader (~100 steps in all)


def steps(ranks: list[PackedStream], n: int) -> list[list]:
    """The rows of ``n`` steps of every rank, step by step as a data-parallel loop reads (a rank
    far ahead of another would wait for the server's buffer)."""
    return [row for _ in range(n) for stream in ranks for row in row_records(next(stream))[0]]


def write_config(directory, schedule: str = "") -> str:
    lines = [f'[data]\ntokenizer = "{TOKENIZER}"\nseq_len = 128\nwindow_samples = 100\n']
    for name, n in ROWS.items():
        source = next(p for p in CORPUS if p.endswith(f"{name}.jsonl"))
        path = directory / f"{name}.jsonl"
        with open(source) as f:
            path.write_text("".join(line for _, line in zip(range(n), f)))
        lines.append(f'[[data.sources]]\nname = "{name}"\npaths = ["{path}"]\n')
    config = directory / ("scheduled.toml" if schedule else "mix.toml")
    config.write_text("\n".join(lines) + schedule)
    return str(config)


@pytest.mark.timeout(420)
def test_an_online_change_survives_a_sigkill_and_equals_the_scheduled_pack(ray_cluster, tmp_path):
    server = ServerProcess(["--config", write_config(tmp_path), "--buffer-rows", "128", "--num-workers", "1"],
                           log=tmp_path / "serve.log", state_dir=tmp_path / "state", env={"RAY_ADDRESS": ""})
    got: list[list] = []
    with server:
        ranks = [PackedStream(server.target, rank=r, world_size=2, batch_rows=2) for r in range(2)]
        got += steps(ranks, 3)
        answers: list[dict] = []
        threads = [threading.Thread(target=lambda s=s: answers.append(s.set_mixture(PAUSE_CHAT))) for s in ranks]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert len(answers) == 2 and answers[0] == answers[1], "the calls of one step: one change, one answer"
        change = answers[0]
        assert change["step"] == 3 and change["weights"] == PAUSE_CHAT and change["schedule_index"] == 0
        with pytest.raises(StreamError) as bad:
            ranks[0].set_mixture({"chat": -1.0, "stories": 1.0})
        assert bad.value.code == grpc.StatusCode.INVALID_ARGUMENT and "finite number >= 0" in bad.value.details
        # The stream goes on past the change (~40 rows a window): the reader packs again from the
        # change's window once it gets there. Where the change lands depends on how far ahead the
        # reader had planned when it came (window 3 on an idle machine, 5 beside other work), so
        # the ranks read on until the server says it got there, not a fixed number of steps.
        repacked = f"the mixture changed from window {change['window']} on: packing from there"
        after = 0
        while after < AFTER_CHANGE or repacked not in server.log.read_text():
            assert after < MAX_AFTER_CHANGE, f"the reader never reached window {change['window']}"
            got += steps(ranks, 1)
            after += 1
        state = ranks[0].state_dict()
        assert state == ranks[1].state_dict() and state["cursor"] == 4 * (3 + after)
        assert state["mixture"] == [{k: v for k, v in change.items() if k != "schedule_index"}]
        for stream in ranks:
            stream.close()
        first_log = server.log.read_text()
        server.kill()  # after the change: it lives on in the state dir only
        server.start()
        with PackedStream(server.target, rank=0, world_size=1, batch_rows=4, state=state) as resumed:
            got += [row for batch in resumed for row in row_records(batch)[0]]
            info = resumed.describe()
    assert "replaying the mixture change of step 3" in server.log.read_text()[len(first_log):]
    assert [dict(c, weights=dict(c["weights"])) for c in info.mixture_changes] == state["mixture"]

    out = tmp_path / "packed"  # the recorded changes as the config's schedule
    assert main(["pack", "--config", write_config(tmp_path, "\n" + schedule_toml(state["mixture"])),
                 "--output", str(out)]) == 0
    pack_rows = read_packed_dir(out)
    reference = {int(pack_rows.row_index[r]): row_digest(pack_rows, r) for r in range(pack_rows.num_rows)}
    counts = Counter(index for index, _, _ in got)
    assert sorted(counts) == list(range(pack_rows.num_rows)) and set(counts.values()) == {1}, "every row exactly once"
    assert all(digest == reference[index] for index, digest, _ in got), "rows equal the scheduled pack's"
    chat = [i for _, _, ids in got for i in ids if i < ROWS["chat"]]
    assert 0 < len(set(chat)) < ROWS["chat"], "chat paused part-way: fewer than its 800 samples"
    last_chat_row = max(index for index, _, ids in got if any(i < ROWS["chat"] for i in ids))
    assert last_chat_row < max(counts), "the rows after the change hold no chat sample"

"""An online mixture change end to end, as a data-parallel loop makes one over ``packfeed serve``:

* two ranks call ``set_mixture`` a quarter into a stream of 40 windows, the server's buffer the
  smallest allowed (128 rows) and its reader done with every window (the old rule refused
  there: "every window of the stream is planned already"): one change, the same answer for
  both, from the first window after the ranks' cursor (issue 41: at most one window from the
  consumers; the answer says which window holds them); bad weights raise INVALID_ARGUMENT and
  the stream goes on;
* the server drops what it had packed and sent ahead with the old weights and packs again from
  the change's window; the clients drop their read-ahead and read on from their cursor;
* the server is SIGKILLed after the change and started again on its state dir; the consumers
  resume from their saved state with another world size and read to the end: every row index
  exactly once, each row byte-identical to ``packfeed pack --config`` of the config with the
  recorded change written as a ``[[data.schedule]]`` entry;
* the change did something: the paused source gives no sample after it.

Small data (1,000 samples of the bundled corpus, windows of 25: ~10 rows each, 400 in all).
"""

from __future__ import annotations

import threading
import time
from collections import Counter

import grpc
import pytest
from packfeed.client.mixture_record import schedule_toml
from packfeed.client.stream import PackedStream, StreamError
from support.serve import CORPUS, TOKENIZER, ServerProcess
from support.stream_client import row_digest, row_records

from packfeed.service.cli import main
from packfeed.service.packed.writer import read_packed_dir

pytestmark = pytest.mark.integration

ROWS = {"chat": 800, "stories": 200}  # the first rows of each bundled file; ids: chat 0..799, then stories
PAUSE_CHAT = {"chat": 0.0, "stories": 1.0}
WINDOW = 25  # samples: 40 windows
QUARTER = 25  # steps of 4 rows (2 ranks x 2 rows) before the change: ~100 of ~400 rows
AFTER_CHANGE = 30  # steps each rank reads after the change, before the SIGKILL


def steps(ranks: list[PackedStream], n: int) -> list[list]:
    """The rows of ``n`` steps of every rank, step by step as a data-parallel loop reads (a rank
    far ahead of another would wait for the server's buffer)."""
    return [row for _ in range(n) for stream in ranks for row in row_records(next(stream))[0]]


def wait_until_planned(stream: PackedStream, timeout: float = 60.0) -> int:
    """The stream's rows, once the server's reader reached its end (Describe knows its length)."""
    deadline = time.monotonic() + timeout
    while (total := stream.describe().total_rows) is None:
        assert time.monotonic() < deadline, "the server's reader never packed the whole stream ahead"
        time.sleep(0.2)
    return total


def write_config(directory, schedule: str = "") -> str:
    lines = [f'[data]\ntokenizer = "{TOKENIZER}"\nseq_len = 128\nwindow_samples = {WINDOW}\n']
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
        got += steps(ranks, QUARTER)
        total = wait_until_planned(ranks[0])  # the reader has packed (and gRPC sent) every window ahead of the ranks
        answers: list[dict] = []
        threads = [threading.Thread(target=lambda s=s: answers.append(s.set_mixture(PAUSE_CHAT))) for s in ranks]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert len(answers) == 2 and answers[0] == answers[1], "the calls of one step: one change, one answer"
        change = answers[0]
        assert change["step"] == QUARTER and change["weights"] == PAUSE_CHAT and change["schedule_index"] == 0
        holding = change["consumer_window"]  # the window of the ranks' cursor, a quarter in
        assert 0.15 < holding / 40 < 0.35 and 0.15 < 4 * QUARTER / total < 0.35, "a quarter in"
        assert change["window"] - holding <= 1, "within one window of the consumers"
        assert 0 < change["lag_samples"] <= WINDOW + 1 and change["from_sample"] == WINDOW * change["window"]
        with pytest.raises(StreamError) as bad:
            ranks[0].set_mixture({"chat": -1.0, "stories": 1.0})
        assert bad.value.code == grpc.StatusCode.INVALID_ARGUMENT and "finite number >= 0" in bad.value.details
        got += steps(ranks, AFTER_CHANGE)
        state = ranks[0].state_dict()
        assert state == ranks[1].state_dict() and state["cursor"] == 4 * (QUARTER + AFTER_CHANGE)
        assert state["mixture"] == [{k: change[k] for k in ("step", "from_sample", "window", "weights")}]
        assert f"windows {change['window']}.." in server.log.read_text(), "read-ahead packed again"
        for stream in ranks:
            stream.close()
        first_log = server.log.read_text()
        server.kill()  # after the change: it lives on in the state dir only
        server.start()
        with PackedStream(server.target, rank=0, world_size=1, batch_rows=4, state=state) as resumed:
            got += [row for batch in resumed for row in row_records(batch)[0]]
            info = resumed.describe()
    assert f"replaying the mixture change of step {QUARTER}" in server.log.read_text()[len(first_log):]
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

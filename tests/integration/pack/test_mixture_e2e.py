"""Mixtures and epochs end to end, as a user runs them: one TOML config with three sources of
the bundled corpus (chat repeat 1.5, instructions repeat 0.5, stories repeat 1) and 2 epochs,

* packed by ``packfeed pack --config``: every source's count per epoch exact, each sample as
  many times as its repeat says over the run, realised shares equal to the planned ones, the
  sources table and the rows of each epoch in stats.json; ``packfeed inspect`` prints them,
  epochs numbered from 1, with each source's share of the tokens (not its share of the samples);
* served by ``packfeed serve --config`` to 2 ranks; the server SIGKILLed mid-stream (in epoch
  2) and started again; the consumers resumed from their saved cursor with world size 3: every
  row index delivered exactly once, each row byte-identical to the pack output; Describe
  reports the epochs, the sources and the rows of each epoch;
* the packed directory served as it is (``packfeed serve DIR``, no Ray): the same rows again;
* a schedule (``[[data.schedule]]``, issue 26) packed with 1 and with 2 workers: the same
  bytes; the old shares before ``from_sample``, the new ones after, window by window, read back
  from the rows' sample ids through the source table of the packed directory.
"""

from __future__ import annotations

import json
import threading
from collections import Counter

import pytest
from packfeed.client.stream import PackedStream
from support.serve import CORPUS, TOKENIZER, ServerProcess
from support.stream_client import row_digest, row_records

from packfeed.client.sources import first_sample_ids, source_index
from packfeed.service.cli import main
from packfeed.service.data.config import DataConfig
from packfeed.service.data.plan import build_plan
from packfeed.service.packed.writer import read_packed_dir

pytestmark = pytest.mark.integration

SOURCES = {"chat": 1.5, "instruct": 0.5, "stories": 1.0}  # name -> repeat
ROWS = {"chat": 3000, "instruct": 3000, "stories": 1500}  # rows of each bundled file
EPOCHS = 2


@pytest.fixture(scope="module")
def config_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("mix") / "mix.toml"
    files = {name: next(p for p in CORPUS if p.endswith(f"{name}.jsonl")) for name in SOURCES}
    lines = [f'[data]\ntokenizer = "{TOKENIZER}"\nseq_len = 512\nepochs = {EPOCHS}\nwindow_samples = 1000\n']
    for name, repeat in SOURCES.items():
        lines.append(f'[[data.sources]]\nname = "{name}"\npaths = ["{files[name]}"]\nrepeat = {repeat}\n')
    path.write_text("\n".join(lines))
    return path


@pytest.fixture(scope="module")
def packed(ray_cluster, config_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("packed") / "out"
    assert main(["pack", "--config", str(config_file), "--output", str(out)]) == 0
    rows = read_packed_dir(out)
    stats = json.loads((out / ".packfeed" / "stats.json").read_text())
    return out, rows, stats


def test_pack_delivers_every_source_its_share_in_every_epoch(packed, capsys):
    out, rows, stats = packed
    per_epoch = {name: round(r * ROWS[name]) for name, r in SOURCES.items()}
    total = sum(per_epoch.values())
    by_name = {s["name"]: s for s in stats["sources"]}
    for name, count in per_epoch.items():
        s = by_name[name]
        assert [e["samples_read"] for e in s["epochs"]] == [count] * EPOCHS, name
        assert s["samples_packed"] == EPOCHS * count and s["skipped_total"] == 0
        assert s["planned_share"] == pytest.approx(count / total)
        assert s["realised_share"] == pytest.approx(count / total)
        assert s["realised_token_share"] == pytest.approx(s["tokens"] / stats["tokens"])
        assert [e["epoch"] for e in s["epochs"]] == list(range(1, EPOCHS + 1)), "epochs count from 1, as the README's"
    assert sum(stats["epoch_rows"]) == stats["rows"] == rows.num_rows and len(stats["epoch_rows"]) == EPOCHS
    # the report (inspect prints the pack's): a line per source and epoch, shares of samples and of tokens
    capsys.readouterr()
    assert main(["inspect", str(out)]) == 0
    report = capsys.readouterr().out
    assert f"rows per epoch               {stats['epoch_rows'][0]:,} (epoch 1), " in report
    for s in stats["sources"]:
        lines = [line.split() for line in report.splitlines() if line.startswith(s["name"] + " ")]
        assert [line[1] for line in lines] == ["all", "1", "2"], report
        assert lines[0][-3:] == [f"{100 * x:.2f}%" for x in (s["planned_share"], s["realised_share"],
                                                            s["realised_token_share"])]
    stories = by_name["stories"]  # long texts: 20% of the samples, far more of the tokens
    assert stories["realised_token_share"] > 2 * stories["realised_share"], stories
    # every sample as many times as its repeat says, over both epochs (ids: chat, instruct, stories)
    seen = Counter(int(s) for s in rows.sample_ids if s >= 0)
    first = {"chat": 0, "instruct": 3000, "stories": 6000}
    for name, repeat in SOURCES.items():
        times = Counter(seen[first[name] + i] for i in range(ROWS[name]))
        assert times == {int(repeat * EPOCHS): ROWS[name]}, (name, times)


def test_serve_survives_a_sigkill_and_a_new_world_size_with_the_pack_rows(packed, config_file, tmp_path):
    _, pack_rows, stats = packed
    reference = {int(pack_rows.row_index[r]): row_digest(pack_rows, r) for r in range(pack_rows.num_rows)}
    total = pack_rows.num_rows
    server = ServerProcess(["--config", str(config_file), "--buffer-rows", "128", "--num-workers", "1"],
                           log=tmp_path / "serve.log", state_dir=tmp_path / "state", env={"RAY_ADDRESS": ""})
    got: list[list] = []
    with server:
        first = [PackedStream(server.target, rank=r, world_size=2, batch_rows=4) for r in range(2)]
        k = (stats["epoch_rows"][0] + total // 4) // 8  # a step in the second epoch
        for stream in first:  # ranks read k steps each
            for _, batch in zip(range(k), stream):
                got += row_records(batch)[0]
        state = first[0].state_dict()
        assert state == first[1].state_dict() and state["cursor"] == 8 * k > stats["epoch_rows"][0]
        for stream in first:
            stream.close()
        server.kill()  # the whole process group, as a container dies
        server.start()
        second = [PackedStream(server.target, rank=r, world_size=3, batch_rows=3, state=state) for r in range(3)]
        results: list[list] = [[] for _ in range(3)]

        def read(r: int) -> None:
            for batch in second[r]:
                results[r] += row_records(batch)[0]

        threads = [threading.Thread(target=read, args=(r,)) for r in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        info = second[0].describe()
        for stream in second:
            stream.close()
    got += [row for part in results for row in part]
    counts = Counter(index for index, _, _ in got)
    assert sorted(counts) == list(range(total)) and set(counts.values()) == {1}, "every row exactly once"
    assert all(digest == reference[index] for index, digest, _ in got), "rows equal the pack output"
    assert info.epochs == EPOCHS and list(info.epoch_rows) == stats["epoch_rows"] and info.total_rows == total
    assert [(s.name, round(s.planned_share, 3)) for s in info.sources] == [("chat", 0.6), ("instruct", 0.2),
                                                                             ("stories", 0.2)]


def test_a_packed_directory_is_served_as_it_is(packed, tmp_path):
    out, pack_rows, stats = packed
    server = ServerProcess([str(out)], log=tmp_path / "serve.log", state_dir=tmp_path / "state")
    with server, PackedStream(server.target, batch_rows=16) as stream:
        got = [row for batch in stream for row in row_records(batch)[0]]
        info = stream.describe()
    assert "Ray: started" not in server.log.read_text(), "a packed directory needs no Ray"
    assert [digest for _, digest, _ in got] == [row_digest(pack_rows, r) for r in range(pack_rows.num_rows)]
    assert info.config_hash == json.loads((out / ".packfeed" / "config.json").read_text())["config_hash"]
    assert list(info.epoch_rows) == stats["epoch_rows"] and info.total_rows == pack_rows.num_rows


SCHEDULE_AT = 900  # from sample 900 (inside window 3, of 250 samples): chat paused, stories 3x instruct


def test_a_scheduled_pack_has_each_stage_its_shares_whatever_the_workers(ray_cluster, tmp_path):
    files = {name: next(p for p in CORPUS if p.endswith(f"{name}.jsonl")) for name in SOURCES}
    config = tmp_path / "schedule.toml"
    config.write_text(
        f'[data]\ntokenizer = "{TOKENIZER}"\nseq_len = 512\nsamples_per_epoch = 2000\nwindow_samples = 250\n'
        + "".join(f'[[data.sources]]\nname = "{n}"\npaths = ["{files[n]}"]\nweight = 1\n' for n in SOURCES)
        + f"[[data.schedule]]\nfrom_sample = {SCHEDULE_AT}\nweights = {{ chat = 0, instruct = 1, stories = 3 }}\n")
    outs = []
    for workers in (1, 2):
        out = tmp_path / f"out-{workers}"
        assert main(["pack", "--config", str(config), "--output", str(out), "--num-workers", str(workers)]) == 0
        outs.append(out)
    rows = [read_packed_dir(out) for out in outs]
    assert rows[0].num_rows == rows[1].num_rows and all(
        row_digest(rows[0], r) == row_digest(rows[1], r) for r in range(rows[0].num_rows)), "1 and 2 workers: same bytes"
    meta = json.loads((outs[0] / ".packfeed" / "config.json").read_text())
    stats = json.loads((outs[0] / ".packfeed" / "stats.json").read_text())
    stage = meta["plan"]["stages"][1]
    # windows start at samples 0, 249, 501, 750, 1001, ...: window 4 is the first at or after 900
    assert (stage["from_sample"], stage["window"], stage["start_sample"]) == (SCHEDULE_AT, 4, 1001)
    # every segment's source from the rows' sample ids and the packed directory's source table
    plan = build_plan(DataConfig.from_dict(meta["data"]))
    window_of = {int(i): k for k in range(plan.num_windows) for i in plan.window(k).sample_ids()}
    ids = rows[0].sample_ids[rows[0].sample_ids >= 0]
    sources = source_index(ids, first_sample_ids(meta["plan"]["sources"]))
    per_window = Counter((window_of[int(i)], int(s)) for i, s in zip(ids, sources))
    for k in range(plan.num_windows):
        got = [per_window[(k, s)] for s in range(3)]
        assert got == plan.window_counts(k).tolist(), k
        shares = [1 / 3] * 3 if k < 4 else [0, 1 / 4, 3 / 4]
        assert all(abs(n - 250 * x) < 1 for n, x in zip(got, shares)), (k, got)
    by_name = {s["name"]: s for s in stats["sources"]}
    assert [st["samples_packed"] for st in by_name["chat"]["stages"]] == [334, 0]
    assert by_name["stories"]["stages"][1]["share_samples"] == pytest.approx(0.75, abs=0.001)

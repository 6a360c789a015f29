"""An online mixture change lands where the consumers are, not where the reader got to (issue 41).

A fake packing reader over the real plan of test_mixture_changes (2 sources, 24 windows of 10
samples; a window's rows say which window and how many ``web`` samples its plan put there, and
their number depends on it, so a stale window's rows and first rows are both caught) feeds a
RowHub whose buffer holds the whole stream: the reader has planned every window before the
ranks read a quarter of it, which is where the old rule (the first window not planned) refused
the change. Checked, over where the consumers are:

* the change applies from the first window starting at or after the callers' cursor (at most
  one window from them), and the answer says which window holds the cursor;
* every row the consumers read is the stream of the recorded schedule: the old weights before
  the cursor, the new ones from the change's window, rows numbered on with no gap or repeat;
* a restarted server replays the change from its manifest (the forgotten windows are gone);
* the gRPC servicer ends a call that had sent rows past the change (ABORTED: the client reads
  again from its cursor), serves the new rows to a client that recorded the change, and refuses
  one that read past it without recording it (FAILED_PRECONDITION).
"""

from __future__ import annotations

import dataclasses
import time

import grpc
import numpy as np
import pytest

from packfeed.client.mixture_record import change_message, change_record
from packfeed.client.v1 import packfeed_pb2
from packfeed.client.wire import decode_batch_bytes
from packfeed.service.delivery.assign import step_rows
from packfeed.service.delivery.hub import RowHub
from packfeed.service.delivery.manifest import Manifest
from packfeed.service.delivery.mixture_changes import apply_change, read_with_changes
from packfeed.service.delivery.row_stream import RowStream, mixture_control
from packfeed.service.delivery.server import PackFeedService
from support.streams import plain_rows
from test_mixture_changes import NEW, WINDOW, planned  # noqa: F401  (the module's plan fixture)
from test_servicer import Aborted, FakeContext

WORLD, BATCH = 2, 2  # two ranks reading 2-row batches: 4 rows a step


def window_rows(plan, k: int, first: int):
    """Window ``k``'s rows under ``plan``: 2-4 rows, every id 1000 k + its web samples + 1."""
    web = int(plan.window_counts(k)[0])
    rows = plain_rows(first, 2 + web % 3)
    ids = np.full_like(rows.input_ids, 1000 * k + web + 1)
    return dataclasses.replace(rows, input_ids=ids, labels=ids.copy())


def plan_reader(config, plan, window: int, first_row: int):
    for k in range(window, plan.num_windows):
        rows = window_rows(plan, k, first_row)
        yield k, rows
        first_row += rows.num_rows


def stream_of(plan) -> list[int]:
    """Each row's id (its window and web count) over the whole stream of ``plan``."""
    return [int(rows.input_ids[r, 0]) for _, rows in plan_reader(None, plan, 0, 0) for r in range(rows.num_rows)]


def hub_of(planned, manifest):  # noqa: F811
    config, plan = planned
    control = mixture_control(config, plan)
    control.attach(manifest)
    hub = RowHub(lambda w, r: read_with_changes(control, plan_reader, w, r), manifest, capacity=256, poll_s=0.02)
    return control, hub


def read_steps(consumers, steps: range, got: dict[int, int]) -> None:
    for step in steps:
        for rank, consumer in enumerate(consumers):
            wanted = step_rows(rank, WORLD, BATCH, 0, step)
            rows, total = consumer.rows(wanted.rows, through=wanted.cursor - 1)
            for r in range(0 if rows is None else rows.num_rows):
                got[int(rows.row_index[r])] = int(rows.input_ids[r, 0])


def wait_for_the_end(hub: RowHub) -> None:
    deadline = time.monotonic() + 20
    while hub.total_rows is None:
        assert time.monotonic() < deadline, "the reader never reached the end"
        time.sleep(0.01)


@pytest.mark.parametrize("steps", [1, 4, 5, 11])
def test_a_change_applies_from_the_first_window_after_the_consumers(planned, tmp_path, steps):  # noqa: F811
    config, plan = planned
    path = tmp_path / "manifest.json"
    control, hub = hub_of(planned, Manifest("key", path))
    old = stream_of(plan)
    firsts = np.cumsum([0] + [window_rows(plan, k, 0).num_rows for k in range(plan.num_windows)])
    got: dict[int, int] = {}
    consumers = [hub.consumer() for _ in range(WORLD)]
    try:
        read_steps(consumers, range(steps), got)
        wait_for_the_end(hub)  # every window planned: the old rule had no window left to change
        cursor = steps * WORLD * BATCH
        answer = apply_change(control, hub, steps, NEW, cursor)
        change = answer.change
        holding = int(np.searchsorted(firsts, cursor, side="right")) - 1
        assert change.window == max(1, holding if firsts[holding] == cursor else holding + 1)
        assert answer.consumer_window == holding and change.window - holding <= 1, "within one window"
        assert 0 <= change.from_sample - answer.consumer_sample <= WINDOW + 1
        new_total = len(stream_of(control.current()[2]))
        assert new_total != len(old)  # so an end the hub knows tells which plan it came from
        # the end of the old plan is forgotten (the new reader, a thread, may have reached the new end already)
        assert hub.total_rows in (None, new_total), "the end of the old plan is forgotten"
        read_steps(consumers, range(steps, 10_000), got)
        assert hub.total_rows is not None
        read_steps(consumers, range(len(got) // (WORLD * BATCH) + 1), {})  # nothing left over
    finally:
        hub.close()
    new = stream_of(control.current()[2])
    assert sorted(got) == list(range(len(new))), "every row once, numbered on"
    assert [got[r] for r in range(len(new))] == new, "the stream of the recorded schedule"
    assert old[:cursor] == new[:cursor] and old[cursor:] != new[cursor:], "the change changed what was read ahead"
    replayed = mixture_control(config, plan)
    again = Manifest("key", path)
    replayed.attach(again)
    assert replayed.changes == [change] and stream_of(replayed.current()[2]) == new
    new_plan = control.current()[2]
    new_firsts = np.cumsum([0] + [window_rows(new_plan, k, 0).num_rows for k in range(plan.num_windows)])
    assert {w: int(new_firsts[w]) for w in again.first_row} == again.first_row, "no stale first row on disk"
    assert again.total_rows == len(new)


def service_of(planned, manifest=None):  # noqa: F811
    config, plan = planned
    control, hub = hub_of(planned, manifest or Manifest("key"))
    stream = RowStream(
        config_hash="cafe", seq_len=8, tokenizer_name="-", vocab_size=16, pad_id=0, epochs=plan.epochs,
        windows_per_epoch=plan.windows_per_epoch, sources=plan.summary(), samples_per_epoch=plan.samples_per_epoch,
        manifest_key="key", open_reader=lambda w, r: iter(()), pack_window=None, mixture=control,
    )
    return PackFeedService(hub, stream, max_batch_rows=8)


def request(rank: int, cursor: int, changes=()) -> bytes:
    return packfeed_pb2.StreamRequest(rank=rank, world_size=WORLD, batch_rows=BATCH, cursor=cursor,
                                      mixture_changes=[change_message(c) for c in changes]).SerializeToString()


def test_the_servicer_ends_calls_that_sent_stale_rows_and_serves_the_new_ones(planned):  # noqa: F811
    service = service_of(planned)
    calls = [service.stream_batches(request(rank, 0), FakeContext()) for rank in range(WORLD)]
    try:
        for _ in range(12):  # gRPC sends ahead: 12 steps sent, the clients read 3
            for call in calls:
                next(call)
        reply = packfeed_pb2.MixtureChange.FromString(service.set_mixture(
            packfeed_pb2.SetMixtureRequest(step=3, weights=NEW, cursor=12).SerializeToString(), FakeContext()))
        change = change_record(reply)
        first = service.hub.manifest.first_row[change["window"]]
        assert 12 <= first < 48 and reply.consumer_window <= change["window"] <= reply.consumer_window + 1
        for call in calls:
            with pytest.raises(Aborted) as ended:
                next(call)
            assert ended.value.code == grpc.StatusCode.ABORTED and f"from row {first:,}" in ended.value.details
        with pytest.raises(Aborted) as refused:
            next(service.stream_batches(request(0, 48), FakeContext()))  # read past it, not recorded
        assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION and "set_mixture" in refused.value.details
        got = {}
        for rank in range(WORLD):
            for message in service.stream_batches(request(rank, 12, [change]), FakeContext()):
                batch = decode_batch_bytes(message)
                for r in np.flatnonzero(~batch.padding_rows):
                    got[int(batch.rows.row_index[r])] = int(batch.rows.input_ids[r, 0])
        next(service.stream_batches(request(0, 0), FakeContext()))  # a resume from before the change: goes on
    finally:
        service.hub.close()
    new = stream_of(service.meta.mixture.current()[2])
    assert sorted(got) == list(range(12, len(new))) and [got[r] for r in sorted(got)] == new[12:]


def test_the_train_feeder_changes_the_mixture_after_the_steps_its_ranks_asked_for(planned):  # noqa: F811
    """``packfeed train``'s hook goes through RowFeeder.set_mixture: the change applies from the
    first window after the rows of the highest step any rank asked for, with the reader at the
    end of the stream, and the ranks then read the recorded schedule's stream."""
    from packfeed.service.delivery.feeder import RowFeeder

    config, plan = planned
    control = mixture_control(config, plan)
    manifest = Manifest("key")
    control.attach(manifest)
    feeder = RowFeeder(lambda w, r: read_with_changes(control, plan_reader, w, r), manifest, world_size=WORLD,
                       grad_accum=1, micro_rows=BATCH, seq_len=8, pad_id=0, config_hash="cafe", mixture=control)
    firsts = np.cumsum([0] + [window_rows(plan, k, 0).num_rows for k in range(plan.num_windows)])
    got: dict[int, int] = {}

    def read(step: int) -> bool:
        batches = [feeder.get_step(rank, step) for rank in range(WORLD)]
        for rows in (r for batch in batches if batch is not None for r in batch):
            for r in np.flatnonzero(rows.row_index >= 0):
                got[int(rows.row_index[r])] = int(rows.input_ids[r, 0])
        return all(batch is not None for batch in batches)

    steps = 6
    try:
        for step in range(steps):
            assert read(step)
        wait_for_the_end(feeder.hub)
        answer = feeder.set_mixture(steps, NEW)
        cursor = steps * WORLD * BATCH
        holding = int(np.searchsorted(firsts, cursor, side="right")) - 1
        assert answer["window"] == (holding if firsts[holding] == cursor else holding + 1)
        assert answer["consumer_window"] == holding and 0 <= answer["lag_samples"] <= WINDOW + 1
        step = steps
        while read(step):
            step += 1
    finally:
        feeder.hub.close()
    new = stream_of(control.current()[2])
    assert sorted(got) == list(range(len(new))) and [got[r] for r in range(len(new))] == new
    assert new != stream_of(plan), "the change changed the rows after the ranks' cursor"

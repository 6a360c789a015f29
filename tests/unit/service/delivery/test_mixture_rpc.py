"""SetMixture and the mixture checks of the gRPC servicer, in-process (a fake context, no socket),
and the client's record of the changes (client/mixture_record.py, StreamState).

Checked: the ranks of one step get one change and the same answer; bad weights are
INVALID_ARGUMENT and change nothing; a packed directory's stream refuses with a reason
(FAILED_PRECONDITION); Describe lists the changes; a resumed client whose state records a change
this server did not make is refused (FAILED_PRECONDITION) and one whose changes it made goes on;
the state keeps its changes through JSON and old records load unchanged; the train feeder's
hook answers as the RPC does, and a resumed run takes its checkpoint's changes.
"""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from packfeed.client.mixture_record import change_message, change_record, with_change
from packfeed.client.state import StreamState
from packfeed.client.v1 import packfeed_pb2
from packfeed.service.delivery.hub import RowHub
from packfeed.service.delivery.manifest import Manifest
from packfeed.service.delivery.mixture_changes import MixtureRefused
from packfeed.service.delivery.row_stream import RowStream, mixture_control
from packfeed.service.delivery.server import PackFeedService
from packfeed.service.delivery.feeder import RowFeeder, load_manifest
from test_mixture_changes import NEW, planned  # noqa: F401  (the module's plan fixture)
from test_servicer import Aborted, FakeContext

SEQ_LEN = 8


def service_of(planned, *, packed: bool = False, manifest: Manifest | None = None):  # noqa: F811
    """A servicer over a stream of ``planned`` whose reader is never started (no rows needed)."""
    config, plan = planned
    manifest = manifest or Manifest("key")
    control = None if packed else mixture_control(config, plan)
    if control is not None:
        control.attach(manifest)
    stream = RowStream(
        config_hash="cafe", seq_len=SEQ_LEN, tokenizer_name="-", vocab_size=16, pad_id=0, epochs=plan.epochs,
        windows_per_epoch=plan.windows_per_epoch, sources=plan.summary(), samples_per_epoch=plan.samples_per_epoch,
        manifest_key="key", open_reader=lambda w, r: iter(()), pack_window=None, mixture=control,
    )
    return PackFeedService(RowHub(lambda w, r: iter(()), manifest), stream, max_batch_rows=8)


def set_mixture(service, step: int, weights: dict) -> packfeed_pb2.MixtureChange:
    request = packfeed_pb2.SetMixtureRequest(step=step, weights=weights).SerializeToString()
    return packfeed_pb2.MixtureChange.FromString(service.set_mixture(request, FakeContext()))


def aborted(calling) -> Aborted:
    with pytest.raises(Aborted) as caught:
        calling()
    return caught.value


def test_the_ranks_of_one_step_get_one_change_and_describe_lists_it(planned):  # noqa: F811
    service = service_of(planned)
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda r: set_mixture(service, 3, {"web": float(r), "code": 1.0}), range(4)))
    assert len({a.SerializeToString(deterministic=True) for a in answers}) == 1
    change = change_record(answers[0])
    assert (change["step"], change["window"], change["from_sample"]) == (3, 1, 10) and answers[0].schedule_index == 0
    info = packfeed_pb2.StreamInfo.FromString(service.describe(b"", FakeContext()))
    assert [change_record(c) for c in info.mixture_changes] == [change]


@pytest.mark.parametrize("weights", [{"web": -1.0, "code": 1.0}, {"web": 0.0, "code": 0.0}, {"webb": 1.0, "code": 1.0},
                                     {"web": float("nan"), "code": 1.0}])
def test_bad_weights_are_invalid_argument_and_change_nothing(planned, weights):  # noqa: F811
    service = service_of(planned)
    refused = aborted(lambda: set_mixture(service, 1, weights))
    assert refused.code == grpc.StatusCode.INVALID_ARGUMENT and "mixture not changed: mixture weights" in refused.details
    assert service.meta.mixture.changes == [] and service.hub.manifest.mixture == []


def test_a_packed_directory_refuses_with_a_reason(planned):  # noqa: F811
    refused = aborted(lambda: set_mixture(service_of(planned, packed=True), 1, NEW))
    assert refused.code == grpc.StatusCode.FAILED_PRECONDITION and "packed directory" in refused.details
    state = StreamState(mixture=({"step": 1, "from_sample": 10, "window": 1, "weights": NEW},))
    request = packfeed_pb2.StreamRequest(rank=0, world_size=1, batch_rows=2,
                                         mixture_changes=[change_message(c) for c in state.mixture])
    checked = aborted(lambda: next(service_of(planned, packed=True).stream_batches(request.SerializeToString(),
                                                                                   FakeContext())))
    assert checked.code == grpc.StatusCode.FAILED_PRECONDITION and "packed directory" in checked.details


def test_a_resumed_client_must_hold_changes_this_server_made(planned):  # noqa: F811
    service = service_of(planned)
    made = change_record(set_mixture(service, 2, NEW))

    def check(*changes):
        request = packfeed_pb2.StreamRequest(rank=0, world_size=1, batch_rows=2,
                                             mixture_changes=[change_message(c) for c in changes])
        service._check(request, FakeContext())

    check()
    check(made)  # the same change: goes on
    for other in ({**made, "step": 9}, {**made, "weights": {"web": 1.0, "code": 1.0}}):
        refused = aborted(lambda: check(other))
        assert refused.code == grpc.StatusCode.FAILED_PRECONDITION and "--state-dir" in refused.details


def test_the_state_keeps_its_changes_and_old_records_load_unchanged():
    change = {"step": 4, "from_sample": 60, "window": 6, "weights": {"web": 0.0, "code": 1.0}}
    state = StreamState(cursor=8, step=4, config_hash="cafe", seq_len=8).with_mixture([change, change])
    assert state.mixture == (change,) and state.after_step(16).mixture == (change,)
    record = json.loads(json.dumps(state.to_dict()))
    assert record["mixture"] == [change] and StreamState.from_dict(record) == state
    old = {"version": 1, "cursor": 48, "step": 6, "config_hash": "9f3c0a", "seq_len": 4096}
    assert StreamState.from_dict(old).to_dict() == old, "a state without changes writes no mixture key"
    assert with_change((change,), {**change, "weights": {"web": 1.0, "code": 1.0}}) == (change,), "one per step"
    for bad, match in (("x", "must be a list"), ([{"step": 1}], "'from_sample'"), ([{**change, "weights": 3}], "weights")):
        with pytest.raises(ValueError, match=match):
            StreamState.from_dict({**old, "mixture": bad})
    assert change_record(change_message(change)) == change


def test_the_train_feeder_changes_the_mixture_once_per_step_and_a_resume_takes_its_checkpoint(planned, tmp_path):  # noqa: F811
    config, plan = planned
    path = tmp_path / "stream_manifest.json"
    control, manifest = mixture_control(config, plan), Manifest("key", path)
    control.attach(manifest)
    done = threading.Event()

    def packing(window: int, first_row: int):  # a reader still at work (one that ended would end the stream)
        done.wait(30)
        yield from ()

    feeder = RowFeeder(packing, manifest, world_size=2, grad_accum=1, micro_rows=2, seq_len=SEQ_LEN,
                       pad_id=0, config_hash="cafe", mixture=control)
    try:
        first = feeder.set_mixture(5, NEW)
        assert feeder.set_mixture(5, {"web": 1.0, "code": 2.0}) == first and first["schedule_index"] == 0
        checkpoint = feeder.state(5)["manifest"]
        later = feeder.set_mixture(7, {"web": 1.0, "code": 2.0})
    finally:
        done.set()
        feeder.hub.close()
    answer_only = ("schedule_index", "consumer_window", "lag_samples")  # the answer's, not the record's
    assert checkpoint["mixture"] == [{k: v for k, v in first.items() if k not in answer_only}]
    assert Manifest("key", path).mixture == [checkpoint["mixture"][0], {k: v for k, v in later.items()
                                                                        if k not in answer_only}]
    resumed = load_manifest("key", path, checkpoint)  # from the checkpoint of step 5: the change of 7 is not the run's
    assert resumed.mixture == checkpoint["mixture"]
    packed = RowFeeder(lambda w, r: iter(()), Manifest("key"), world_size=1, grad_accum=1, micro_rows=2,
                       seq_len=SEQ_LEN, pad_id=0, config_hash="cafe")
    try:
        with pytest.raises(MixtureRefused, match="packed directory"):
            packed.set_mixture(1, NEW)
    finally:
        packed.hub.close()


def test_the_recorded_changes_as_toml_are_the_servers_schedule(planned):  # noqa: F811
    """schedule_toml of the changes, read as a config's [[data.schedule]], is the schedule the
    server applies (two changes at one position: one entry, the later's weights)."""
    import tomllib

    from packfeed.client.mixture_record import schedule_toml
    from packfeed.service.data.config import ScheduleEntry

    service = service_of(planned)
    records = [change_record(set_mixture(service, step, weights)) for step, weights in
               ((2, NEW), (3, {"web": 2.0, "code": 1.0}))]
    control = service.meta.mixture
    assert records[0]["from_sample"] == records[1]["from_sample"]
    control.admit(5, 2)  # the reader moved on: the next change starts later
    records.append(change_record(set_mixture(service, 9, {"web": 1.0, "code": 0.5})))
    table = tomllib.loads(schedule_toml(records))["data"]["schedule"]
    assert tuple(ScheduleEntry.from_dict(e) for e in table) == control.schedule
    assert [e["from_sample"] for e in table] == [10, 60]

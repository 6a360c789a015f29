"""``packfeed serve`` counts a row as served once per rank: rows sent again to a consumer that
resumed from its cursor (gRPC had sent them ahead of its reads when it left, or it replays from
a checkpoint) count as resent. One stream's ``packfeed_rows_served_total`` reached 1,666 for
873 rows when every send counted as served.

``Deliveries`` (steps.py) alone on golden cases, then the servicer in-process (no socket) with
the metrics its collector exports."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from packfeed.client.wire import decode_batch_bytes
from test_servicer import TOTAL, FakeContext, call, hubs, make_service  # noqa: F401 - hubs: a fixture

from packfeed.service.delivery.steps import Deliveries
from packfeed.service.metrics import ServeCollector


@pytest.mark.parametrize("calls, again", [
    pytest.param([(1, 0, range(0, 4))], [[False] * 4], id="first-delivery"),
    pytest.param([(2, 0, range(0, 6, 2)), (2, 0, range(2, 8, 2))], [[False] * 3, [True, True, False]],
                 id="resumed-at-cursor-2"),
    pytest.param([(2, 1, range(1, 7, 2)), (2, 0, range(0, 6, 2))], [[False] * 3, [False] * 3],
                 id="ranks-apart"),
    pytest.param([(1, 0, range(0, 4)), (2, 0, range(0, 4, 2))], [[False] * 4, [False] * 2],
                 id="world-sizes-apart"),
    pytest.param([(2, 0, range(0, 4, 2)), (2, 0, range(8, 12, 2)), (2, 0, range(0, 14, 2))],
                 [[False] * 2, [False] * 2, [True, True, False, False, True, True, False]], id="a-gap-kept"),
    pytest.param([(3, 2, range(2, 11, 3)), (3, 2, range(14, 20, 3)), (3, 2, range(2, 20, 3))],
                 [[False] * 3, [False] * 2, [True] * 3 + [False] + [True] * 2], id="steps-end-to-end-merge"),
])
def test_deliveries_tell_a_first_send_from_a_row_sent_again(calls, again):
    deliveries = Deliveries()
    got = [deliveries.record(world, rank, rows).tolist() for world, rank, rows in calls]
    assert got == again


def test_contiguous_steps_keep_one_span_per_rank():
    deliveries = Deliveries()
    for step in range(100):
        deliveries.record(2, 1, range(1 + 8 * step, 9 + 8 * step, 2))
    assert deliveries._sent[(2, 1)] == [[1, 800]]


def metrics(service) -> dict[str, float]:
    collector = ServeCollector(hub=service.hub, service=service, stream=service.meta)
    families = {f.name: f for f in collector.collect() if f.name.startswith("packfeed_rows") or "tokens_served" in f.name}
    return {name: f.samples[0].value for name, f in families.items()}


def test_a_consumer_that_resumes_before_what_it_was_sent_is_served_each_row_once(hubs, caplog):  # noqa: F811
    caplog.set_level(logging.INFO, logger="packfeed")
    service = make_service(hubs)
    first = call(service, FakeContext(), batch_rows=4)
    sent = [decode_batch_bytes(next(first)) for _ in range(11)]  # gRPC asked for 11: 10 of them sent
    first.close()  # the consumer left having read 5 (its cursor): gRPC held the 5 others
    cursor = sent[4].cursor
    rest = [decode_batch_bytes(m) for m in call(service, FakeContext(), batch_rows=4, cursor=cursor)]
    assert rest[-1].cursor == TOTAL
    tokens = sum(b.rows.num_real_tokens for b in sent[:5] + rest)
    assert (service.rows_sent, service.rows_served, service.rows_resent) == (40 + TOTAL - 20, TOTAL, 20)
    assert service.tokens_served == tokens
    scraped = metrics(service)
    assert scraped == {"packfeed_rows_served": TOTAL, "packfeed_tokens_served": tokens, "packfeed_rows_resent": 20,
                       "packfeed_rows_sent": TOTAL + 20}
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("consumer disconnected")]
    assert "10 batch(es) sent (40 rows): cancelled" in lines[0]
    assert f"{len(rest)} batch(es) sent ({TOTAL - 20:,} rows, 20 of them sent to this rank before): the stream's " \
           "last batch sent (the consumer reads what gRPC still holds)" in lines[1]


def test_two_passes_over_the_stream_serve_it_once(hubs):  # noqa: F811
    service = make_service(hubs)
    for _ in range(2):
        batches = [decode_batch_bytes(m) for m in call(service, FakeContext(), batch_rows=8)]
        assert int(sum((~b.padding_rows).sum() for b in batches)) == TOTAL
    assert (service.rows_served, service.rows_resent, service.rows_sent) == (TOTAL, TOTAL, 2 * TOTAL)
    real = np.concatenate([b.rows.row_index[~b.padding_rows] for b in batches])
    assert np.array_equal(real, np.arange(TOTAL)), "the rows themselves are sent again, whatever the count"

"""A remote store's faults: transient ones retried and counted, the rest one line at once."""

import re
import time

import pyarrow.fs as pafs
import pytest

from support.ports import free_port

from packfeed.service.storage import (
    COUNTERS,
    RetryPolicy,
    StorageError,
    expand,
    read_bytes,
    read_range,
    read_ranges,
    resolve,
    set_policy,
    stat,
    write_bytes_atomic,
)
from packfeed.service.storage import uri as uri_module
from packfeed.service.storage.store_errors import DENIED, NO_BUCKET, NOT_FOUND, UNREACHABLE

pytestmark = pytest.mark.integration

SECRET = "wJalrXUtnFEMI-K7MDENG-bPxRfiCYEXAMPLEKEY"
DATA = bytes(range(256)) * 400


@pytest.fixture
def obj(s3_faulty, s3_proxy, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)  # moto accepts any secret; no message may show it
    bucket = s3_faulty.bucket()
    s3_faulty.put(bucket, "d/a.bin", DATA)
    s3_faulty.put(bucket, "d/b.bin", DATA[:1000])
    return bucket


TRANSIENT = ["503", "500", "drop"]


@pytest.mark.parametrize("mode", TRANSIENT)
@pytest.mark.parametrize("length", [10, 50_000], ids=["short-read", "long-read"])
def test_a_read_survives_nine_failures_in_a_row(obj, s3_proxy, mode, length):
    """More than the old policy's 6 attempts: a budget of time (2 s here) outlasts them."""
    key = "d/a.bin"
    s3_proxy.fail_next(9, mode, method="GET", key=key)
    before = COUNTERS.snapshot()
    assert read_range(f"s3://{obj}/{key}", 123, length) == DATA[123:123 + length]
    delta = COUNTERS.snapshot() - before
    assert s3_proxy.pending_faults() == 0 and s3_proxy.count("GET") == 10
    # curl itself resends a request once, uncounted, when a kept-alive connection dies before
    # any answer: the first drop (the GET reuses the HEAD's connection) never reaches us
    retried_here = 8 if mode == "drop" else 9
    assert (delta.retries, delta.requests, delta.failures) == (retried_here, 2 + retried_here, 0)
    # a 503 is throttling whatever the read's length (a short one asks 4 KiB: its status is read)
    assert delta.throttled == (9 if mode == "503" else 0)


@pytest.mark.parametrize("mode", TRANSIENT)
def test_a_listing_and_a_stat_survive_four_failures_in_a_row(obj, s3_proxy, mode):
    s3_proxy.fail_next(4, mode, lists=True)
    before = COUNTERS.snapshot()
    assert [info.uri for info in expand(f"s3://{obj}/d/*.bin")] == [f"s3://{obj}/d/a.bin", f"s3://{obj}/d/b.bin"]
    # the LIST is the first request of this bucket's filesystem: a fresh connection, every drop reaches us
    assert s3_proxy.count(lists=True) == 5 and (COUNTERS.snapshot() - before).retries == 4
    s3_proxy.fail_next(4, mode, method="HEAD")
    assert stat(f"s3://{obj}/d/b.bin").size == 1000
    # the HEAD reuses the LIST's connection: curl absorbs the first drop (see the read test)
    assert s3_proxy.count("HEAD") == 5 and (COUNTERS.snapshot() - before).retries == 4 + (3 if mode == "drop" else 4)


@pytest.mark.parametrize("mode", TRANSIENT)
def test_a_write_survives_four_failures_in_a_row(obj, s3_proxy, mode):
    uri = f"s3://{obj}/out/meta/stats.json"
    s3_proxy.fail_next(4, mode, method="PUT")
    before = COUNTERS.snapshot()
    write_bytes_atomic(uri, b'{"status": "complete"}')
    assert read_bytes(uri) == b'{"status": "complete"}' and s3_proxy.count("PUT") == 5
    assert 3 <= (COUNTERS.snapshot() - before).retries <= 4  # a drop on a reused connection: curl resends once


def test_coalesced_reads_each_retry_alone(obj, s3_proxy):
    s3_proxy.fail_next(3, "503", method="GET")
    ranges = [(0, 10), (200_000 % len(DATA), 30), (50_000, 5)]
    before = COUNTERS.snapshot()
    got = read_ranges(f"s3://{obj}/d/a.bin", ranges, max_gap=0)
    assert got == [DATA[o:o + n] for o, n in ranges]
    assert (COUNTERS.snapshot() - before).retries == 3 and s3_proxy.count("GET", status=206) == 3


def test_a_stalled_request_times_out_and_is_retried(obj, s3_proxy, monkeypatch):
    monkeypatch.setattr(uri_module, "REQUEST_TIMEOUT_S", 1.0)  # a new filesystem with a 1 s stall limit
    s3_proxy.fail_next(1, "stall", method="GET")
    started = time.monotonic()
    assert read_range(f"s3://{obj}/d/a.bin", 0, 100) == DATA[:100]
    assert time.monotonic() - started < 4  # the stall holds the request 5 s: the client gave up first


def test_giving_up_when_the_retry_budget_is_spent(obj, s3_proxy):
    """A store that throttles every GET: the read retries for its budget (0.4 s here), then
    fails, one line saying how long it tried and which setting gives more."""
    previous = set_policy(RetryPolicy(budget_s=0.4, base_delay_s=0.005, max_delay_s=0.05))
    try:
        s3_proxy.fail_next(10_000, "503", method="GET")
        before, started = COUNTERS.snapshot(), time.monotonic()
        with pytest.raises(StorageError) as error:
            read_range(f"s3://{obj}/d/a.bin", 0, 50_000)
        elapsed = time.monotonic() - started
    finally:
        set_policy(previous)
    message = str(error.value)
    gets = s3_proxy.count("GET")
    assert message.startswith(f"s3://{obj}/d/a.bin: read failed {gets} times in a row over 0.4 s, giving up: "
                              "the retry budget is 0.4 s (PACKFEED_STORAGE_RETRY_S) ("), message
    assert re.search(r"SLOW_DOWN|SERVICE_UNAVAILABLE", message) and "\n" not in message and SECRET not in message
    delta = COUNTERS.snapshot() - before
    assert gets > 6 and 0.4 <= elapsed < 3.0  # far past the old 6 attempts: time, not a count, ends it
    assert (delta.retries, delta.throttled, delta.failures) == (gets - 1, gets, 1)
    assert 0 < delta.backoff_ms <= 400


def test_the_filesystem_handed_out_retries_inside_pyarrow(obj, s3_proxy):
    """For direct users (writers, Ray Train) pyarrow's own strategy is on: measured here."""
    fs, path = resolve(f"s3://{obj}/d")
    s3_proxy.fail_next(2, "drop", lists=True)
    assert len(fs.get_file_info(pafs.FileSelector(path, recursive=True))) == 2
    assert s3_proxy.count(lists=True) == 3


def _one_line_within(seconds, call):
    started = time.monotonic()
    with pytest.raises(StorageError) as error:
        call()
    elapsed = time.monotonic() - started
    message = str(error.value)
    assert "\n" not in message and SECRET not in message and "AKIA" not in message and elapsed < seconds
    return error.value


def test_permanent_failures_are_one_line_at_once(obj, s3_proxy):
    cases = [
        ("no such key", lambda: read_range(f"s3://{obj}/d/missing.bin", 0, 10), NOT_FOUND,
         f"s3://{obj}/d/missing.bin: no such object", None),
        ("missing bucket", lambda: stat(f"s3://{obj}-gone/d/a.bin"), NO_BUCKET,
         f"s3://{obj}-gone/d/a.bin: the bucket '{obj}-gone' does not exist", None),
        ("denied read", lambda: read_range(f"s3://{obj}/d/a.bin", 0, 10), DENIED,
         f"s3://{obj}/d/a.bin: access denied (", ("HEAD", "403")),
        ("denied listing", lambda: expand(f"s3://{obj}/d/*"), DENIED, f"s3://{obj}/d/*: access denied (", ("LIST", "403")),
        # a 10-byte GET asks 4 KiB (reads.py): the 403's body fits, so it is read as denied, not retried
        ("denied short ranged read", lambda: read_range(f"s3://{obj}/d/a.bin", 5, 10), DENIED,
         f"s3://{obj}/d/a.bin: access denied (", ("GET", "403")),
        ("credentials in the URI", lambda: stat(f"s3://AKIAEXAMPLE:{SECRET}@{obj}/d/nope"), NOT_FOUND,
         f"s3://{obj}/d/nope: no such object", None),
    ]
    for name, call, kind, starts, fault in cases:
        s3_proxy.reset()
        if fault:
            method, mode = fault
            s3_proxy.fail_next(1, mode, **({"lists": True} if method == "LIST" else {"method": method}))
        before = COUNTERS.snapshot()
        error = _one_line_within(3, call)
        assert error.kind == kind and str(error).startswith(starts), (name, str(error))
        assert (COUNTERS.snapshot() - before).retries == 0, name
        if kind == DENIED:
            assert "AWS_ACCESS_KEY_ID" in str(error)  # says where credentials come from


@pytest.mark.parametrize("call", [
    lambda uri: read_range(uri, 0, 10), lambda uri: expand(uri.rsplit("/", 1)[0] + "/*"), stat,
], ids=["read", "glob", "stat"])
def test_an_unreachable_endpoint_fails_in_seconds(call, s3_server, monkeypatch, fast_retries):
    port = free_port()  # nothing listens there
    for name, value in s3_server.env(f"http://127.0.0.1:{port}").items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    before = COUNTERS.snapshot()
    error = _one_line_within(5, lambda: call("s3://some-bucket/d/a.bin"))
    assert error.kind == UNREACHABLE
    assert "cannot reach the store after 3 attempt(s)" in str(error) and f"127.0.0.1:{port}" in str(error)
    assert "AWS_ENDPOINT_URL" in str(error)
    assert (COUNTERS.snapshot() - before).retries == fast_retries.num_connect_attempts - 1

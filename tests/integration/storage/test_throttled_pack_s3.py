"""A pack from a store that throttles hard finishes with the rows of a clean one; a denied
object still fails at once.

The store (moto behind the fault proxy) answers in a ``storm``: the first 4 of every 10 GETs
of each object 503 SlowDown, every 5th GET's connection dropped (before or within the answer),
until the test calms it. Three more readers of the same objects in the process (as a packing
actor's prefetch, or other actors on the prefix) keep several ranged GETs of one object in
flight and share the store's limiter with the pack. With the old policy (6 quick attempts a
request) such a pack failed "read failed 6 times in a row, giving up (AWS Error SLOW_DOWN
...)"; with a budget of time it retries through (backoff shortened here: ``fast_retries`` in
conftest.py; the defaults wait ~100x longer). Packed by the driver alone, as a small pack on 2
cores is (no Ray): the policy and the proxy are this process's.
"""

from __future__ import annotations

import random
import threading
import time

import numpy as np
import pytest
from support.store_runs import CORPUS, write_corpus

from packfeed.service import storage
from packfeed.service.assets import demo_tokenizer_path
from packfeed.service.data.config import DataConfig
from packfeed.service.inputs.read_cache import reset_shared_caches
from packfeed.service.packed.writer import read_packed_dir
from packfeed.service.packjob.pack_run import run_pack
from packfeed.service.pipeline.summary import format_summary
from packfeed.service.storage.limiter import limiter_for
from packfeed.service.storage.retry import current_policy
from packfeed.service.storage.store_errors import DENIED

pytestmark = pytest.mark.integration

ROW_COLUMNS = ("input_ids", "labels", "position_ids", "seq_lens", "sample_ids", "row_index")


def test_a_pack_through_sustained_throttling_equals_a_clean_one_and_a_denied_object_fails_at_once(
        s3_faulty, s3_proxy, driver_alone, tmp_path, capsys):
    bucket = s3_faulty.bucket("storm")
    s3_faulty.upload_tree(write_corpus(tmp_path, lines=400), bucket, f"{CORPUS}/")
    config = DataConfig.from_inputs([f"s3://{bucket}/{CORPUS}/*"], tokenizer=demo_tokenizer_path(), seq_len=512,
                                    window_samples=400, block_samples=32)

    started = time.monotonic()
    run_pack(config, f"s3://{bucket}/clean", progress_seconds=60)
    clean_s = time.monotonic() - started
    clean_gets = s3_proxy.count("GET")

    s3_proxy.reset()
    reset_shared_caches(clear_disk=True)  # the stormy pack reads the store again, not the clean one's bytes kept
    s3_proxy.storm(every=10, burst=4, drop_every=5)
    before, started = storage.COUNTERS.snapshot(), time.monotonic()
    with OtherReaders(bucket, tmp_path / CORPUS) as others:
        stats = run_pack(config, f"s3://{bucket}/stormy", progress_seconds=60)
    stormy_s, delta = time.monotonic() - started, storage.COUNTERS.snapshot() - before
    s3_proxy.calm()
    summary = capsys.readouterr().out
    assert others.errors == [] and others.reads > 0

    clean, stormy = read_packed_dir(f"s3://{bucket}/clean"), read_packed_dir(f"s3://{bucket}/stormy")
    assert clean.num_rows > 20
    for column in ROW_COLUMNS:
        assert np.array_equal(getattr(clean, column), getattr(stormy, column)), column

    # not vacuous: the storm hit, with several GETs of one object in flight, some request met a
    # whole burst or more in a row (each reaching this process: 503s, answers cut short; 5-8 in 4
    # runs: more than the old 6 attempts allowed in 3 of them; test_storage_faults.py survives 9
    # for certain), and the limiter slowed the process down
    gets = s3_proxy.select("GET")
    throttles, drops = s3_proxy.count("GET", status=503), s3_proxy.count("GET", status=0)
    longest = max(_failure_runs(gets).values())
    limiter = limiter_for(f"s3://{bucket}/{CORPUS}", current_policy().max_in_flight)
    assert throttles >= 20 and drops >= 5 and s3_proxy.peak_in_flight_per_key >= 2, (throttles, drops)
    assert longest >= 4 and limiter.lowest < current_policy().max_in_flight, (longest, limiter.lowest)
    # every retry counted: each 503 in this process's counts, and in the pack's stats those of its own reads
    assert delta.throttled == throttles and delta.failures == 0
    assert throttles <= delta.retries <= throttles + drops
    io = stats["storage"]
    assert 0 < io["throttled"] <= io["retries"] and io["retries"] <= delta.retries and io["failures"] == 0
    assert f"({io['retries']:,} retried, 0 failed" in summary and format_summary(stats) in summary
    print(f"\nthrottled pack: {stats['rows']} rows in {stormy_s:.1f} s (clean {clean_s:.1f} s, {clean_gets} GETs); "
          f"the proxy: {len(gets)} GETs, {throttles} answered 503, {drops} dropped, at most "
          f"{s3_proxy.peak_in_flight_per_key} GETs of one object in flight, longest run of failures of one "
          f"request {longest}; this process: {delta.retries} retries, {delta.throttled} throttled, "
          f"{delta.backoff_ms} ms backing off (the pack's own: {io['retries']} retries, {io['throttled']} "
          f"throttled, {io['backoff_ms']} ms), {others.reads} reads beside it; the limit fell to {limiter.lowest} "
          f"({limiter.halvings} halvings)")

    # a denied object, in the same storm: the pack fails on the first answer, nothing retried
    s3_proxy.reset()
    reset_shared_caches(clear_disk=True)
    s3_proxy.storm(every=10, burst=4, drop_every=5)
    s3_proxy.fail_next(1, "403", method="GET")
    before, started = storage.COUNTERS.snapshot(), time.monotonic()
    with pytest.raises(storage.StorageError) as error:
        run_pack(config, f"s3://{bucket}/denied", progress_seconds=60)
    elapsed = time.monotonic() - started
    assert error.value.kind == DENIED and f"s3://{bucket}/{CORPUS}/" in str(error.value), str(error.value)
    assert "access denied" in str(error.value) and elapsed < 10
    denied = s3_proxy.select("GET", status=403)[0]
    assert not any(r.key == denied.key and r.range == denied.range for r in s3_proxy.select("GET")
                   if r is not denied), "the denied request was asked again"
    assert (storage.COUNTERS.snapshot() - before).failures == 1
    s3_proxy.calm()

    # a missing object: one answer (HEAD 404), no retry
    s3_proxy.reset()
    config_missing = DataConfig.from_inputs([f"s3://{bucket}/{CORPUS}/chat.jsonl", f"s3://{bucket}/{CORPUS}/gone.jsonl"],
                                            tokenizer=demo_tokenizer_path(), seq_len=512)
    with pytest.raises(ValueError, match=rf"s3://{bucket}/{CORPUS}/gone.jsonl"):
        run_pack(config_missing, f"s3://{bucket}/missing", progress_seconds=60)
    assert s3_proxy.count(key=f"{CORPUS}/gone.jsonl") <= 2  # a HEAD (and at most a GET), answered once each


def _failure_runs(gets) -> dict[tuple[str, str], int]:
    """For each request (key, range): its longest run of answers in a row that reached the
    client as failures (503s and answers cut short; not a drop before any answer, which curl
    may have resent by itself)."""
    runs, current = {(r.key, r.range): 0 for r in gets}, {}
    for r in gets:
        ident = (r.key, r.range)
        failed = r.status == 503 or (r.status == 0 and r.bytes_out > 0)
        current[ident] = current.get(ident, 0) + 1 if failed else 0 if r.status else current.get(ident, 0)
        runs[ident] = max(runs[ident], current[ident])
    return runs


class OtherReaders:
    """Three threads reading random ranges of the corpus's objects until the block ends (the
    bytes checked against the files on disk): more readers of the same objects and store."""

    def __init__(self, bucket: str, directory) -> None:
        self.files = {f"s3://{bucket}/{CORPUS}/{p.name}": p.read_bytes() for p in sorted(directory.iterdir())}
        self.stop, self.errors, self.reads = threading.Event(), [], 0
        self.threads = [threading.Thread(target=self._run, args=(seed,)) for seed in range(3)]

    def _run(self, seed: int) -> None:
        rng = random.Random(seed)
        uris = sorted(self.files)
        while not self.stop.is_set():
            uri = uris[rng.randrange(len(uris))]
            data = self.files[uri]
            ranges = [(rng.randrange(len(data)), rng.choice([100, 5000, 60_000])) for _ in range(3)]
            try:
                got = storage.read_ranges(uri, ranges, max_gap=0)
            except Exception as exc:  # noqa: BLE001 - the test reports it
                self.errors.append(exc)
                return
            if got != [data[o:o + n] for o, n in ranges]:
                self.errors.append(AssertionError(f"{uri}: other bytes than on disk at {ranges}"))
            self.reads += 1

    def __enter__(self) -> "OtherReaders":
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)

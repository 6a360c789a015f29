"""Prometheus metrics of ``packfeed serve`` (``--metrics-port``), and the packing actors' own.

The server's endpoint is read on demand: a collector turns the live numbers of the hub, the
gRPC service, the packing stats and the manifest into metric families at every scrape, so
serving does no metric bookkeeping on its hot path. Names (all prefixed ``packfeed_``):

====================================  =======  ==================================================
metric                                type     meaning
====================================  =======  ==================================================
rows_served_total                     counter  real rows sent to their consumer the first time:
                                               each row once per rank of a world size (padding
                                               excluded; see "sent" below)
tokens_served_total                   counter  real tokens of those rows (rate: tokens/s consumed)
rows_resent_total                     counter  real rows sent again to a rank that was sent them
                                               before (it resumed from a cursor before them)
rows_sent_total                       counter  real rows sent, every send (served + resent)
batches_sent_total                    counter  PackedBatch messages sent
bytes_sent_total                      counter  bytes of those messages
streams                               gauge    StreamBatches calls open now
auth_refused_total{reason}            counter  calls refused for a missing or wrong bearer token
consumer_lag_rows{consumer}           gauge    rows the main reader has produced past each consumer
                                               reading its buffer (negative: the consumer waits
                                               for rows not produced yet)
buffer_rows / buffer_capacity_rows    gauge    rows held for the consumers, and the bound
reader_position_rows                  gauge    global index of the next row the main reader makes
reader_restarts_total                 counter  times the main reader was started again at another
                                               window (0 on a fresh server)
catchup_windows_total                 counter  windows packed (a packed directory: read) for
                                               consumers far behind the main reader
stream_rows                           gauge    rows of the whole stream, once known (else absent)
packed_samples_total{source}          counter  samples packed, by source
packed_tokens_total{source}           counter  real tokens in rows, by source (rate: tokens/s)
skipped_samples_total{source,reason}  counter  samples skipped, by source and reason
packing_efficiency                    gauge    real tokens / (rows x seq_len) of the rows packed
                                               (absent until a window is packed)
storage_requests_total                counter  requests to object stores: the plan's listing and
                                               scan and every packed window's reads (a packed
                                               directory on a store: this server's reads)
storage_retries_total                 counter  those retried (throttling, 5xx, timeouts, resets)
storage_failures_total                counter  those given up on
storage_read_bytes_total              counter  bytes read from object stores
====================================  =======  ==================================================

"Sent" is gRPC's: a batch counts once gRPC has written it towards the consumer and asks for
the next, ahead of the consumer's reads (HTTP/2 windows and socket buffers: MBs; a whole
873-row stream, 219 batches, while its client read 5). A consumer that leaves loses what it
had not read and asks for those rows again from its cursor: they count in rows_resent_total,
so rows_served_total stays at most the stream's rows for one group of consumers (it reached
1,666 for an 873-row stream when every send counted as served). Rows sent to a consumer that
never comes back stay counted as served: no request says what it read.

The packing families count the windows this server has packed (each once, however often it is
packed again). A packed directory is served as it is, packed before: its packing families are
the totals of its ``stats.json``, constant from the first scrape (their ``rate()`` is 0), so a
dashboard reads both kinds of stream alike.

Packing actors (any command: pack, serve, train) count windows, samples and tokens with
``ray.util.metrics`` (``WindowMetrics``), so a cluster's Ray Prometheus endpoint (the nodes'
``--metrics-export-port``) shows packing wherever it runs.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from packfeed.service.storage import COUNTERS, StorageCounts

PREFIX = "packfeed_"


class ServeCollector:
    """Metric families from the live server objects (see the table in the module docstring)."""

    def __init__(self, *, hub: Any, service: Any, stream: Any) -> None:
        self.hub, self.service, self.stream = hub, service, stream

    def collect(self):
        snap = self.hub.snapshot()
        yield _counter("rows_served", "real rows sent to their consumer the first time: each row once per rank of a "
                       "world size, counted when gRPC has sent it (ahead of the consumer's reads); padding excluded",
                       self.service.rows_served)
        yield _counter("tokens_served", "real tokens of the rows counted in rows_served", self.service.tokens_served)
        yield _counter("rows_resent", "real rows sent again to a rank that was sent them before (it resumed from a "
                       "cursor before them: rows it had not read when it left, or a replay from a checkpoint)",
                       self.service.rows_resent)
        yield _counter("rows_sent", "real rows sent to consumers, every send (served + resent); padding excluded",
                       self.service.rows_sent)
        yield _counter("batches_sent", "PackedBatch messages sent", self.service.batches_sent)
        yield _counter("bytes_sent", "bytes of PackedBatch messages sent", self.service.bytes_sent)
        yield _gauge("streams", "StreamBatches calls open now", self.service.streams)
        refused = CounterMetricFamily(PREFIX + "auth_refused", "calls refused for a missing or wrong bearer token",
                                      labels=["reason"])
        for reason, count in sorted(self.service.auth_refused.items()):
            refused.add_metric([reason], count)
        yield refused
        lag = GaugeMetricFamily(PREFIX + "consumer_lag_rows", "rows the main reader has produced past each consumer "
                                "reading its buffer (negative: the consumer waits for rows not produced yet)",
                                labels=["consumer"])
        for cid, rows in sorted(snap["lags"].items()):
            lag.add_metric([str(cid)], rows)
        yield lag
        yield _gauge("buffer_rows", "rows held for the consumers", snap["held_rows"])
        yield _gauge("buffer_capacity_rows", "rows the buffer holds at most", snap["capacity"])
        yield _gauge("reader_position_rows", "global index of the next row the main reader makes", snap["produced"])
        yield _counter("reader_restarts", "times the main reader was started again at another window",
                       snap["restarts"])
        yield _counter("catchup_windows", "windows packed (a packed directory: read) for consumers far behind "
                       "the main reader", snap["catchup_windows"])
        if self.hub.total_rows is not None:
            yield _gauge("stream_rows", "rows of the whole stream", self.hub.total_rows)
        totals = packing_totals(self.stream)
        if totals is not None:
            yield from _packing_families(*totals)
        yield from _storage_families(storage_counts(self.stream))


def storage_counts(stream: Any) -> StorageCounts:
    """Requests to object stores for this stream: the plan's and every packed window's reads (a
    pipeline: its RunStats), or this process's own (a packed directory read from a store)."""
    stats = stream.stats
    return stats.storage if stats is not None else COUNTERS.snapshot()


def _storage_families(io: StorageCounts):
    yield _counter("storage_requests", "requests to object stores (each retry one more)", io.requests)
    yield _counter("storage_retries", "requests to object stores retried (throttling, 5xx, timeouts, resets)",
                   io.retries)
    yield _counter("storage_failures", "requests to object stores given up on", io.failures)
    yield _counter("storage_read_bytes", "bytes read from object stores", io.bytes_read)
    yield _counter("storage_throttled", "answers of object stores that were throttling (503 SlowDown, 429); "
                   "each also a retry, or the failure that ended its request", io.throttled)
    yield _counter("storage_backoff_seconds", "seconds requests to object stores waited to be retried "
                   "(summed over threads)", io.backoff_ms / 1000)


def packing_totals(stream: Any) -> tuple[list[dict], float | None] | None:
    """(per source: name, samples_packed, tokens, skipped {reason: n}; the packing efficiency,
    None before any row) of what the RowStream ``stream`` packed so far (a pipeline) or was
    packed into (a packed directory: its stats.json); None when neither is known."""
    stats = stream.stats
    if stats is not None:  # a RunStats: the windows this process packed
        per_source = []
        for index, name in enumerate(stats.names):
            counts = stats.source_total(index)
            per_source.append({"name": name, "samples_packed": counts.samples_packed, "tokens": counts.tokens,
                               "skipped": dict(counts.skipped),
                               "stages": [{"stage": st, "samples_packed": c.samples_packed}
                                          for st, c in stats.stage_counts(index)]})
        efficiency = stats.total().tokens / (stats.rows * stream.seq_len) if stats.rows else None
        return per_source, efficiency
    packed = stream.packed_stats
    if packed:  # a packed directory's stats.json
        return list(packed.get("sources", [])), packed.get("efficiency") if packed.get("rows") else None
    return None


def _packing_families(per_source: list[dict], efficiency: float | None):
    samples = CounterMetricFamily(PREFIX + "packed_samples", "samples packed", labels=["source"])
    tokens = CounterMetricFamily(PREFIX + "packed_tokens", "real tokens in rows", labels=["source"])
    skipped = CounterMetricFamily(PREFIX + "skipped_samples", "samples skipped", labels=["source", "reason"])
    for counts in per_source:
        name = str(counts["name"])
        samples.add_metric([name], int(counts.get("samples_packed", 0)))
        tokens.add_metric([name], int(counts.get("tokens", 0)))
        for reason, n in sorted((counts.get("skipped") or {}).items()):
            skipped.add_metric([name, reason], int(n))
    yield samples
    yield tokens
    yield skipped
    if any(counts.get("stages") for counts in per_source):  # a mixture schedule: samples per stage
        staged = CounterMetricFamily(PREFIX + "packed_stage_samples", "samples packed per mixture schedule stage",
                                     labels=["source", "stage"])
        for counts in per_source:
            for st in counts.get("stages") or ():
                staged.add_metric([str(counts["name"]), str(st["stage"])], int(st["samples_packed"]))
        yield staged
    if efficiency is not None:
        yield _gauge("packing_efficiency", "real tokens / (rows x seq_len) of the rows packed", float(efficiency))


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(PREFIX + name, doc, value=value)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(PREFIX + name, doc, value=value)


class MetricsServer:
    """The HTTP endpoint (``/metrics``) in a daemon thread; ``stop()`` closes it."""

    def __init__(self, host: str, port: int, collector: ServeCollector) -> None:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(collector)
        self._server, _ = start_http_server(port, addr=host, registry=registry)  # (server, its daemon thread)
        self.port = self._server.server_port

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def start_metrics_server(host: str, port: int, *, hub: Any, service: Any, stream: Any) -> MetricsServer:
    """Serve the metrics of ``hub``/``service``/``stream`` on ``host:port``; OSError (naming
    the port and why) when it cannot listen."""
    try:
        return MetricsServer(host, port, ServeCollector(hub=hub, service=service, stream=stream))
    except OSError as e:
        raise OSError(f"--metrics-port {port} on {host}: cannot listen ({e.strerror or e})") from None


class WindowMetrics:
    """Counters a packing actor reports to Ray's metrics (one per actor process)."""

    def __init__(self) -> None:
        from ray.util.metrics import Counter

        self.windows = Counter(PREFIX + "windows_packed", "windows packed by this actor")
        self.samples = Counter(PREFIX + "actor_packed_samples", "samples packed", tag_keys=("source",))
        self.tokens = Counter(PREFIX + "actor_packed_tokens", "real tokens in rows", tag_keys=("source",))
        self.skipped = Counter(PREFIX + "actor_skipped_samples", "samples skipped", tag_keys=("source", "reason"))

    def record(self, stats: Any, names: list[str]) -> None:
        self.windows.inc(1)
        for index, counts in stats.sources.items():
            tags = {"source": names[index]}
            if counts.samples_packed:
                self.samples.inc(counts.samples_packed, tags=tags)
            if counts.tokens:
                self.tokens.inc(counts.tokens, tags=tags)
            for reason, n in counts.skipped.items():
                self.skipped.inc(n, tags={**tags, "reason": reason})

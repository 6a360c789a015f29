"""Prometheus metrics of ``packfeed serve`` (``--metrics-port``), and the packing actors' own.

The server's endpoint is read on demand: a collector turns the live numbers of the hub, the
gRPC service, the packing stats and the manifest into metric families at every scrape, so
serving does no metric bookkeeping on its hot path. Names (all prefixed ``packfeed_``):

====================================  =======  ==================================================
metric                                type     meaning
====================================  =======  ==================================================
rows_served_total                     counter  real rows handed to consumers (padding excluded)
batches_sent_total                    counter  PackedBatch messages sent
bytes_sent_total                      counter  bytes of those messages
streams                               gauge    StreamBatches calls open now
auth_refused_total{reason}            counter  calls refused for a missing or wrong bearer token
consumer_lag_rows{consumer}           gauge    rows the reader is ahead of each reading consumer
buffer_rows / buffer_capacity_rows    gauge    rows held for the consumers, and the bound
reader_position_rows                  gauge    rows the main reader has produced (stream position)
reader_restarts_total                 counter  main readers started
catchup_windows_total                 counter  windows packed for far-behind consumers
stream_rows                           gauge    rows of the whole stream, once known (else absent)
packed_samples_total{source}          counter  samples packed, by source
packed_tokens_total{source}           counter  real tokens in rows, by source (rate: tokens/s)
skipped_samples_total{source,reason}  counter  samples skipped, by source and reason
packing_efficiency                    gauge    real tokens / (rows x seq_len) of the windows packed
====================================  =======  ==================================================

Packing actors (any command: pack, serve, train) count windows, samples and tokens with
``ray.util.metrics`` (``WindowMetrics``), so a cluster's Ray Prometheus endpoint (the nodes'
``--metrics-export-port``) shows packing wherever it runs.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

PREFIX = "packfeed_"


class ServeCollector:
    """Metric families from the live server objects (see the table in the module docstring)."""

    def __init__(self, *, hub: Any, service: Any, source: Any) -> None:
        self.hub, self.service, self.source = hub, service, source

    def collect(self):
        snap = self.hub.snapshot()
        yield _counter("rows_served", "real rows handed to consumers", snap["rows_served"])
        yield _counter("batches_sent", "PackedBatch messages sent", self.service.batches_sent)
        yield _counter("bytes_sent", "bytes of PackedBatch messages sent", self.service.bytes_sent)
        yield _gauge("streams", "StreamBatches calls open now", self.service.streams)
        refused = CounterMetricFamily(PREFIX + "auth_refused", "calls refused for a missing or wrong token",
                                      labels=["reason"])
        for reason, count in sorted(self.service.auth_refused.items()):
            refused.add_metric([reason], count)
        yield refused
        lag = GaugeMetricFamily(PREFIX + "consumer_lag_rows", "rows the reader is ahead of each reading consumer",
                                labels=["consumer"])
        for cid, rows in sorted(snap["lags"].items()):
            lag.add_metric([str(cid)], rows)
        yield lag
        yield _gauge("buffer_rows", "rows held for the consumers", snap["held_rows"])
        yield _gauge("buffer_capacity_rows", "rows the buffer holds at most", snap["capacity"])
        yield _gauge("reader_position_rows", "rows the main reader has produced", snap["produced"])
        yield _counter("reader_restarts", "main readers started", snap["restarts"])
        yield _counter("catchup_windows", "windows packed for far-behind consumers", snap["catchup_windows"])
        if self.hub.total_rows is not None:
            yield _gauge("stream_rows", "rows of the whole stream", self.hub.total_rows)
        stats = self.source.stats
        if stats is not None:
            yield from _packing_families(stats, self.source.seq_len)


def _packing_families(stats: Any, seq_len: int):
    samples = CounterMetricFamily(PREFIX + "packed_samples", "samples packed", labels=["source"])
    tokens = CounterMetricFamily(PREFIX + "packed_tokens", "real tokens in rows", labels=["source"])
    skipped = CounterMetricFamily(PREFIX + "skipped_samples", "samples skipped", labels=["source", "reason"])
    for index, name in enumerate(stats.names):
        counts = stats.source_total(index)
        samples.add_metric([name], counts.samples_packed)
        tokens.add_metric([name], counts.tokens)
        for reason, n in sorted(counts.skipped.items()):
            skipped.add_metric([name, reason], n)
    yield samples
    yield tokens
    yield skipped
    total = stats.total()
    yield _gauge("packing_efficiency", "real tokens / (rows x seq_len) of the windows packed",
                 total.tokens / (stats.rows * seq_len) if stats.rows else 0.0)


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


def start_metrics_server(host: str, port: int, *, hub: Any, service: Any, source: Any) -> MetricsServer:
    """Serve the metrics of ``hub``/``service``/``source`` on ``host:port``; OSError (naming
    the port and why) when it cannot listen."""
    try:
        return MetricsServer(host, port, ServeCollector(hub=hub, service=service, source=source))
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

"""The same corpus read from disk and from the local S3 server: what object storage costs.

A generated corpus (``--mb`` MB, default 64: 3/4 text JSONL in 4 files, 1/4 prompt/completion Parquet in
2 files with ``--row-group`` rows per row group; two sources) lies in a local directory and,
byte for byte, under a prefix of moto's S3 server (started here on 127.0.0.1 as the tests start
it: tests/support/s3.py). Every request to the server goes through the counting proxy of the
same module (``AWS_ENDPOINT_URL`` points at it), so requests and bytes are counted on the wire
as well as by ``storage.COUNTERS`` (this process only). Reference: the same step from disk, in
the same run; figures are ratios to it.

(1) The scan (``build_plan`` with a scan manifest): cold (no manifest: every JSONL byte read,
    Parquet footers) and cached (the manifest beside the run: a listing and the manifest, no
    input byte), from disk and from S3.
(2) Reading: ``read_window`` over every window of the plan in this process: seconds, requests
    and bytes per window, bytes read / input bytes, by file kind; again with the Parquet
    source's ``block_samples`` at its row-group size (a window then takes whole row groups).
(3) ``packfeed pack`` end to end (``packjob.pack_run.run_pack`` in this process, an embedded Ray
    started once for both, one packing actor per CPU): tokens/s (steady and overall), the
    whole run's requests and bytes (scan, probe and the packing actors' reads): bytes read /
    input bytes, split into the scan's, the probe's and the windows' (the rest), beside
    stats.json's ``read_ratio`` (the scan, the probe and the windows, as packfeed counts them:
    1.00 where the proxy saw 1.00), and a check that both outputs hold the same rows. With
    ``--storm``, a third pack from S3 while the proxy throttles (``FaultProxy.storm``: the first
    4 of every 10 GETs of each object 503 SlowDown, every 5th GET dropped), under the default retry policy (2 minutes a request,
    full-jitter backoff from 0.25 s): its seconds, retries, throttled answers and seconds spent
    backing off, and its rows checked against the clean packs'.

(4) ``packfeed serve`` from S3 restarted on a fresh node (``--only restart``): one rank reads the
    stream, keeping its state half-way; the server is stopped (SIGTERM) and started again with an
    empty node read cache; the rank resumes. The restart's input bytes / what remains after the
    cursor (inputs/extents.py). ``--quick``: 903 rows, cursor 464, restart from window 2 of 5,
    what remains 0.60 of the inputs, read 1.08 x it (the rest: gaps a JSONL cursor reads through
    rather than make another request, fileio.py ``MAX_GAP``); no scan, no probe. 64 MB: 14,557
    rows, cursor 7,296, window 4 of 9, what remains 0.59, read 1.03 x it.

moto is a Python server and the proxy runs in this process: a request costs ~1-3 ms here, far
less than a store's ~10-100 ms, so the times show the client's overhead, not a store's latency;
the counts are what a real store would see. Every step starts with cold read caches (this
process's memory and the node's disk: inputs/read_cache.py, inputs/disk_cache.py); the packing
actors use them as a real run does. ``--quick --only pack`` measured a pack at 5.56x its input
bytes without them (0.92 scan + 0.33 probe + 4.31 windows), 2.95x with the memory cache alone
(``PACKFEED_READ_CACHE_DIR=off``), 1.00x with both (the default: 0.92 + 0.08 + 0.00).

    .venv/bin/python bench/bench_storage.py             # ~80 s on 2 cores (64 MB, 9 windows)
    .venv/bin/python bench/bench_storage.py --quick     # ~35 s (4 MB; too few windows for a steady rate)
    .venv/bin/python bench/bench_storage.py --only restart   # ~35 s: (4) alone, 64 MB
    .venv/bin/python bench/bench_storage.py --mb 128 --only pack     # 18 windows: a steadier rate
    .venv/bin/python bench/bench_storage.py --quick --only pack --storm  # a pack through throttling
    PACKFEED_READ_CACHE_MIB=0 PACKFEED_READ_CACHE_DIR=off .venv/bin/python bench/bench_storage.py --quick --only pack  # no cache
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from packfeed.service.assets import demo_tokenizer_path
from packfeed.service.data.config import DataConfig, SourceConfig
from packfeed.service.data.plan import build_plan
from packfeed.service.inputs.read import read_window
from packfeed.service.inputs.read_cache import reset_shared_caches
from packfeed.service.storage import COUNTERS
from report import table  # noqa: E402 - bench/report.py, beside this script

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the loopback S3 server of the tests

WORDS = (
    "the of and to in a is that for it as was with be by on not he I this are or his from at which "
    "river lantern garden castle harbor meadow forest engine window mountain village library market "
    "distributed training packing tokenizer attention gradient batch sequence transformer model 2024 17"
).split()
PREFIX = "corpus"
RESTART_BLOCK = 32  # (4): block_samples of the restarted stream
MIN_STEADY_WINDOWS = 8  # fewer: the steady rate is a window or two after the first row, noise


def write_corpus(root: Path, megabytes: float, row_group: int, seed: int = 0) -> None:
    """Text JSONL (web/) and prompt/completion Parquet (sft/) of about ``megabytes`` in all."""
    rng = np.random.default_rng(seed)
    words = np.array(WORDS)

    def texts(n: int, median_words: int) -> list[str]:
        lengths = np.clip(rng.lognormal(np.log(median_words), 0.8, n).astype(int), 3, 4000)
        return [" ".join(words[rng.integers(0, len(words), k)]) for k in lengths]

    (root / "web").mkdir(parents=True)
    (root / "sft").mkdir(parents=True)
    text_rows = int(megabytes * 0.75 * 2**20 / 1100)  # ~1.1 KB a row at a median of 150 words
    for i, part in enumerate(np.array_split(np.arange(text_rows), 4)):
        with open(root / "web" / f"part-{i:02d}.jsonl", "w", encoding="utf-8") as f:
            f.writelines(json.dumps({"text": t}) + "\n" for t in texts(len(part), 150))
    sft_rows = int(megabytes * 0.25 * 2**20 / 700)
    for i, part in enumerate(np.array_split(np.arange(sft_rows), 2)):
        table = pa.table({"prompt": texts(len(part), 20), "completion": texts(len(part), 80)})
        pq.write_table(table, root / "sft" / f"part-{i:02d}.parquet", row_group_size=row_group)


def data_config(base: str, window: int | None, sft_block: int | None = None) -> DataConfig:
    """Two sources: ``web`` (the JSONL files) and ``sft`` (the Parquet files; ``sft_block``: its
    block_samples, None: the default 256)."""
    return DataConfig(sources=(SourceConfig(name="web", paths=(f"{base}/web/*.jsonl",)),
                               SourceConfig(name="sft", paths=(f"{base}/sft/*.parquet",), block_samples=sft_block)),
                      tokenizer=demo_tokenizer_path(), seq_len=2048, window_samples=window)


class Wire:
    """What one step cost: seconds, ``COUNTERS`` of this process, and the proxy's record."""

    def __init__(self, proxy) -> None:
        self.proxy = proxy

    def __enter__(self) -> "Wire":
        reset_shared_caches(clear_disk=True)  # every step reads cold: no byte a step before read is at hand
        self.proxy.reset()
        self.before = COUNTERS.snapshot()
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.seconds = time.perf_counter() - self.start
        self.counts = COUNTERS.snapshot() - self.before
        self.requests = self.proxy.requests

    def gets(self, suffix: str = "") -> tuple[int, int]:
        """(GETs of objects, their body bytes) whose key ends in ``suffix`` (LISTs excluded)."""
        chosen = [r for r in self.requests if r.method == "GET" and not r.is_list and r.key.endswith(suffix)]
        return len(chosen), sum(r.bytes_out for r in chosen)

    def by_method(self) -> str:
        counts: dict[str, int] = {}
        for r in self.requests:
            name = "LIST" if r.is_list else r.method
            counts[name] = counts.get(name, 0) + 1
        return ", ".join(f"{n} {m}" for m, n in sorted(counts.items()))


@dataclass(frozen=True)
class Corpus:
    """The corpus on disk (``local``) and on the store (``remote``), and its bytes by kind."""

    local: str
    remote: str
    sizes: dict[str, int]  # "all", "jsonl", "parquet"
    window: int | None
    row_group: int


def remote_bytes(wire: Wire, corpus: Corpus, where: str) -> str:
    """Bytes read as ``storage.COUNTERS`` counted them; local reads are not counted."""
    return f"{wire.counts.bytes_read:,} ({wire.counts.bytes_read / corpus.sizes['all']:.3f})" if where == "S3" else "-"


def scan_bench(corpus: Corpus, proxy, work: Path) -> None:
    caches = {"disk": str(work / "scan-disk" / "scan.npz"),
              "S3": f"{corpus.remote.rsplit('/', 1)[0]}/run/.packfeed/scan.npz"}
    rows, reference, plans = [], None, {}
    for where, base in (("disk", corpus.local), ("S3", corpus.remote)):
        for run in ("cold", "cached"):
            with Wire(proxy) as wire:
                plans[where] = build_plan(data_config(base, corpus.window), scan_cache=caches[where])
            reference = reference or wire.seconds
            rows.append([f"{where}, {run}", f"{wire.seconds:.3f}", f"{wire.seconds / reference:.2f}",
                         wire.by_method() or "-", remote_bytes(wire, corpus, where),
                         f"{wire.counts.bytes_written:,}" if where == "S3" else "-"])
    same = [[(f.num_rows, f.seek_offsets.tolist()) for f in s.files] for s in plans["disk"].sources] == \
           [[(f.num_rows, f.seek_offsets.tolist()) for f in s.files] for s in plans["S3"].sources]
    table("(1) the scan: build_plan(config, scan_cache=...), the manifest beside the run (disk: a local "
          f"directory; S3: s3://.../run/.packfeed/scan.npz); ratio: seconds / disk cold. Rows and seek offsets "
          f"equal on disk and S3: {same}",
          ["run", "seconds", "ratio", "requests (proxy)", "bytes read (/ input bytes)", "bytes written"], rows)
    if not same:
        raise SystemExit("the plans of disk and S3 differ")


def read_bench(corpus: Corpus, proxy) -> None:
    rows, reference = [], None
    runs = [("disk", corpus.local, None), ("S3", corpus.remote, None),
            (f"S3, sft block_samples {corpus.row_group:,} (its row-group size)", corpus.remote, corpus.row_group)]
    for name, base, sft_block in runs:
        plan = build_plan(data_config(base, corpus.window, sft_block))
        with Wire(proxy) as wire:
            samples = sum(len(read_window(plan.window(k))) for k in range(plan.num_windows))
        reference = reference or wire.seconds
        n = plan.num_windows
        remote = name.startswith("S3")
        (jsonl_gets, jsonl_bytes), (parquet_gets, parquet_bytes) = wire.gets(".jsonl"), wire.gets(".parquet")
        rows.append([name, f"{n} x {plan.window_samples:,}", f"{samples:,}", f"{wire.seconds:.2f}",
                     f"{wire.seconds / reference:.2f}", f"{wire.counts.requests / n:.1f}" if remote else "-",
                     wire.by_method() or "-", f"{wire.counts.bytes_read / n / 2**20:.2f}" if remote else "-",
                     f"{wire.counts.bytes_read / corpus.sizes['all']:.2f}" if remote else "-",
                     f"{jsonl_bytes / corpus.sizes['jsonl']:.2f} ({jsonl_gets} GETs)" if remote else "-",
                     f"{parquet_bytes / corpus.sizes['parquet']:.2f} ({parquet_gets} GETs)" if remote else "-"])
    table("(2) read_window over every window of the plan, in this process (no tokenizing); ratio: seconds / disk",
          ["inputs", "windows", "samples", "seconds", "ratio", "requests per window", "requests (proxy)",
           "MiB read per window", "bytes read / input bytes", "JSONL: read / size", "Parquet: read / size"], rows)


STORM = "S3, throttled"


@contextlib.contextmanager
def phase_bytes(proxy) -> Iterator[dict[str, int]]:
    """Input bytes the proxy answered GETs with during the plan (the scan) and the probe of the
    packs inside: {"scan": ..., "probe": ...} (the rest of a pack's bytes: its windows)."""
    from packfeed.service.pipeline import preflight

    marks = {"scan": 0, "probe": 0}
    real = {"scan": preflight.build_plan, "probe": preflight.check_inputs}

    def counted(phase: str):
        def run(*args, **kwargs):
            start = proxy.bytes_out("GET")
            try:
                return real[phase](*args, **kwargs)
            finally:
                marks[phase] = proxy.bytes_out("GET") - start
        return run

    preflight.build_plan, preflight.check_inputs = counted("scan"), counted("probe")
    try:
        yield marks
    finally:
        preflight.build_plan, preflight.check_inputs = real["scan"], real["probe"]


def pack_bench(corpus: Corpus, proxy, work: Path, storm: bool = False) -> None:
    from packfeed.service.packjob.pack_run import run_pack
    from packfeed.service.cluster.raycluster import init_ray, shutdown_ray

    print("\n" + init_ray())
    results = {}
    runs = [("disk", corpus.local), ("S3", corpus.remote)] + ([(STORM, corpus.remote)] if storm else [])
    try:
        for where, base in runs:
            out = work / f"out-{where.lower().replace(', ', '-')}"
            with Wire(proxy) as wire, contextlib.redirect_stdout(io.StringIO()), phase_bytes(proxy) as phases:
                if where == STORM:
                    proxy.storm(every=10, burst=4, drop_every=5)
                stats = run_pack(data_config(base, corpus.window), out, overwrite=True, progress_seconds=3600)
                proxy.calm()
            results[where] = (stats, wire, pq.read_table(out))
            wire.phases = phases
    finally:
        shutdown_ray()
    reference = results["disk"][0]
    rows = []
    for where, (stats, wire, _) in results.items():
        steady, ref_steady = stats.get("steady_tokens_per_second"), reference.get("steady_tokens_per_second")
        if stats["windows"] < MIN_STEADY_WINDOWS:
            steady = None
        overall, ref_overall = stats["tokens"] / stats["seconds"], reference["tokens"] / reference["seconds"]
        _, bytes_out = wire.gets()
        windows = stats["windows"]
        remote = where.startswith("S3")
        rows.append([where, f"{stats['tokens']:,}", f"{windows}", f"{steady:,.0f}" if steady else "-",
                     f"{steady / ref_steady:.2f}" if steady and ref_steady else "-", f"{overall:,.0f}",
                     f"{overall / ref_overall:.2f}", f"{stats['first_row_seconds']:.1f}", wire.by_method() or "-",
                     f"{len(wire.requests) / windows:.1f}" if remote else "-",
                     f"{bytes_out / windows / 2**20:.2f}" if remote else "-",
                     f"{bytes_out / corpus.sizes['all']:.2f}" if remote else "-",
                     _breakdown(wire, bytes_out, corpus) if remote else "-",
                     f"{stats['storage']['read_ratio']:.2f}" if remote and "read_ratio" in stats["storage"] else "-"])
    same = results["disk"][2].equals(results["S3"][2])
    table("(3) packfeed pack end to end (run_pack; one embedded Ray for both, started before; output on disk; "
          f"requests and bytes: the whole run, counted by the proxy); ratio: tokens/s / disk. Same rows from disk and "
          f"S3: {same}",
          ["inputs", "tokens", "windows", "steady tokens/s", "ratio", "overall tokens/s", "ratio", "first row s",
           "requests (proxy)", "requests per window", "MiB read per window", "bytes read / input bytes",
           "of which scan + probe + windows", "stats.json read_ratio"], rows)
    if not same:
        raise SystemExit("the rows packed from disk and from S3 differ")
    if storm:
        storm_bench(results)


def _breakdown(wire: Wire, bytes_out: int, corpus: Corpus) -> str:
    """A pack's bytes read / input bytes by phase: the scan (plan), the probe, the windows (the rest)."""
    scan, probe = wire.phases["scan"], wire.phases["probe"]
    return " + ".join(f"{b / corpus.sizes['all']:.2f}" for b in (scan, probe, max(0, bytes_out - scan - probe)))


def storm_bench(results: dict) -> None:
    """The packs from S3, clean and throttled: what throttling cost, as the pack's stats count it."""
    rows = []
    for where in ("S3", STORM):
        stats, wire, _ = results[where]
        io_ = stats["storage"]
        answered = [r for r in wire.requests if r.method == "GET" and not r.is_list]
        rows.append([where, f"{stats['seconds']:.1f}", f"{stats['seconds'] / results['S3'][0]['seconds']:.2f}",
                     f"{len(answered):,}", f"{sum(r.status == 503 for r in answered):,}",
                     f"{sum(r.status == 0 for r in answered):,}", f"{io_['requests']:,}", f"{io_['retries']:,}",
                     f"{io_.get('throttled', 0):,}", f"{io_['failures']:,}", f"{io_.get('backoff_ms', 0) / 1000:.1f}"])
    same = results[STORM][2].equals(results["S3"][2])
    table("(3b) the pack from S3 clean and in a storm (the first 4 of every 10 GETs of each object 503 SlowDown, "
          "every 5th GET dropped), the default retry policy; proxy: GETs it saw, answered 503, dropped; the pack's "
          f"stats: requests, retries, throttled, failed, seconds backing off (summed over threads). Same rows: {same}",
          ["inputs", "seconds", "ratio", "GETs (proxy)", "503 (proxy)", "dropped (proxy)", "requests", "retries",
           "throttled", "failed", "backoff s"], rows)
    if not same:
        raise SystemExit("the rows packed through throttling differ from the clean pack's")


def restart_bench(corpus: Corpus, proxy, work: Path) -> None:
    """(4) ``packfeed serve`` from S3 (its state dir there too) read to the end by one rank, which
    keeps its state half-way; the server stopped (SIGTERM) and started again with an empty node
    read cache (another node's); the rank resumes from the kept state. What the restart read from
    the store against what remains: the byte ranges the windows from the cursor's on draw
    (inputs/extents.py, over the plan of the same files on disk). Blocks of ``RESTART_BLOCK``
    rows (a JSONL seek point at each): with the default 256, the windows of a small corpus each
    draw from every seek stretch, and what remains is nearly all the inputs whatever the cursor."""
    from support.serve import ServerProcess

    from packfeed.client.stream import PackedStream
    from packfeed.service.inputs.disk_cache import DIR_ENV
    from packfeed.service.inputs.extents import num_bytes, union, window_extents

    class StoreServer(ServerProcess):  # --state-dir a URI
        def command(self) -> list[str]:
            command = super().command()
            command[command.index("--state-dir") + 1] = f"{corpus.remote}-serve-state"
            return command

    inputs = [f"{corpus.remote}/web/*.jsonl", f"{corpus.remote}/sft/*.parquet"]
    flags = ["--tokenizer", demo_tokenizer_path(), "--seq-len", "2048", "--num-workers", "1", "--buffer-rows", "128",
             "--block-samples", str(RESTART_BLOCK), *(["--window-samples", str(corpus.window)] if corpus.window else [])]
    server = StoreServer([*inputs, *flags], log=work / "serve.log", state_dir=work,
                         env={"RAY_ADDRESS": "", DIR_ENV: str(work / "node-a")})
    try:
        with Wire(proxy) as first:
            server.start()
            with PackedStream(server.target, batch_rows=16) as stream:
                states = [stream.state_dict() for _ in stream]
            assert server.terminate() == 0, server.tail()
            proxy.wait_quiet()
        state, total = states[len(states) // 2], states[-1]["cursor"]
        server.env[DIR_ENV] = str(work / "node-b")  # another node: the first run's reads are not at hand
        offset = server.log.stat().st_size
        with Wire(proxy) as wire:
            server.start()
            with PackedStream(server.target, batch_rows=16, state=state) as stream:
                rest = sum(batch.num_rows for batch in stream)
            proxy.wait_quiet()
    finally:
        server.kill()
    started = re.findall(r"packing from window (\d+) of (\d+)", server.log.read_bytes()[offset:].decode())
    window, num_windows = map(int, started[-1])
    plan = build_plan(DataConfig.from_dict({"inputs": [i.replace(corpus.remote, corpus.local) for i in inputs],
                                            "tokenizer": demo_tokenizer_path(), "seq_len": 2048,
                                            "window_samples": corpus.window, "block_samples": RESTART_BLOCK}))
    metadata: dict = {}
    remains = num_bytes(union(window_extents(plan.window(k), metadata=metadata) for k in range(window, plan.num_windows)))
    read = sum(r.bytes_out for r in wire.requests if r.method == "GET" and r.key.startswith(f"{PREFIX}/"))
    first_read = sum(r.bytes_out for r in first.requests if r.method == "GET" and r.key.startswith(f"{PREFIX}/"))
    table("(4) packfeed serve from S3 (state dir on S3) stopped at a rank's cursor half-way and started again on a "
          f"fresh node (empty read cache), block_samples {RESTART_BLOCK}; remaining: the input byte ranges the windows "
          "from the cursor's on draw",
          ["rows", "cursor", "restart from window", "rows after it", "first run read / inputs", "remaining / inputs",
           "restart read", "restart read / remaining", "requests (proxy)"],
          [[f"{total:,}", f"{state['cursor']:,}", f"{window} of {num_windows}", f"{rest:,}",
            f"{first_read / corpus.sizes['all']:.2f}", f"{remains / corpus.sizes['all']:.2f}", f"{read:,}",
            f"{read / remains:.2f}", wire.by_method()]])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=float, default=64.0, help="corpus size in MB")
    parser.add_argument("--quick", action="store_true", help="a 4 MB corpus")
    parser.add_argument("--row-group", type=int, default=2048, help="Parquet rows per row group")
    parser.add_argument("--window", type=int, default=None, help="window_samples (default: packfeed's auto)")
    parser.add_argument("--only", choices=("scan", "read", "pack", "restart"), action="append",
                        help="run only these parts (repeatable)")
    parser.add_argument("--storm", action="store_true", help="pack from S3 once more while the store throttles")
    args = parser.parse_args(argv)
    megabytes = 4.0 if args.quick else args.mb
    only = set(args.only or ("scan", "read", "pack", "restart"))

    from support.s3 import S3Server
    from support.s3_proxy import FaultProxy

    work = Path(tempfile.mkdtemp(prefix="packfeed-bench-storage-"))
    try:
        root = work / "corpus"
        write_corpus(root, megabytes, args.row_group)
        sizes = {kind: sum(p.stat().st_size for p in root.rglob(f"*.{kind}")) for kind in ("jsonl", "parquet")}
        sizes["all"] = sizes["jsonl"] + sizes["parquet"]
        with S3Server() as server:
            proxy = FaultProxy(server.port).start()
            try:
                os.environ.update(server.env(proxy.endpoint))
                os.environ.pop("AWS_ENDPOINT_URL_S3", None)
                bucket = server.bucket("bench")
                server.upload_tree(root, bucket, PREFIX + "/")
                corpus = Corpus(str(root), f"s3://{bucket}/{PREFIX}", sizes, args.window, args.row_group)
                print(f"corpus: {sizes['all'] / 2**20:.1f} MiB ({sizes['jsonl'] / 2**20:.1f} MiB JSONL in 4 files, "
                      f"{sizes['parquet'] / 2**20:.1f} MiB Parquet in 2 files, {args.row_group:,} rows a row group) in "
                      f"{corpus.local} and {corpus.remote} (moto {server.endpoint}, through the counting proxy "
                      f"{proxy.endpoint}); {os.cpu_count()} CPUs")
                if "scan" in only:
                    scan_bench(corpus, proxy, work)
                if "read" in only:
                    read_bench(corpus, proxy)
                if "pack" in only:
                    pack_bench(corpus, proxy, work, storm=args.storm)
                if "restart" in only:
                    restart_bench(corpus, proxy, work)
            finally:
                proxy.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Scanning a run's input files: in parallel where it pays, each file once, reusing a manifest.

``scan_sources(sources, manifest)`` gives every source's files scanned, in order. A file the
manifest holds at its current identity (scan_cache.py) is not read. The others are scanned by
one of three engines, chosen by what there is to read:

* Ray tasks, when this process is connected to a Ray of at least ``MIN_RAY_NODES`` nodes with
  a free CPU, and there is at least ``RAY_MIN_BYTES`` to read: many files at once, a large
  JSONL file split in byte ranges of ``RANGE_BYTES`` (its newlines counted per range in
  parallel, combined in file order into exactly the rows and offsets of the sequential scan),
  read by the nodes rather than through the driver's network. A task asks for ``TASK_CPUS``
  (reading is partly waiting: two tasks per core); none is started while no CPU is free
  (packing actors holding them all: DESIGN.md's trap on 2 CPUs), the scan then runs here;
* a pool of ``SCAN_THREADS`` threads in this process, over the same parts: files on a store
  (the cost there is each request's latency), or at least ``THREAD_MIN_BYTES`` of local files
  (numpy's newline search releases the GIL);
* one file after another in this process: a few small local files.

A range cannot know which rows its newlines start (the rows before it are counted by other
tasks), so a part returns every newline's position (uint32, 4 bytes per row: ~0.4% of JSONL of
1 KB rows); this process keeps only the seek points, consuming results in file order with at
most ``MAX_IN_FLIGHT`` tasks outstanding, so its memory stays bounded whatever the corpus.

Why both: on one node a thread pool in this process counts newlines as fast as Ray tasks do
(counting runs at memory speed), while the first tasks on a fresh Ray pay their workers' start
and imports; tasks pay where other nodes read in parallel what one driver would fetch at its own
network's rate from a store: from about a GiB on (bench/bench_storage.py measures both).
"""

from __future__ import annotations

import functools
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np

from packfeed.service.inputs.scan import (
    SCAN_CHUNK,
    FileScan,
    SeekFinder,
    count_rows,
    identity_fields,
    newline_positions,
    recorded_identity,
    scan_errors,
    scan_file,
    seek_phase,
)
from packfeed.service.inputs.fileio import open_input
from packfeed.service.inputs.scan_cache import ScanManifest
from packfeed.service.storage import COUNTERS, ObjectInfo, StorageCounts, is_remote

RANGE_BYTES = 64 << 20  # a JSONL range of one task; also what one task reads of small files
MAX_PARTS_PER_TASK = 64  # small files batched into one task
FOOTER_BYTES = 1 << 20  # what a Parquet/Arrow part weighs in a task (a request or two)
RAY_MIN_BYTES = 1 << 30  # less to read than this: the tasks' start costs more than they save
MIN_RAY_NODES = 2  # on one node the threads here scan as fast as tasks (module docstring)
THREAD_MIN_BYTES = 32 << 20
TASK_CPUS = 0.5
SCAN_THREADS = 16
MAX_IN_FLIGHT = 64  # tasks outstanding: results (4 bytes per row) wait in Ray's object store


@dataclass(frozen=True)
class ScanItem:
    """One file of a source: ``path`` as planned (absolute local path or URI), its identity now
    and the source's seek stride."""

    path: str
    kind: str
    info: ObjectInfo
    stride: int


@dataclass(frozen=True)
class Part:
    """Bytes [start, start + length) of a file, for a task (JSONL); a whole file otherwise."""

    path: str
    kind: str
    info: ObjectInfo
    start: int
    length: int


def scan_sources(sources: list[list[ScanItem]],
                 manifest: ScanManifest | None = None) -> tuple[list[list[FileScan]], int]:
    """Every item scanned or taken from ``manifest``, in order; and how many were scanned."""
    manifest = manifest or ScanManifest()
    cached = [[manifest.matching(it.path, it.kind, it.info, it.stride) for it in items] for items in sources]
    todo = [it for items, hits in zip(sources, cached) for it, hit in zip(items, hits) if not hit]
    engine = choose_engine(todo)
    if engine is None:
        return _scan_inline(sources, cached)
    results = iter(engine(todo))
    out: list[list[FileScan]] = []
    again: list[tuple[int, int, int]] = []  # (source, file, first row): a cached scan at another phase
    for s, (items, hits) in enumerate(zip(sources, cached)):
        scans: list[FileScan] = []
        first_row = 0
        for f, (item, hit) in enumerate(zip(items, hits)):
            phase = seek_phase(first_row, item.stride) if item.kind == "jsonl" else 0
            if hit:
                scan = next((h for h in hit if h.seek_phase == phase), None)
                if scan is None:
                    again.append((s, f, first_row))
                    scan = hit[0]  # its rows are right; its offsets are replaced below
            else:
                scan = combine(item, next(results), phase)
            scans.append(scan)
            first_row += scan.num_rows
        out.append(scans)
    if again:
        redo = [sources[s][f] for s, f, _ in again]
        for (s, f, first_row), item, raw in zip(again, redo, engine(redo)):
            out[s][f] = combine(item, raw, seek_phase(first_row, item.stride))
    return out, len(todo) + len(again)


def _scan_inline(sources: list[list[ScanItem]],
                 cached: list[list[list[FileScan]]]) -> tuple[list[list[FileScan]], int]:
    out, scanned = [], 0
    for items, hits in zip(sources, cached):
        scans, first_row = [], 0
        for item, hit in zip(items, hits):
            phase = seek_phase(first_row, item.stride) if item.kind == "jsonl" else 0
            scan = next((h for h in hit if h.seek_phase == phase), None)
            if scan is None:
                scan = scan_file(item.path, item.kind, first_row=first_row, stride=item.stride, info=item.info)
                scanned += 1
            scans.append(scan)
            first_row += scan.num_rows
        out.append(scans)
    return out, scanned


def combine(item: ScanItem, raw: Any, phase: int) -> FileScan:
    """A file's scan from its parts' results (``scan_parts``), in file order."""
    if item.kind != "jsonl":
        num_rows, expect = raw
        return FileScan(item.path, item.kind, num_rows, **identity_fields(expect))
    identity = identity_fields(raw[0][3])
    finder = SeekFinder(phase, item.stride)
    end = 0
    for start, positions, end, _ in raw:
        finder.add(start, positions, end)
    num_rows, offsets = finder.finish(end)
    return FileScan(item.path, item.kind, num_rows, **identity, seek_offsets=offsets, seek_phase=phase,
                    seek_stride=item.stride)


def scan_parts(parts: list[Part]) -> list[Any]:
    """The task: per part, a JSONL range's ``(start, newline positions relative to start as
    uint32, end, identity)``, or a whole file's ``(row count, identity)``. The identity is the
    one the scan records (``recorded_identity``: on a store with its ETag), and the part is read
    as that version: the read cache (read_cache.py) then keeps its bytes under the key the
    windows will ask for."""
    out: list[Any] = []
    for part in parts:
        with scan_errors(part.path, part.kind):
            expect = recorded_identity(part.path, part.info)
            if part.kind != "jsonl":
                out.append((count_rows(part.path, part.kind, expect), expect))
                continue
            found, read = [], 0
            with open_input(part.path, expect=expect) as f:
                f.seek(part.start)
                while read < part.length and (chunk := f.read(min(SCAN_CHUNK, part.length - read))):
                    found.append((newline_positions(chunk) + read).astype(np.uint32))
                    read += len(chunk)
            out.append((part.start, np.concatenate(found) if found else np.zeros(0, np.uint32), part.start + read,
                        expect))
    return out


def split_parts(items: list[ScanItem]) -> tuple[list[list[Part]], list[int]]:
    """Tasks of parts (a large JSONL file in ranges, small files batched), and for each item
    its number of parts, in order."""
    tasks: list[list[Part]] = [[]]
    weight = 0
    per_item = []
    for item in items:
        size = item.info.size or 0
        if item.kind == "jsonl":
            parts = [Part(item.path, item.kind, item.info, a, min(RANGE_BYTES, size - a))
                     for a in range(0, size, RANGE_BYTES)] or [Part(item.path, item.kind, item.info, 0, 0)]
        else:
            parts = [Part(item.path, item.kind, item.info, 0, size)]
        per_item.append(len(parts))
        for part in parts:
            if tasks[-1] and (weight >= RANGE_BYTES or len(tasks[-1]) >= MAX_PARTS_PER_TASK):
                tasks.append([])
                weight = 0
            tasks[-1].append(part)
            weight += part.length if part.kind == "jsonl" else FOOTER_BYTES
    return [t for t in tasks if t], per_item


def run_in_order(items: list[ScanItem], submit: Callable[[list[Part]], Any], result: Callable[[Any], list[Any]],
                 max_in_flight: int) -> Iterator[Any]:
    """Each item's raw result (a list of JSONL ranges, or a row count), in order, with at most
    ``max_in_flight`` tasks outstanding."""
    tasks, per_item = split_parts(items)
    pending: list[Any] = []
    next_task = 0

    def part_results() -> Iterator[Any]:
        nonlocal next_task
        while pending or next_task < len(tasks):
            while next_task < len(tasks) and len(pending) < max_in_flight:
                pending.append(submit(tasks[next_task]))
                next_task += 1
            yield from result(pending.pop(0))

    parts = part_results()
    for item, n in zip(items, per_item):
        raw = [next(parts) for _ in range(n)]
        yield raw if item.kind == "jsonl" else raw[0]


def choose_engine(items: list[ScanItem]) -> Callable[[list[ScanItem]], Iterator[Any]] | None:
    """The engine for ``items`` (module docstring); None: one by one in this process."""
    if not items:
        return None
    to_read = sum((it.info.size or 0) if it.kind == "jsonl" else FOOTER_BYTES for it in items)
    cpus = _free_ray_cpus() if to_read >= RAY_MIN_BYTES else 0.0
    if cpus >= TASK_CPUS:
        return lambda todo: _on_ray(todo, max_in_flight=min(MAX_IN_FLIGHT, max(2, int(2 * cpus / TASK_CPUS))))
    if to_read >= THREAD_MIN_BYTES or (len(items) > 1 and any(is_remote(it.path) for it in items)):
        return _on_threads
    return None


def _free_ray_cpus() -> float:
    """Free CPUs of the Ray this process is connected to; 0 when none is, or it has fewer than
    ``MIN_RAY_NODES`` nodes (Ray is not imported for this: a driver that has not started Ray
    scans without it)."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized() or sum(n["Alive"] for n in ray.nodes()) < MIN_RAY_NODES:
        return 0.0
    return float(ray.available_resources().get("CPU", 0.0))


def _on_threads(items: list[ScanItem]) -> Iterator[Any]:
    with ThreadPoolExecutor(SCAN_THREADS) as pool:
        yield from run_in_order(items, lambda parts: pool.submit(scan_parts, parts), lambda fut: fut.result(),
                                max_in_flight=SCAN_THREADS + 2)


@functools.cache
def _ray_task() -> Any:
    import ray

    return ray.remote(num_cpus=TASK_CPUS)(_scan_parts_counted)


def _on_ray(items: list[ScanItem], *, max_in_flight: int) -> Iterator[Any]:
    import ray

    task = _ray_task()

    def result(ref: Any) -> list[Any]:
        try:
            out, counts = ray.get(ref)
        except ray.exceptions.RayTaskError as exc:  # the task's own one-line error, not Ray's wrapper
            raise (exc.cause if isinstance(exc.cause, ValueError) else exc) from None
        COUNTERS.add(**counts.as_dict())
        return out

    yield from run_in_order(items, task.remote, result, max_in_flight=max_in_flight)


def _scan_parts_counted(parts: list[Part]) -> tuple[list[Any], StorageCounts]:
    """``scan_parts`` in a Ray worker, with the requests and bytes it cost (for the driver's
    counts: stats and metrics show the scan's cost with the rest of the run's)."""
    before = COUNTERS.snapshot()
    out = scan_parts(parts)
    return out, COUNTERS.snapshot() - before

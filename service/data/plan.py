"""The stream plan: which rows of which files every packing window of every epoch holds.

``build_plan(config)`` runs on the driver, once: it lists every source's files, counts their rows
(``inputs.scan_tasks``: in parallel where that pays, and not at all for files a scan manifest
already holds unchanged) and fixes the mixture arithmetic of ``mixture.py`` (``plan_from_scans``,
which bench/bench_plan.py feeds simulated scans of 100,000 files). ``plan.window(k)``
then gives window k (numbered over the whole stream, epoch after epoch) as a ``WindowSpec``
of file pieces, computed on demand from small arrays, so the plan of a 100M-sample corpus is a
few MB however many epochs it has, and packing actors receive the plan, not a list of windows.

Global sample ids: sources in the order listed, then their files, then rows, so sample
``first_sample_id + r`` is row r of the source (counting bad rows). A sample repeated by
``repeat`` or ``weight`` keeps its id in every repetition.

Example: sources a (6 rows, repeat 1) and b (2 rows, repeat 1.5), window 4, block 2. Per
epoch a gives 6 samples and b 3 (round(1.5 x 2)); T = 9, so windows of (3, 1), (2, 2), and a
short (1, 0). Ids: a is 0..5, b is 6..7; b's second repetition of a row carries the same id.

A schedule (``[[data.schedule]]``) changes the windows' make-up from given windows on, never
their number or their place (epochs.py); ``with_schedule`` re-plans without a scan (online
changes), ``window_start_sample(k)`` says where window k starts.

Mixing block vs read cost: a source is shuffled in blocks of at most its samples per window
/ 32 (``mixing_block``), so a window draws at least ~32 places of each source even when it is
smaller than ``block_samples`` (window 200, two sources: blocks of 3, not one block of 256
from one file). Smaller blocks mean more seeks and more, shorter pieces per window (a JSONL
piece starts at the seek point of the configured ``block_samples`` and passes over the lines
before it; Parquet decodes each row group a block touches); ``block_samples`` stays the seek
stride of the scan, so scan manifests stay valid. Memory, per row of the inputs: the scans'
seek points, 8 bytes per ``block_samples`` rows, and, where windows are built, the block
order of the last two passes of each source, 4 bytes per block (per mixing block rows): at
bench/bench_plan.py's 10^10 rows in 4 sources, blocks of 64: 0.6 GB of orders, built in ~9 s
at the first window. The window counts: [K + 1, S] int64 per distinct epoch (one without a
schedule).
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from packfeed.client.offsets import offsets_of
from packfeed.service.data.config import DEFAULT_WINDOW_SAMPLES, MAX_SAMPLES_PER_EPOCH, MAX_WINDOWS, DataConfig
from packfeed.service.data.epochs import ScheduledEpochs
from packfeed.service.data.mixture import SourceOrder, epoch_counts, window_bounds
from packfeed.service.data.schedule import ScheduleEntry, check_schedule, weight_vector
from packfeed.service.inputs.files import InputFile, list_inputs
from packfeed.service.inputs.read import Piece, WindowSpec
from packfeed.service.inputs.scan import MAX_SEEK_STRIDE, FileScan
from packfeed.service.inputs.scan_cache import ScanManifest
from packfeed.service.inputs.scan_tasks import ScanItem, scan_sources
from packfeed.service.storage import COUNTERS, StorageCounts, StorageError, display, is_remote

logger = logging.getLogger("packfeed")

MIN_AUTO_WINDOW = 1024
MIN_BLOCKS_PER_WINDOW = 32  # every window draws at least this many blocks of each source (mixing_block)
QUIET_EXTRA_BYTES = 1 << 30  # warn_unaligned_blocks: a source whose misaligned blocks read < 1 GiB more per epoch is not warned about


def auto_window(samples_per_epoch: int) -> int:
    """The default window: 8192 samples, or an eighth of a small epoch (at least 1024), so that
    small data still makes several windows for several packing workers. It depends on the
    data only, never on the number of workers: the rows stay the same whatever the pool."""
    return int(min(DEFAULT_WINDOW_SAMPLES, max(MIN_AUTO_WINDOW, math.ceil(samples_per_epoch / 8))))


@dataclass(frozen=True)
class SourcePlan:
    """One source as planned: its files, where its rows start, what it gives per epoch."""

    index: int
    name: str
    format: str
    loss: str
    first_sample_id: int
    files: tuple[FileScan, ...]
    file_starts: np.ndarray  # int64 [F + 1]: source-local first row of each file, then the total
    samples_per_epoch: int
    block: int = 0  # rows read together when shuffling (0: file order)

    @property
    def num_rows(self) -> int:
        return int(self.file_starts[-1])


class StreamPlan:
    """Windows of the whole stream (all epochs); see the module docstring.

    ``schedule``: the config's entries (schedule.py); without one every epoch has the windows
    ``bounds``, with one the epochs in which an entry takes effect have their own (epochs.py).
    """

    def __init__(self, sources: Sequence[SourcePlan], *, window: int, epochs: int, block: int, seed: int,
                 schedule: tuple[ScheduleEntry, ...] = ()) -> None:
        self.sources = tuple(sources)
        self.window_samples, self.epochs, self.block, self.seed = window, epochs, block, seed
        self.counts = np.asarray([s.samples_per_epoch for s in sources], dtype=np.int64)
        self.bounds = window_bounds(self.counts, window)  # [K + 1, S]: an epoch under the config's weights
        self.schedule = tuple(schedule)
        if self.schedule and window < len(self.sources):
            raise ValueError(f"a schedule needs windows of at least as many samples as there are sources "
                             f"({len(self.sources)}); window_samples is {window}")
        names = [s.name for s in self.sources]
        self.epoch_windows = ScheduledEpochs(self.bounds, window=window, epochs=epochs,
                                             changes=[(e.from_sample, weight_vector(e, names)) for e in self.schedule])
        self._first_ids = np.asarray([s.first_sample_id for s in sources], dtype=np.int64)
        self._orders: dict[int, SourceOrder] = {}
        self.scan_storage = StorageCounts()  # what building the plan asked of object stores

    def with_schedule(self, schedule: tuple[ScheduleEntry, ...]) -> "StreamPlan":
        """This plan with another schedule, without scanning a file again (the sources, their
        blocks and seeded orders stay). An entry takes effect at the first window that starts at
        or after its ``from_sample``, so when every entry ``schedule`` adds (or changes) has
        ``from_sample >= self.window_start_sample(k)``, windows below k are the same in both
        plans. Costs O(windows per epoch x sources) of numpy per epoch in which an entry takes
        effect. ``schedule`` is checked as the config checks it (ValueError)."""
        schedule = check_schedule(schedule, [s.name for s in self.sources])
        plan = StreamPlan(self.sources, window=self.window_samples, epochs=self.epochs, block=self.block,
                          seed=self.seed, schedule=schedule)
        plan._orders, plan.scan_storage = self._orders, self.scan_storage
        return plan

    @property
    def windows_per_epoch(self) -> int:
        return len(self.bounds) - 1

    @property
    def num_windows(self) -> int:
        return self.windows_per_epoch * self.epochs

    @property
    def samples_per_epoch(self) -> int:
        return int(self.counts.sum())

    def epoch_of(self, window: int) -> int:
        return window // self.windows_per_epoch

    def source_of(self, sample_ids: np.ndarray) -> np.ndarray:
        """Source index of each global sample id (int64)."""
        return np.searchsorted(self._first_ids, np.asarray(sample_ids, dtype=np.int64), side="right") - 1

    def window_counts(self, window: int) -> np.ndarray:
        """Samples of each source in ``window`` (int64 [S])."""
        _, lo, hi = self.epoch_windows.window_range(window)
        return hi - lo

    def window_start_sample(self, k: int) -> int:
        """The global sample position at which window ``k`` starts (samples of the windows
        before it, over all epochs; ``k == num_windows`` gives the stream's length). A schedule
        entry with ``from_sample`` <= this and > the previous window's start takes effect at k."""
        if not 0 <= k <= self.num_windows:
            raise IndexError(f"window {k} is not in [0, {self.num_windows}]")
        if k == self.num_windows:
            return int(self.planned_samples().sum())
        return self.epoch_windows.window_start(k)

    def stage_of(self, k: int) -> int:
        """The schedule stage window ``k`` is in: 0 under the config's weights, i + 1 under
        schedule entry i (the last entry in force there)."""
        return self.epoch_windows.stage_of(k)

    def stage_summary(self) -> list[dict[str, Any]]:
        """Per stage: its number, the entry's ``from_sample`` (0 for the config's weights), the
        window it takes effect at and the sample that window starts at (num_windows and the
        stream's length for an entry past the end), and its weights (None: the config's)."""
        out: list[dict[str, Any]] = [{"stage": 0, "from_sample": 0, "window": 0, "start_sample": 0, "weights": None}]
        for i, (entry, k) in enumerate(zip(self.schedule, self.epoch_windows.effective_windows)):
            out.append({"stage": i + 1, "from_sample": entry.from_sample, "window": k,
                        "start_sample": self.window_start_sample(k), "weights": dict(entry.weights)})
        return out

    def planned_samples(self) -> np.ndarray:
        """Samples of each source over the whole run (int64 [S]); ``counts * epochs`` without a schedule."""
        return sum((r.num_epochs * r.bounds[-1] for r in self.epoch_windows.runs), np.zeros(len(self.sources), np.int64))

    def window(self, k: int) -> WindowSpec:
        """Window ``k``: for each source the next samples of its seeded sequence (see mixture.py)."""
        if not 0 <= k < self.num_windows:
            raise IndexError(f"window {k} is not in [0, {self.num_windows})")
        epoch, lo, hi = self.epoch_windows.window_range(k)
        pieces: list[Piece] = []
        for s in self.sources:
            for a, b in self._order(s).ranges(int(lo[s.index]), int(hi[s.index])):
                pieces.extend(file_pieces(s, a, b))
        return WindowSpec(index=k, epoch=epoch, pieces=tuple(_merge_text_pieces(pieces)))

    def _order(self, s: SourcePlan) -> SourceOrder:
        if s.index not in self._orders:
            self._orders[s.index] = SourceOrder(s.num_rows, block=s.block, seed=self.seed, source=s.index)
        return self._orders[s.index]

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_orders": {}}  # rebuilt on demand where the plan is used

    def fingerprint(self) -> str:
        """Digest of the files as scanned (paths, row counts, seek offsets) and the mixture:
        a manifest written before an input file changed is not trusted."""
        h = hashlib.sha256()
        for s in self.sources:
            h.update(f"{s.name}|{s.format}|{s.loss}|{s.samples_per_epoch}|{s.block}".encode())
            for f in s.files:
                h.update(f"{f.path}|{f.kind}|{f.num_rows}".encode())
                h.update(f.seek_offsets.tobytes())
        h.update(f"{self.window_samples}|{self.epochs}|{self.block}|{self.seed}".encode())
        return h.hexdigest()[:16]

    def summary(self) -> list[dict[str, Any]]:
        """Per source: name, files, rows, samples per epoch, planned share (under the config's
        weights) and first sample id: the source table a client maps sample ids with
        (``packfeed.client.sources``); source i holds ids [first_sample_id_i, first_sample_id_i + rows_i)."""
        total = max(self.samples_per_epoch, 1)
        return [
            {
                "name": s.name,
                "files": len(s.files),
                "rows": s.num_rows,
                "samples_per_epoch": s.samples_per_epoch,
                "planned_share": s.samples_per_epoch / total,
                "first_sample_id": s.first_sample_id,
            }
            for s in self.sources
        ]


def build_plan(config: DataConfig, *, scan_cache: str | None = None) -> StreamPlan:
    """Scan every source of ``config`` and plan the stream. Raises ValueError naming the source
    for an empty source or one that contributes nothing per epoch.

    ``scan_cache``: where the scan manifest lives (a local path or a URI, e.g. beside the run's
    metadata; inputs/scan_cache.py). It is read if it exists; a file whose identity (size,
    mtime, ETag) still matches its entry is not read at all; the others are scanned (in
    parallel where that pays: inputs/scan_tasks.py) and the manifest is written again. A
    manifest that cannot be written is warned about, never fatal: it only saves time."""
    before = COUNTERS.snapshot()
    listed: list[list[InputFile]] = []
    items: list[list[ScanItem]] = []
    for source in config.sources:
        fmt, block = config.source_format(source), source_block(config, source)
        stride = block if 0 < block <= MAX_SEEK_STRIDE else MAX_SEEK_STRIDE
        listed.append(list_inputs(source.paths))
        for file in listed[-1]:
            if file.kind == "text" and fmt not in ("auto", "text"):
                raise ValueError(f"source {source.name!r}: {display(file.path)} is a plain-text file (one document); "
                                 f"it holds format 'text', not {fmt!r}")
        items.append([ScanItem(planned_path(f.path), f.kind, f.info, stride) for f in listed[-1]])
    manifest = ScanManifest.load(scan_cache) if scan_cache else None
    scanned, num_scanned = scan_sources(items, manifest)
    if scan_cache:
        _save_manifest(scan_cache, manifest, [scan for scans in scanned for scan in scans], num_scanned)
    owners: dict[str, list[str]] = {}  # real path -> the sources reading it
    kept = []
    for source, files, scans in zip(config.sources, listed, scanned):
        kept.append([])
        for file, scan in zip(files, scans):
            if scan.num_rows == 0:
                logger.warning("input %s holds no rows", display(file.path))
                continue
            real = scan.path if is_remote(scan.path) else os.path.realpath(file.path)
            owners.setdefault(real, []).append(source.name)
            kept[-1].append(scan)
    warn_shared_files(owners)
    plan = plan_from_scans(config, kept)
    plan.scan_storage = COUNTERS.snapshot() - before  # the listing and the scan's requests to a store
    return plan


def planned_path(path: str) -> str:
    """A file as the plan names it: a URI as listed, a local path absolute."""
    return path if is_remote(path) else os.path.abspath(path)


def _save_manifest(uri: str, manifest: ScanManifest, scans: list[FileScan], num_scanned: int) -> None:
    """Write the scans of this plan (each (file, stride, phase) once) when any was new."""
    unique = list({(s.path, s.seek_stride, s.seek_phase): s for s in scans}.values())
    if num_scanned == 0 and manifest.num_scans == len(unique):
        return
    try:
        ScanManifest.save(uri, unique)
    except (StorageError, OSError) as exc:
        logger.warning("could not write the scan manifest %s (%s): the next run scans the inputs again",
                       display(uri), exc)


def plan_from_scans(config: DataConfig, scans: list[list[FileScan]]) -> StreamPlan:
    """The plan of ``config`` given each source's scanned files (those with rows, in order)."""
    planned: list[tuple[Any, tuple[FileScan, ...], np.ndarray, int]] = []
    next_id = 0
    for source, files in zip(config.sources, scans):
        starts = offsets_of([f.num_rows for f in files])
        if starts[-1] == 0:
            raise ValueError(f"source {source.name!r} has no rows: its files ({', '.join(source.paths)}) are empty")
        planned.append((source, tuple(files), starts, next_id))
        next_id += int(starts[-1])
    rows = [int(p[2][-1]) for p in planned]
    for (source, *_), n in zip(planned, rows):
        if source.repeat is not None and source.repeat * n > MAX_SAMPLES_PER_EPOCH:
            raise ValueError(f"source {source.name!r}: repeat {source.repeat:g} gives {source.repeat * n:.3g} samples per "
                             f"epoch of its {n:,} rows; at most {MAX_SAMPLES_PER_EPOCH:,}")
    if config.weighted:
        counts = epoch_counts(rows, weights=[s.weight for s in config.sources], samples_per_epoch=config.samples_per_epoch)
    else:
        counts = epoch_counts(rows, repeats=[s.repeat if s.repeat is not None else 1.0 for s in config.sources])
    for (source, *_), c in zip(planned, counts):
        if c == 0:
            raise ValueError(
                f"source {source.name!r} contributes 0 samples per epoch (its repeat or weight rounds to nothing): "
                "raise its repeat/weight or leave it out"
            )
    total = int(counts.sum())
    window = config.window_samples or auto_window(total)
    num_windows = config.epochs * -(-total // window)
    if num_windows > MAX_WINDOWS:
        raise ValueError(f"the run would have {num_windows:,} windows ({config.epochs:,} epoch(s) of {total:,} samples in "
                         f"windows of {window:,}); at most {MAX_WINDOWS:,}: raise window_samples or lower epochs")
    sources = [
        SourcePlan(i, src.name, config.source_format(src), config.source_loss(src), first_id, scans, starts, int(c),
                   mixing_block(source_block(config, src), int(c), total, window))
        for i, ((src, scans, starts, first_id), c) in enumerate(zip(planned, counts))
    ]
    warn_unaligned_blocks(sources, window)
    return StreamPlan(sources, window=window, epochs=config.epochs, block=config.block_samples, seed=config.seed,
                      schedule=config.schedule)


def warn_unaligned_blocks(sources: list[SourcePlan], window: int) -> None:
    """One warning per source whose block ``mixing_block`` capped below its JSONL files' seek
    stride: each block then reads from the seek point before it, on average half a stride of
    rows more (measured: a small-window pack of JSONL on S3 read its inputs 4.8x instead of
    2.3x). Setting ``block_samples`` to the capped block puts a seek point at every block, at 8
    bytes of plan per seek point. Said only where it costs something: a source whose extra
    reads come to less than ``QUIET_EXTRA_BYTES`` per epoch (every bundled corpus, any source
    of a few hundred MB) is left unsaid."""
    for s in sources:
        jsonl = [f for f in s.files if f.kind == "jsonl" and f.seek_stride > s.block]
        if not s.block or not jsonl:
            continue
        stride = max(f.seek_stride for f in jsonl)
        extra = sum(max(f.size, 0) for f in jsonl) * stride / (2 * s.block)
        if extra >= QUIET_EXTRA_BYTES:
            logger.warning(
                "source %r: blocks of %d rows (capped so that every window of %d samples draws at least %d places of "
                "it), but its JSONL seek points are %d rows apart: each block reads about %d rows before its start, "
                "~%.1f GB more per epoch. Set block_samples = %d on the source to read only its rows",
                s.name, s.block, window, MIN_BLOCKS_PER_WINDOW, stride, stride // 2, extra / 1e9, s.block)


def warn_shared_files(owners: dict[str, list[str]]) -> None:
    """One warning for files that several sources read (overlapping globs or directories, or
    a path listed twice): each source counts their rows, so they are in the mixture once per
    source. A file listed twice inside one source is read once (``inputs.files.expand_inputs``)."""
    shared = {path: names for path, names in owners.items() if len(names) > 1}
    if not shared:
        return
    path, names = next(iter(shared.items()))
    more = f" (and {len(shared) - 1} more file(s) read by several sources)" if len(shared) > 1 else ""
    logger.warning("%s is in sources %s%s: each of them reads its rows, so they count once per source; give each file "
                   "to one source (repeat or weight sets how often a source's rows come)",
                   path, " and ".join(repr(n) for n in names), more)


def source_block(config: DataConfig, source: Any) -> int:
    """The block the config asks for (the source's, else the data config's): the scan's seek stride."""
    return config.block_samples if source.block_samples is None else source.block_samples


def mixing_block(block: int, count: int, total: int, window: int) -> int:
    """The block a source is shuffled in: ``block``, capped so that a window draws at least
    ``MIN_BLOCKS_PER_WINDOW`` blocks of the source (its samples per window / 32, at least 1);
    0 (file order) stays 0. Window 200, two sources of 100 per window: blocks of 3, not 256.
    Depends on the config's own weights only, never on a schedule, so a schedule entry (or an
    online change) leaves every source's seeded sequence as it is."""
    if block == 0:
        return 0
    return max(1, min(block, min(window, total) * count // (total * MIN_BLOCKS_PER_WINDOW)))


def file_pieces(s: SourcePlan, lo: int, hi: int) -> list[Piece]:
    """Source-local rows [lo, hi) as pieces, split where files end."""
    out = []
    f = int(np.searchsorted(s.file_starts, lo, side="right")) - 1
    while lo < hi:
        scan, start = s.files[f], int(s.file_starts[f])
        end = min(hi, int(s.file_starts[f + 1]))
        row = lo - start
        seek_row, byte_offset = scan.seek(row)
        out.append(Piece(
            path=scan.path, kind=scan.kind, format="text" if scan.kind == "text" else s.format, source=s.index,
            start_row=row, num_rows=end - lo, first_sample_id=s.first_sample_id + lo,
            byte_offset=byte_offset, seek_row=seek_row, end_offset=scan.end_offset(end - start) if scan.kind == "jsonl" else -1,
            files=(scan.path,) if scan.kind == "text" else (),
            size=scan.size, mtime_ns=scan.mtime_ns, etag=scan.etag,
        ))  # fmt: skip
        lo, f = end, f + 1
    return out


def _merge_text_pieces(pieces: list[Piece]) -> list[Piece]:
    """Consecutive one-document text files of a source (consecutive ids) become one piece."""
    out: list[Piece] = []
    for p in pieces:
        prev = out[-1] if out else None
        if (
            prev is not None and p.kind == "text" and prev.kind == "text" and prev.source == p.source
            and prev.first_sample_id + prev.num_rows == p.first_sample_id
        ):
            out[-1] = Piece(prev.path, "text", "text", prev.source, 0, prev.num_rows + 1, prev.first_sample_id,
                            files=prev.files + p.files)
        else:
            out.append(p)
    return out

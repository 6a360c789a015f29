"""One packed stream as the hub sees it: how to read it, how to re-pack one window, what it is.

``open_stream`` makes the ``RowStream`` of either kind, so ``packfeed serve`` and ``packfeed
train`` serve both the same way:

* a ``StreamPlan``: the PackingPipeline of a data config (packing actors on Ray). The main
  reader is a pipeline from a window on; the catch-up path (far consumers, see hub.py) packs
  single windows on request in this process, with the tokenizer the driver loaded anyway (one
  tokenizer thread; no actor to start: a peek costs one window's packing and nothing else).
  Its mixture can change during the run (``mixture``, delivery/mixture_changes.py): a reader
  packing with a plan a change made stale starts a new pipeline at the change's window.
* a ``PackedDir``: a finished ``packfeed pack`` directory, served as it is (pack once, train
  many), on disk or on a store (``s3://bucket/packed``: read by ranged requests). Its windows
  are the Parquet row groups; their first rows are known from the metadata, so any cursor is
  reached at once and no Ray is needed. ``find_packed_dir(inputs)`` says whether the inputs of
  a command are one.

Describe's epochs and rows per epoch come from here too (``epoch_rows``).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence


from packfeed.client.rows import PackedRows, renumber_rows
from packfeed.service import storage
from packfeed.service.data.config import DataConfig, ScheduleEntry, check_schedule_weights
from packfeed.service.delivery.hub import OpenReader, PackWindow
from packfeed.service.delivery.manifest import Manifest
from packfeed.service.delivery.mixture_changes import MixtureControl, read_with_changes
from packfeed.service.packed.arrow_rows import ROW_SCHEMA, rows_from_arrow
from packfeed.service.packed.writer import open_parquet, packed_dir_info, part_files
from packfeed.service.pipeline.preflight import load_tokenizer_for
from packfeed.service.cluster.scaling import PackingScaling
from packfeed.service.pipeline.stats import RunStats, new_run_stats
from packfeed.service.pipeline.summary import format_summary
from packfeed.service.pipeline.window import process_window
from packfeed.service.tokenize.fast.backend import log_choices
from packfeed.service.tokenize.samples import SampleTokenizer

if TYPE_CHECKING:
    from packfeed.service.data.plan import StreamPlan

logger = logging.getLogger("packfeed")


@dataclass
class RowStream:
    """Everything a RowHub and Describe need about one stream."""

    config_hash: str
    seq_len: int
    tokenizer_name: str
    vocab_size: int
    pad_id: int
    epochs: int
    windows_per_epoch: int
    sources: list[dict[str, Any]]  # the mixture's: name, rows, samples_per_epoch, planned_share
    samples_per_epoch: int
    manifest_key: str
    open_reader: OpenReader
    pack_window: PackWindow | None
    stats: RunStats | None = None  # packing accounting of the windows packed (pipeline only)
    packed_stats: dict[str, Any] | None = None  # a packed directory's stats.json (packed before)
    known_first_rows: dict[int, int] = field(default_factory=dict)  # a packed dir knows them all
    known_total: int | None = None
    fixed_epoch_rows: list[int] | None = None  # a packed dir records its epochs' rows
    close: Callable[[], None] = lambda: None
    mixture: MixtureControl | None = None  # online mixture changes (None: a packed directory)

    def seed_manifest(self, manifest: Manifest) -> None:
        """Give the manifest what the stream already knows (a packed directory: everything)."""
        for window, row in self.known_first_rows.items():
            manifest.record(window, row)
        if self.known_total is not None:
            manifest.record_end(self.known_total)

    def epoch_rows(self, manifest: Manifest) -> list[int]:
        """Rows of each epoch whose end is known, in order (from the windows' first rows)."""
        if self.fixed_epoch_rows is not None:
            return list(self.fixed_epoch_rows)
        firsts = manifest.to_dict()["first_row"]
        out, e = [], 0
        while e < self.epochs:
            start = firsts.get(str(e * self.windows_per_epoch))
            end = manifest.total_rows if e + 1 == self.epochs else firsts.get(str((e + 1) * self.windows_per_epoch))
            if start is None or end is None:
                break
            out.append(int(end) - int(start))
            e += 1
        return out


@dataclass(frozen=True)
class PackedDir:
    """A finished ``packfeed pack`` directory: ``info`` is its ``writer.packed_dir_info``
    (``{"config": ..., "stats": ...}``)."""

    path: str
    info: dict[str, Any]

    @property
    def seq_len(self) -> int:
        return int(self.info["config"]["data"]["seq_len"])

    @property
    def num_rows(self) -> int:
        return int(self.info["stats"]["rows"])


def find_packed_dir(inputs: Sequence[str]) -> PackedDir | None:
    """The packed directory when ``inputs`` is one (a directory or a URI: then served as it
    is), None when they are data to pack; ValueError for a packfeed output that is unfinished
    or failed."""
    info = packed_dir_info(inputs[0]) if len(inputs) == 1 else None
    return None if info is None else PackedDir(str(inputs[0]), info)


def open_stream(packed_or_plan: PackedDir | StreamPlan, config: DataConfig | None = None, *, tokenizer: Any = None,
                scaling: PackingScaling | None = None) -> RowStream:
    """The RowStream of ``packed_or_plan``: a ``PackedDir`` as it is (no Ray), or a
    ``StreamPlan`` of the DataConfig ``config`` through its PackingPipeline (Ray initialised)
    with the packing actors ``scaling`` (placed by ``place_packing``; None: one per CPU);
    ``tokenizer``: the driver's SampleTokenizer, loaded from ``config`` when None (in a process
    of its own, such as train's feeder actor)."""
    if isinstance(packed_or_plan, PackedDir):
        return packed_dir_stream(packed_or_plan.path, packed_or_plan.info)
    if tokenizer is None:
        tokenizer = load_tokenizer_for(config)
    return pipeline_stream(config, packed_or_plan, tokenizer, scaling or PackingScaling())


def pipeline_stream(config: DataConfig, plan: StreamPlan, tokenizer: Any, scaling: PackingScaling) -> RowStream:
    """The stream of ``config``'s PackingPipeline (Ray initialised). ``tokenizer``: the driver's
    SampleTokenizer (pad id, vocabulary, and the catch-up path's packing); ``scaling``: the
    packing actors' PackingScaling."""
    from packfeed.service.pipeline.ray_pipeline import PackingPipeline  # imports Ray

    stats = new_run_stats(plan)

    @functools.cache
    def catch_up_tokenizers() -> dict[str, SampleTokenizer]:
        """The catch-up path's tokenizers, built at its first window (train's feeder never takes it)."""
        return {loss: SampleTokenizer(tokenizer.tokenizer, loss=loss, add_eos=config.add_eos, strict=config.strict,
                                      backend=config.tokenizer_backend, num_threads=1)
                for loss in {s.loss for s in plan.sources}}

    mixture = mixture_control(config, plan)
    shipped = tokenizer.ship()  # what every reader's packing actors load (the mixture may change, not the tokenizer)

    def plan_reader(current_config: DataConfig, current_plan: StreamPlan, window: int,
                    first_row: int) -> Iterable[tuple[int, PackedRows]]:
        logger.info("packing from window %d of %d (row %s)", window, current_plan.num_windows, f"{first_row:,}")
        pipeline = PackingPipeline(current_config, current_plan, scaling=scaling, start_window=window, stats=stats,
                                   tokenizer=shipped)
        for out in pipeline.iter_windows(first_row):
            yield out.window, out.rows
        report_end_of_stream(stats, config.seq_len)

    def open_reader(window: int, first_row: int) -> Iterable[tuple[int, PackedRows]]:
        return read_with_changes(mixture, plan_reader, window, first_row)

    def pack_window(window: int) -> PackedRows | None:
        current_config, current_plan = mixture.plan_for(window)
        if window >= current_plan.num_windows:
            return None
        rows, window_stats = process_window(current_plan.window(window), catch_up_tokenizers(), current_config,
                                             current_plan)
        said = len(stats.tokenizer_checks)
        stats.add(window_stats)
        log_choices(stats.tokenizer_checks, said)
        return rows

    return RowStream(
        config_hash=config.config_hash(), seq_len=config.seq_len, tokenizer_name=tokenizer.name,
        vocab_size=tokenizer.vocab_size, pad_id=tokenizer.pad_id, epochs=plan.epochs,
        windows_per_epoch=plan.windows_per_epoch, sources=plan.summary(), samples_per_epoch=plan.samples_per_epoch,
        manifest_key=f"{config.config_hash()}-{plan.fingerprint()}", open_reader=open_reader,
        pack_window=pack_window, stats=stats, mixture=mixture,
    )  # fmt: skip


def mixture_control(config: DataConfig, plan: StreamPlan) -> MixtureControl:
    """The MixtureControl of ``config``'s stream: a change's plan is ``plan`` with the new
    schedule (data/plan.py keeps the windows before an entry as they were)."""
    names = [s.name for s in plan.sources]

    def plan_with(schedule: tuple) -> tuple[DataConfig, StreamPlan]:
        return dataclasses.replace(config, schedule=schedule), plan.with_schedule(schedule)

    return MixtureControl(config, plan, plan_with=plan_with, check_weights=lambda w: check_schedule_weights(w, names),
                          entry=lambda from_sample, weights: ScheduleEntry(from_sample=from_sample, weights=weights))


def packed_dir_stream(path: str | Path, info: dict[str, Any]) -> RowStream:
    """The rows of a finished ``packfeed pack`` directory (``info``: writer.packed_dir_info), a
    local directory or a URI. On a store: a listing, then per part file a HEAD and its footer
    at the start, and per row group read a HEAD (the part must be the version first seen) and
    its column chunks by range."""
    path = os.fspath(path)
    config, stats = info["config"], info["stats"]
    parts: list[tuple[str, Any, Any]] = []  # (file, its version or None on disk, its footer)
    groups: list[tuple[int, int, int]] = []  # (part, row group, first row)
    first = 0
    for f in part_files(path):
        version = storage.stat(f) if storage.is_remote(f) else None
        meta = open_parquet(f, expect=version).metadata
        parts.append((f, version, meta))
        for g in range(meta.num_row_groups):
            groups.append((len(parts) - 1, g, first))
            first += meta.row_group(g).num_rows
    if first != stats.get("rows"):
        raise ValueError(f"{storage.display(path)}: its Parquet files hold {first:,} rows, its stats.json "
                         f"{stats.get('rows')!r}: the directory changed after packing; pack it again")

    def read(k: int) -> PackedRows:
        part, g, start = groups[k]
        f, version, meta = parts[part]
        table = open_parquet(f, expect=version, metadata=meta).read_row_group(g)
        table = table.select([n for n in ROW_SCHEMA.names if n in table.column_names])  # older: no pair_roles
        rows = rows_from_arrow(table)
        return renumber_rows(rows, start)

    def open_reader(window: int, first_row: int) -> Iterable[tuple[int, PackedRows]]:
        for k in range(window, len(groups)):
            yield k, read(k)

    def pack_window(window: int) -> PackedRows | None:
        return None if window >= len(groups) else renumber_rows(read(window), 0)

    tok = config.get("tokenizer", {})
    plan = config.get("plan", {})
    epochs = int(plan.get("epochs", 1))
    known = {k: s for k, (_, _, s) in enumerate(groups)}  # every row group's first row
    return RowStream(
        config_hash=config["config_hash"], seq_len=int(config["data"]["seq_len"]),
        tokenizer_name=tok.get("name", config["data"]["tokenizer"]), vocab_size=int(tok.get("vocab_size", 0)),
        pad_id=int(tok.get("pad_id", 0)), epochs=epochs, windows_per_epoch=max(len(groups), 1),
        sources=plan.get("sources", []), samples_per_epoch=int(plan.get("samples_per_epoch", 0)),
        manifest_key=f"{config['config_hash']}-packed-{first}", open_reader=open_reader, pack_window=pack_window,
        known_first_rows=known, known_total=first, fixed_epoch_rows=list(stats.get("epoch_rows") or [first]),
        packed_stats=stats,
    )  # fmt: skip


def report_end_of_stream(stats: RunStats, seq_len: int) -> None:
    """The packing report at the end of the stream: totals, sources, skips (why, which); no
    time or rate (windows were packed by several readers, at the consumers' pace)."""
    summary = {k: v for k, v in stats.to_dict(seq_len=seq_len, seconds=0.0).items()
               if k not in ("seconds", "tokens_per_second")}
    logger.info("end of stream reached (%d windows packed by this process):\n%s", stats.windows,
                format_summary(summary))
    for name in stats.empty_sources():
        logger.warning("source %r delivered no sample: every row read was bad", name)

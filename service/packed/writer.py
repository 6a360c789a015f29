"""Write packed rows as a Parquet dataset directory, streaming, with bounded memory, on disk or
on an object store (``s3://bucket/prefix``, any URI ``service.storage`` serves).

Layout of DIR: ``part-00000.parquet``, ``part-00001.parquet``, ... (the columns
``arrow_rows.rows_to_arrow`` makes, rows in stream order with their global ``row_index``; each
file's schema metadata carries ``packfeed.seq_len`` and ``packfeed.config_hash``) and a hidden
``.packfeed/`` directory: ``files.json`` (every file this run wrote, listed before it is created), ``config.json`` (the
data config and its hash, credentials removed from its URIs), ``scan.npz`` (the inputs' scan
manifest, inputs/scan_cache.py: a second pack of the same inputs reads none of them to plan)
and ``stats.json``, written last: ``"status": "complete"`` marks a finished output. Readers
that skip hidden entries (pyarrow datasets, Hugging Face ``datasets``) see a plain Parquet
dataset: ``pq.read_table(DIR)`` and ``load_dataset("parquet", data_dir=DIR)`` work as they are.

``packfeed pack`` has its packing actors write the part files, one per window (``write_part``,
packed/part_sink.py), and this writer the metadata (``list_parts`` names them first);
``ParquetRowWriter.write`` streams rows from one process into parts of ``rows_per_file``.

On an object store a part file is one object, uploaded as it is written (a multipart upload
past the first part) and visible only once complete; the metadata files are each one PUT. The
completion marker comes last there too, so a crashed run never looks complete.

Safety (location.py): the output may not be, contain or lie inside an input; a directory (a
key prefix) holding anything packfeed did not write is refused; ``overwrite`` removes only the
part files a previous packfeed run listed in its ``files.json`` and its ``.packfeed/``
metadata (the scan manifest stays: it describes the inputs, and is checked against them).
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from packfeed.client.rows import PackedRows
from packfeed.service import storage
from packfeed.service.packed.arrow_rows import PART_SCHEMA, ROW_SCHEMA, rows_from_arrow, rows_to_arrow
from packfeed.service.packed.location import (
    META_DIR,
    check_output,
    check_writable,
    clear_previous,
    written_files,
)
from packfeed.service.storage.store_errors import classify
from packfeed.service.storage.tree import read_if_exists

# ~32 MiB of token columns per row group at L=4096 (3 int32 columns * 4096 * 4 B * 682).
TARGET_ROW_GROUP_BYTES = 32 << 20
TARGET_FILE_BYTES = 512 << 20


class ParquetRowWriter:
    """``ParquetRowWriter(DIR, seq_len=..., config_hash=..., inputs=[...])``, then ``write``
    blocks of rows and ``close(config=..., stats=...)``. Checks DIR at construction. DIR: a
    local directory or a URI."""

    def __init__(self, out_dir: str | Path, *, seq_len: int, config_hash: str, overwrite: bool = False,
                 inputs: Sequence[str] = ()) -> None:
        self.out_dir = os.fspath(out_dir)
        prepare_output(self.out_dir, inputs=inputs, overwrite=overwrite)
        self.meta = storage.join(self.out_dir, META_DIR)
        if not storage.is_remote(self.out_dir):
            Path(self.meta).mkdir(parents=True, exist_ok=True)
        self._files: list[str] = []
        self._save_files()
        self._metadata = part_metadata(seq_len, config_hash)
        row_bytes = 3 * 4 * seq_len
        self.rows_per_group = rows_per_group(seq_len)
        self.rows_per_file = max(self.rows_per_group, TARGET_FILE_BYTES // row_bytes)
        self._writer: pq.ParquetWriter | None = None
        self._rows_in_file = 0
        self.num_files = 0

    def write(self, rows: PackedRows) -> None:
        table = rows_to_arrow(rows, PART_SCHEMA)
        start = 0
        while start < table.num_rows:
            if self._writer is None or self._rows_in_file >= self.rows_per_file:
                self._open_next(table.schema)
            take = min(table.num_rows - start, self.rows_per_file - self._rows_in_file)
            self._on_store(lambda: self._writer.write_table(table.slice(start, take), row_group_size=self.rows_per_group))
            self._rows_in_file += take
            start += take

    def _open_next(self, schema: pa.Schema) -> None:
        self._close_file()
        name = f"part-{self.num_files:05d}.parquet"
        self._files.append(name)
        self._save_files()  # listed before it exists: an interrupted run's files can be removed
        self._writer = self._on_store(lambda: open_part(storage.join(self.out_dir, name), schema, self._metadata))
        self.num_files += 1
        self._rows_in_file = 0

    def list_parts(self, names: Sequence[str]) -> None:
        """Name the part files other processes (the packing actors) are about to write, before
        any exists: an interrupted run's files can be removed (``close`` lists those written)."""
        self._files = list(names)
        self._save_files()

    def _close_file(self) -> None:
        if self._writer is not None:
            self._on_store(self._writer.close)  # on a store: the upload completes here
            self._writer = None

    def _on_store(self, fn):
        """``fn()`` (a Parquet write); on a store a failure is one line naming the part file
        (pyarrow's S3 client has retried it already: ``storage.resolve``)."""
        if not storage.is_remote(self.out_dir):
            return fn()
        try:
            return fn()
        except OSError as exc:
            part = storage.join(self.out_dir, self._files[-1])
            raise storage.StorageError(storage.display(part), f"writing it failed ({classify(exc).detail})") from None

    def _save_files(self) -> None:
        _write_json(storage.join(self.meta, "files.json"), {"files": self._files})

    def abandon(self) -> None:
        """End a failed run: finish the part being written (listed in files.json already) and
        write no metadata, so the output says it is incomplete. Done now rather than by the
        Parquet writer's finaliser whenever it runs (on a store: an upload completing after a
        later run started over the same keys). A failure to finish is left unsaid: the run's
        own error is the one to report."""
        with contextlib.suppress(Exception):
            self._close_file()

    def close(self, *, config: dict[str, Any], stats: dict[str, Any], status: str = "complete",
              written: Sequence[str] | None = None) -> None:
        """Finish the last file, then write config.json and stats.json (with ``status``);
        ``written``: the part files the packing actors wrote (``list_parts`` named more: a
        window with no row writes none), listed in files.json as this writer's own are."""
        self._close_file()
        if written is not None:
            self._files, self.num_files = list(written), len(written)
            self._save_files()
        # an input URI may carry credentials (s3://KEY:SECRET@bucket/...): never written down
        _write_json(storage.join(self.meta, "config.json"), config, scrub=True)
        _write_json(storage.join(self.meta, "stats.json"), {"status": status, **stats})


def part_metadata(seq_len: int, config_hash: str) -> dict[bytes, bytes]:
    """The schema metadata of every part file of an output."""
    return {b"packfeed.seq_len": str(seq_len).encode(), b"packfeed.config_hash": config_hash.encode()}


def rows_per_group(seq_len: int) -> int:
    """Rows per Parquet row group: ~``TARGET_ROW_GROUP_BYTES`` of token columns."""
    return max(1, TARGET_ROW_GROUP_BYTES // (3 * 4 * seq_len))


def open_part(uri: str, schema: pa.Schema, metadata: dict[bytes, bytes]) -> pq.ParquetWriter:
    """A Parquet writer of one part file at ``uri`` (a path or a URI): the columns ``schema``
    (``rows_to_arrow``'s, ``PART_SCHEMA``) with the output's ``metadata``."""
    fs, path = storage.resolve(uri)
    # No dictionary pages: token ids over a 100k+ vocabulary overflow the dictionary anyway;
    # building it costs ~30% of the write's CPU for no smaller file (bench/bench_write.py
    # measures the write's settings). Statistics (min/max per page) for row_index alone: a
    # reader can find a row by them; the token columns' are never read (~6% of the write). zstd
    # at its default level, plain encodings: any Parquet reader reads the parts (BYTE_STREAM_SPLIT
    # for the token columns saves some of the write's CPU but needs Parquet 2.11 readers;
    # bench/bench_write.py weighs it with other levels and codecs). The page buffers grow by
    # reallocation: mimalloc (Arrow's default pool) copies them at every growth, the system's
    # allocator remaps large blocks.
    return pq.ParquetWriter(path, schema.with_metadata(metadata), filesystem=fs, compression="zstd",
                            use_dictionary=False, write_statistics=["row_index"],
                            memory_pool=pa.system_memory_pool())


def write_part(uri: str, rows: PackedRows, *, seq_len: int, config_hash: str) -> None:
    """One whole part file of ``rows`` at ``uri`` (what a packing actor writes per window); on a
    store a failure is one StorageError naming it."""
    table = rows_to_arrow(rows, PART_SCHEMA)
    try:
        writer = open_part(uri, table.schema, part_metadata(seq_len, config_hash))
        with writer:
            writer.write_table(table, row_group_size=rows_per_group(seq_len))
    except OSError as exc:
        if not storage.is_remote(uri):
            raise
        raise storage.StorageError(storage.display(uri), f"writing it failed ({classify(exc).detail})") from None


def _write_json(uri: str, value: Any, *, scrub: bool = False) -> None:
    text = json.dumps(value, indent=2) + "\n"
    storage.write_bytes_atomic(uri, (storage.scrub(text) if scrub else text).encode())


def prepare_output(out_dir: str | Path, *, inputs: Sequence[str], overwrite: bool, clear: bool = True) -> None:
    """Check ``out_dir`` (see the module docstring) and clear a previous packfeed output there
    when ``overwrite`` and ``clear``; ValueError naming the problem otherwise. ``clear=False``
    only checks (and creates the directory): a command checks first and clears once every
    other check has passed, so a mistake never costs the previous output."""
    out = os.fspath(out_dir)
    ours = check_output(out, inputs=inputs, overwrite=overwrite)
    if clear and ours is not None:
        clear_previous(out, ours)
    check_writable(out)


def packed_dir_info(path: str | Path) -> dict[str, Any] | None:
    """{"config": ..., "stats": ...} of a finished ``packfeed pack`` output (a directory or a
    URI), None when ``path`` is not one; ValueError for an unfinished (see
    ``incomplete_output``) or failed one. On a store: 2 to 6 requests (HEAD and GET of each
    metadata file there is)."""
    path = os.fspath(path)
    if storage.is_remote(path) and storage.has_magic(path):
        return None  # a glob of inputs, not a directory
    meta = storage.join(path, META_DIR)
    config = read_if_exists(storage.join(meta, "config.json"))
    if config is None:
        if read_if_exists(storage.join(meta, "files.json")) is not None:
            raise ValueError(incomplete_output(path))
        return None
    stats_data = read_if_exists(storage.join(meta, "stats.json"))
    stats = {} if stats_data is None else _json_object(stats_data, storage.join(meta, "stats.json"), _PACK_AGAIN)
    if stats.get("status") != "complete":
        raise ValueError(f"{storage.display(path)} is an unfinished or failed packfeed output (status "
                         f"{stats.get('status', 'running')!r}): pack it again")
    return {"config": _json_object(config, storage.join(meta, "config.json"), _PACK_AGAIN), "stats": stats}


_PACK_AGAIN = "pack the directory again"


def incomplete_output(path: str | Path) -> str:
    """What an output a pack never finished (killed, crashed) holds and lacks: its part files
    are listed in files.json, config.json and stats.json are written only at the end. A part
    file the pack was writing when it stopped has no Parquet footer: it is named as cut off
    (on a store such a part is usually absent: an upload becomes visible only once complete)."""
    path = os.fspath(path)
    listed = written_files(path) or []
    present = {os.path.basename(f) for f in part_files(path)}
    rows, cut, held = 0, [], [name for name in listed if name in present]
    for name in held:
        try:
            rows += open_parquet(storage.join(path, name)).metadata.num_rows
        except (OSError, ValueError):  # pyarrow's ArrowInvalid is a ValueError
            cut.append(name)
    summary = f"{len(held)} part file(s) with {rows:,} rows" if held else "no part file yet"
    if cut:
        summary = f"{len(held)} part file(s) ({rows:,} rows readable; {', '.join(cut)} cut off while it was written)"
    return (f"{storage.display(path)} is incomplete: a packfeed pack started there and did not finish; it has "
            f"{summary} and lacks {META_DIR}/config.json and {META_DIR}/stats.json (written when a pack ends): "
            "pack it again with --overwrite")


def _json_object(data: bytes, path: str, fix: str) -> dict:
    try:
        value = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError is a ValueError
        raise ValueError(f"{storage.display(path)} is not a valid JSON object ({e}): {fix}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{storage.display(path)} is not a valid JSON object (it holds a {type(value).__name__}): {fix}")
    return value


def part_files(out_dir: str | Path) -> list[str]:
    """The part files of an output, sorted: paths, or URIs on a store (one listing)."""
    out = os.fspath(out_dir)
    if not storage.is_remote(out):
        return [str(p) for p in sorted(Path(out).glob("part-*.parquet"))]
    return [info.uri for info in storage.listing(out, recursive=False)
            if not info.is_dir and storage.match(["part-*.parquet"], [info.uri.rsplit("/", 1)[-1]])]


def packed_parts(out_dir: str | Path) -> tuple[dict[str, Any] | None, list]:
    """(``packed_dir_info`` of an output, its part files, sorted): on disk their paths, on a
    store their ``ObjectInfo`` (URI, size, mtime: what ``open_parquet``'s ``expect`` takes), one
    listing."""
    out = os.fspath(out_dir)
    info = packed_dir_info(out)
    if not storage.is_remote(out):
        return info, part_files(out)
    parts = [p for p in storage.listing(out.rstrip("/"), recursive=False)
             if not p.is_dir and storage.match(["part-*.parquet"], [p.uri.rsplit("/", 1)[-1]])]
    return info, sorted(parts, key=lambda p: p.uri)


def open_parquet(path: str, *, expect: storage.ObjectInfo | None = None, metadata: Any = None) -> pq.ParquetFile:
    """A part file for reading. On a store every read is a ranged GET, retried and counted
    (``storage.open_input``: one HEAD to open), the column chunks of a row group fetched in as
    few requests as their layout allows (``pre_buffer``); ``expect``: the version first seen,
    so a part replaced since is an error naming it; ``metadata``: its footer, read before (the
    open then reads no footer again)."""
    if not storage.is_remote(path):
        return pq.ParquetFile(path, metadata=metadata)
    return pq.ParquetFile(storage.open_input(path, expect=expect), metadata=metadata, pre_buffer=True)


def read_packed_dir(out_dir: str | Path) -> PackedRows:
    """Read a whole output directory back (for tests and small outputs; streams are in files)."""
    files = part_files(out_dir)
    if not files:
        return rows_from_arrow(ROW_SCHEMA.empty_table())
    tables = [pq.read_table(f if not storage.is_remote(f) else storage.open_input(f), schema=ROW_SCHEMA) for f in files]
    return rows_from_arrow(pa.concat_tables(tables))

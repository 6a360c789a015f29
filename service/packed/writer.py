"""Write packed rows as a Parquet dataset directory, streaming, with bounded memory.

Layout of DIR: ``part-00000.parquet``, ``part-00001.parquet``, ... (row columns of
``arrow_rows.ROW_SCHEMA``, rows in stream order; each file's schema metadata carries
``packfeed.seq_len`` and ``packfeed.config_hash``) and a hidden ``.packfeed/`` directory:
``files.json`` (every file this run wrote, listed before it is created), ``config.json`` (the
data config and its hash) and ``stats.json``, written last: ``"status": "complete"`` marks a
finished output. Readers that skip hidden entries (pyarrow datasets, Hugging Face ``datasets``)
see a plain Parquet dataset: ``pq.read_table(DIR)`` and ``load_dataset("parquet",
data_dir=DIR)`` work as they are.

Safety: the output may not be, contain or lie inside an input; a directory holding anything
packfeed did not write is refused; ``overwrite`` removes only the files a previous packfeed
run listed in its ``files.json``.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Sequence

import pyarrow.parquet as pq

from packfeed.client.rows import PackedRows
from packfeed.service.packed.arrow_rows import ROW_SCHEMA, rows_to_arrow

META_DIR = ".packfeed"
# ~32 MiB of token columns per row group at L=4096 (3 int32 columns * 4096 * 4 B * 682).
TARGET_ROW_GROUP_BYTES = 32 << 20
TARGET_FILE_BYTES = 512 << 20


class ParquetRowWriter:
    """``ParquetRowWriter(DIR, seq_len=..., config_hash=..., inputs=[...])``, then ``write``
    blocks of rows and ``close(config=..., stats=...)``. Checks DIR at construction."""

    def __init__(self, out_dir: str | Path, *, seq_len: int, config_hash: str, overwrite: bool = False,
                 inputs: Sequence[str] = ()) -> None:
        self.out_dir = Path(out_dir)
        prepare_output(self.out_dir, inputs=inputs, overwrite=overwrite)
        self.meta = self.out_dir / META_DIR
        self.meta.mkdir(parents=True, exist_ok=True)
        self._files: list[str] = []
        self._save_files()
        self._metadata = {b"packfeed.seq_len": str(seq_len).encode(), b"packfeed.config_hash": config_hash.encode()}
        row_bytes = 3 * 4 * seq_len
        self.rows_per_group = max(1, TARGET_ROW_GROUP_BYTES // row_bytes)
        self.rows_per_file = max(self.rows_per_group, TARGET_FILE_BYTES // row_bytes)
        self._writer: pq.ParquetWriter | None = None
        self._rows_in_file = 0
        self.num_files = 0

    def write(self, rows: PackedRows) -> None:
        table = rows_to_arrow(rows)
        start = 0
        while start < table.num_rows:
            if self._writer is None or self._rows_in_file >= self.rows_per_file:
                self._open_next()
            take = min(table.num_rows - start, self.rows_per_file - self._rows_in_file)
            self._writer.write_table(table.slice(start, take), row_group_size=self.rows_per_group)
            self._rows_in_file += take
            start += take

    def _open_next(self) -> None:
        if self._writer is not None:
            self._writer.close()
        name = f"part-{self.num_files:05d}.parquet"
        self._files.append(name)
        self._save_files()  # listed before it exists: an interrupted run's files can be removed
        # No dictionary pages: token ids over a 100k+ vocabulary overflow the dictionary anyway;
        # building it costs ~30% of the write's CPU (the driver's, on the critical path) for no
        # smaller file (bench/bench_tokenize.py measures the write).
        self._writer = pq.ParquetWriter(self.out_dir / name, ROW_SCHEMA.with_metadata(self._metadata),
                                        compression="zstd", use_dictionary=False)
        self.num_files += 1
        self._rows_in_file = 0

    def _save_files(self) -> None:
        _write_json(self.meta / "files.json", {"files": self._files})

    def close(self, *, config: dict[str, Any], stats: dict[str, Any], status: str = "complete") -> None:
        """Finish the last file, then write config.json and stats.json (with ``status``)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        _write_json(self.meta / "config.json", config)
        _write_json(self.meta / "stats.json", {"status": status, **stats})


def _write_json(path: Path, value: Any) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value, indent=2) + "\n")
    os.replace(tmp, path)


def prepare_output(out_dir: Path, *, inputs: Sequence[str], overwrite: bool, clear: bool = True) -> None:
    """Check ``out_dir`` (see the module docstring) and clear a previous packfeed output there
    when ``overwrite`` and ``clear``; ValueError naming the problem otherwise. ``clear=False``
    only checks (and creates the directory): a command checks first and clears once every
    other check has passed, so a mistake never costs the previous output."""
    out = Path(os.path.realpath(out_dir))
    for item in inputs:
        real = Path(os.path.realpath(item))
        if out == real or real in out.parents or out in real.parents:
            relation = "is" if out == real else ("lies inside" if real in out.parents else "contains")
            raise ValueError(f"--output {out_dir} {relation} the input {item}: write the rows somewhere else")
    if out.exists() and not out.is_dir():
        raise ValueError(f"--output {out_dir} is a file, not a directory")
    if out.exists():
        entries = sorted(p.name for p in out.iterdir())
        ours = written_files(out)
        if entries and ours is None:
            raise ValueError(
                f"--output {out_dir} holds files packfeed did not write ({', '.join(entries[:5])}"
                f"{', ...' if len(entries) > 5 else ''}): choose a new or empty directory"
            )
        if ours is not None:
            foreign = [e for e in entries if e != META_DIR and e not in ours]
            if foreign:
                raise ValueError(
                    f"--output {out_dir} holds files packfeed did not write ({', '.join(foreign[:5])}) next to a "
                    "previous output: move them away or choose another directory"
                )
            if not overwrite:
                raise ValueError(f"--output {out_dir} already holds packed output; pass --overwrite to replace it")
            if not clear:
                return _check_writable(out)
            for name in ours:
                (out / name).unlink(missing_ok=True)
            shutil.rmtree(out / META_DIR)
    out.mkdir(parents=True, exist_ok=True)
    _check_writable(out)


def _check_writable(out: Path) -> None:
    probe = out / f".packfeed-write-test-{os.getpid()}"
    probe.write_text("")  # a read-only location fails here, naming the path, before any work
    probe.unlink()


def written_files(out_dir: Path) -> list[str] | None:
    """The files a packfeed run listed as written in ``out_dir``, or None if it is not one."""
    path = Path(out_dir) / META_DIR / "files.json"
    if not path.exists():
        return None
    try:
        files = json.loads(path.read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return [f for f in files if isinstance(f, str) and "/" not in f and f.startswith("part-")]


def packed_dir_info(path: str | Path) -> dict[str, Any] | None:
    """{"config": ..., "stats": ...} of a finished ``packfeed pack`` output, None when ``path``
    is not one; ValueError for an unfinished (see ``incomplete_output``) or failed one."""
    meta = Path(path) / META_DIR
    if not (meta / "config.json").exists():
        if (meta / "files.json").exists():
            raise ValueError(incomplete_output(path))
        return None
    stats_path = meta / "stats.json"
    stats = read_json_object(stats_path, fix=_PACK_AGAIN) if stats_path.exists() else {}
    if stats.get("status") != "complete":
        raise ValueError(f"{path} is an unfinished or failed packfeed output (status {stats.get('status', 'running')!r}): "
                         "pack it again")
    return {"config": read_json_object(meta / "config.json", fix=_PACK_AGAIN), "stats": stats}


_PACK_AGAIN = "pack the directory again"


def incomplete_output(path: str | Path) -> str:
    """What an output a pack never finished (killed, crashed) holds and lacks: its part files
    are listed in files.json, config.json and stats.json are written only at the end. A part
    file the pack was writing when it stopped has no Parquet footer: it is named as cut off."""
    listed = written_files(Path(path)) or []
    present = [name for name in listed if (Path(path) / name).exists()]
    rows, cut = 0, []
    for name in present:
        try:
            rows += pq.ParquetFile(Path(path) / name).metadata.num_rows
        except (OSError, ValueError):  # pyarrow's ArrowInvalid is a ValueError
            cut.append(name)
    held = f"{len(present)} part file(s) with {rows:,} rows" if present else "no part file yet"
    if cut:
        held = f"{len(present)} part file(s) ({rows:,} rows readable; {', '.join(cut)} cut off while it was written)"
    return (f"{path} is incomplete: a packfeed pack started there and did not finish; it has {held} and lacks "
            f"{META_DIR}/config.json and {META_DIR}/stats.json (written when a pack ends): pack it again with --overwrite")


def read_json_object(path: str | Path, *, fix: str) -> dict:
    """The JSON object in ``path``; ValueError naming the file and ``fix`` when it is not one."""
    try:
        value = json.loads(Path(path).read_bytes())
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError is a ValueError
        raise ValueError(f"{path} is not a valid JSON object ({e}): {fix}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path} is not a valid JSON object (it holds a {type(value).__name__}): {fix}")
    return value


def part_files(out_dir: str | Path) -> list[Path]:
    return sorted(Path(out_dir).glob("part-*.parquet"))


def read_packed_dir(out_dir: str | Path) -> PackedRows:
    """Read a whole output directory back (for tests and small outputs; streams are in files)."""
    from packfeed.service.packed.arrow_rows import rows_from_arrow

    files = part_files(out_dir)
    if not files:
        return rows_from_arrow(ROW_SCHEMA.empty_table())
    import pyarrow as pa

    return rows_from_arrow(pa.concat_tables([pq.read_table(f, schema=ROW_SCHEMA) for f in files]))

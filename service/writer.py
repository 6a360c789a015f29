"""Write packed rows as Parquet files in a directory, streaming, with bounded memory.

Layout of DIR: ``part-00000.parquet``, ``part-00001.parquet``, ... (row columns of
``arrow_rows.ROW_SCHEMA``, rows in stream order), ``config.json`` (the data config and its
hash), and ``stats.json`` written last: its presence marks a complete output.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from packfeed.client.rows import PackedRows
from packfeed.service.arrow_rows import ROW_SCHEMA, rows_to_arrow

# ~32 MiB of token columns per row group at L=4096 (3 int32 columns * 4096 * 4 B * 682).
TARGET_ROW_GROUP_BYTES = 32 << 20
TARGET_FILE_BYTES = 512 << 20


class ParquetRowWriter:
    def __init__(self, out_dir: str | Path, *, seq_len: int, overwrite: bool = False) -> None:
        self.out_dir = Path(out_dir)
        existing = sorted(self.out_dir.glob("part-*.parquet")) + sorted(self.out_dir.glob("stats.json"))
        if existing and not overwrite:
            raise FileExistsError(f"{self.out_dir} already holds packed output; pass --overwrite to replace it")
        self.out_dir.mkdir(parents=True, exist_ok=True)
        for path in existing:
            path.unlink()
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
        path = self.out_dir / f"part-{self.num_files:05d}.parquet"
        self._writer = pq.ParquetWriter(path, ROW_SCHEMA, compression="zstd")
        self.num_files += 1
        self._rows_in_file = 0

    def close(self, *, config: dict[str, Any], stats: dict[str, Any]) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        (self.out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        (self.out_dir / "stats.json").write_text(json.dumps(stats, indent=2) + "\n")


def read_packed_dir(out_dir: str | Path) -> PackedRows:
    """Read a whole output directory back (for tests and small outputs; streams are in files)."""
    from packfeed.service.arrow_rows import rows_from_arrow

    files = sorted(Path(out_dir).glob("part-*.parquet"))
    if not files:
        return rows_from_arrow(ROW_SCHEMA.empty_table())
    import pyarrow as pa

    return rows_from_arrow(pa.concat_tables([pq.read_table(f, schema=ROW_SCHEMA) for f in files]))

"""packfeed rows for Hugging Face ``transformers.Trainer`` and TRL's ``SFTTrainer``.

Two adapters, no training logic:

* ``PackedCollator()``: the trainers' ``data_collator``. A list of packed rows (dicts with the
  row columns) -> exactly ``to_model_inputs``: block-causal on every attention back-end, no
  ``attention_mask``, ``use_cache=False``.
* ``packed_hf_dataset(source)``: packfeed output (a ``packfeed pack`` Parquet directory or a
  Ray dataset of rows) as a ``datasets.Dataset``, one example per packed row, columns unchanged.
  Nothing is re-tokenized or re-packed.

With TRL 1.16 (checked in its source) the trainer must be told to leave the rows alone::

    SFTConfig(
        dataset_kwargs={"skip_prepare_dataset": True},  # no tokenizing, truncating or packing
        remove_unused_columns=False,  # TRL keeps only input_ids/labels/seq_lengths otherwise
        packing=False, padding_free=False,   # padding_free refuses a custom collator
        bf16=False,                          # SFTConfig's default is bf16=True; CPU tests use fp32
    )
    SFTTrainer(model, args=config, train_dataset=packed_hf_dataset(out_dir),
               data_collator=PackedCollator(), processing_class=tokenizer)

Loss: both trainers divide the step's summed token losses by ``num_items_in_batch``, the count
of ``labels[:, 1:] != -100`` over every gradient-accumulation micro-batch (and over ranks with
``average_tokens_across_devices``, its default): the same token mean over the whole optimizer
step as ``packfeed.trainer.objective.step`` (tests/models/test_hf_trl.py checks the first step).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from packfeed.client.model_inputs import TOKEN_KEYS, to_model_inputs
from packfeed.service.face import ROW_SCHEMA, display, is_remote, open_parquet, packed_parts

__all__ = ["PackedCollator", "packed_hf_dataset"]


class PackedCollator:
    """``data_collator`` for ``transformers.Trainer`` / TRL ``SFTTrainer`` on packed rows.

    ``collator(examples)``: ``examples`` are B packed rows of one length L, each a mapping with
    ``input_ids``, ``labels``, ``position_ids`` (lists or arrays of L ints) and, when present,
    ``seq_lens``; other columns (``sample_ids``, ``row_index``, ``window``) are ignored. Returns
    ``to_model_inputs`` of those rows: int64 [B, L] ``input_ids``/``labels``/``position_ids``,
    int32 global ``cu_seq_lens_q``/``_k``, ``max_length_q``/``_k``, ``use_cache=False``, no
    ``attention_mask``. Tensors stay on the CPU: the trainer moves them.

    Raises ValueError for an empty batch, a missing column (usually ``remove_unused_columns``
    left at True, which drops ``position_ids`` and ``seq_lens``), rows of different lengths or
    rows that break the row convention.

    Cost: O(B*L) numpy per batch; Python lists (the ``datasets`` default format) are converted
    row by row, ``dataset.with_format("numpy")`` skips that.
    """

    def __call__(self, examples: Sequence[Mapping[str, Any]]) -> dict:
        if not examples:
            raise ValueError("PackedCollator got an empty batch")
        missing = [key for key in TOKEN_KEYS if key not in examples[0]]
        if missing:
            raise ValueError(
                f"packed rows lack the column(s) {missing}: pass remove_unused_columns=False to the "
                "TrainingArguments/SFTConfig so the trainer keeps position_ids and seq_lens"
            )
        batch = {key: [example[key] for example in examples] for key in TOKEN_KEYS}
        if all("seq_lens" in example for example in examples):
            batch["seq_lens"] = [example["seq_lens"] for example in examples]
        return to_model_inputs(batch)

    def __repr__(self) -> str:
        return "PackedCollator()"


def packed_hf_dataset(source: Any, *, cache_dir: str | Path | None = None) -> Any:
    """packfeed's packed rows as a ``datasets.Dataset``: one example per row, in stream order.

    ``source``:

    * a ``packfeed pack`` output directory (str or path), or its URI (``s3://bucket/packed``,
      any URI ``packfeed pack --output`` takes): its ``part-*.parquet`` files, in name order,
      through ``Dataset.from_parquet`` (a URI's through packfeed's storage layer: credentials
      in the URI or the environment, retries, as ``packfeed serve`` reads them). Columns and Arrow types stay those of
      ``ROW_SCHEMA`` (int32 token lists, int32 ``seq_lens``, int64 ``sample_ids`` and
      ``row_index``). Cost: one decode into ``datasets``' Arrow cache (``cache_dir``, else
      ``HF_DATASETS_CACHE``), then memory-mapped: RAM stays small whatever the output size.
      A URI's parts are read batch by batch straight into that cache, one Arrow file named by
      the output's URI (credentials left out), its stats.json and its parts' sizes and times:
      a second call reads none of them again (one LIST and the metadata's GETs), a repacked
      output is read anew. Raises FileNotFoundError without part files, ValueError for an
      unfinished or failed pack run (its rows are incomplete). (``load_dataset("parquet", data_dir=...)`` reads the
      directory too: its metadata sits in the hidden ``.packfeed/``.)
    * a ``ray.data.Dataset`` of rows (``PackingPipeline(config, plan).dataset``, or
      ``ray.data.read_parquet`` of an output directory): its blocks, in the dataset's order
      (keep ``DataContext.execution_options.preserve_order``, ``PackingPipeline`` sets it),
      with ``window`` kept, the pipeline's stats-only rows and ``stats`` column left out (its
      ``row_index`` counts within each window). Ray 2.60 has no ``Dataset.to_huggingface``; the blocks are
      pulled with ``iter_batches(batch_format="pyarrow")`` and held in memory (the whole
      dataset on the driver: for large streams write Parquet with ``packfeed pack`` first).
    """
    if isinstance(source, str) and is_remote(source):  # before Path(), which folds s3://b into s3:/b
        return _from_store(source, cache_dir=cache_dir)
    if isinstance(source, (str, Path)):
        return _from_parquet_dir(Path(source), cache_dir=cache_dir)
    if _is_ray_dataset(source):
        return _from_ray(source)
    raise TypeError(
        "packed_hf_dataset takes a packfeed output directory or URI, or a ray.data.Dataset, got "
        f"{type(source).__name__}"
    )


def _from_parquet_dir(path: Path, *, cache_dir: str | Path | None) -> Any:
    import datasets

    info, files = packed_parts(path)
    if not files or info is None:
        raise FileNotFoundError(f"{path} holds no packed rows: is it a `packfeed pack --output` directory?")
    return datasets.Dataset.from_parquet(
        [str(f) for f in files],
        features=datasets.Features.from_arrow_schema(ROW_SCHEMA),
        cache_dir=None if cache_dir is None else str(cache_dir),
        split="train",
    )


def _from_store(uri: str, *, cache_dir: str | Path | None) -> Any:
    """A packed output on a store (``packed_hf_dataset``'s docstring): its parts read through
    ``open_parquet`` (ranged GETs, retried) into one Arrow file in the cache, memory-mapped."""
    import datasets

    info, parts = packed_parts(uri)  # ValueError for an unfinished or failed pack
    if not parts or info is None:
        raise FileNotFoundError(f"{display(uri)} holds no packed rows: is it a `packfeed pack --output` "
                                "location?")
    key = json.dumps([display(uri), info["stats"], [(p.uri.rsplit("/", 1)[-1], p.size, p.mtime_ns)
                                                    for p in parts]], sort_keys=True, default=str)
    directory = Path(cache_dir if cache_dir is not None else datasets.config.HF_DATASETS_CACHE)
    cached = directory / f"packfeed-{hashlib.sha256(key.encode()).hexdigest()[:20]}.arrow"
    if not cached.exists():
        directory.mkdir(parents=True, exist_ok=True)
        schema = datasets.Features.from_arrow_schema(ROW_SCHEMA).arrow_schema
        partial = directory / f".{cached.name}.{os.getpid()}.tmp"
        try:
            with pa.OSFile(str(partial), "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
                for part in parts:  # a row group at a time: ~32 MiB of tokens whatever the row length (writer.py)
                    parquet = open_parquet(part.uri, expect=part)
                    for group in range(parquet.num_row_groups):
                        writer.write_table(_row_table(parquet.read_row_group(group)).cast(schema))
            os.replace(partial, cached)  # whole or absent: an interrupted read is never taken for the rows
        finally:
            partial.unlink(missing_ok=True)
    return datasets.Dataset.from_file(str(cached))


def _row_table(table: Any) -> Any:
    """A part's table with ``ROW_SCHEMA``'s columns, in order; a column its part predates
    (``pair_roles``) all null, as ``read_packed_dir`` reads it."""
    for field in ROW_SCHEMA:
        if field.name not in table.column_names:
            table = table.append_column(field.name, pa.nulls(table.num_rows, field.type))
    return table.select(ROW_SCHEMA.names)


def _is_ray_dataset(source: Any) -> bool:
    try:
        import ray.data
    except ImportError:
        return False
    return isinstance(source, ray.data.Dataset)


def _from_ray(dataset: Any) -> Any:
    import datasets
    import pyarrow.compute as pc  # +30-40 ms at `packfeed --help` (which imports the trainer) for Ray datasets only
    from datasets.table import InMemoryTable

    tables = []
    for t in dataset.iter_batches(batch_size=None, batch_format="pyarrow"):
        if "stats" in t.column_names:  # the pipeline's blocks: drop its accounting and stats-only rows
            t = t.drop_columns(["stats"]).filter(pc.not_equal(t.column("row_index"), -1))
        if t.num_rows:
            tables.append(t)
    table = pa.concat_tables(tables) if tables else ROW_SCHEMA.empty_table()
    missing = [name for name in ROW_SCHEMA.names if name not in table.column_names]
    if missing:
        raise ValueError(f"the Ray dataset lacks the row column(s) {missing}: is it packfeed's packed stream?")
    return datasets.Dataset(InMemoryTable(table.combine_chunks()))

"""One packing window, end to end: read -> tokenize -> pack -> rows.

The unit of work of the pipeline. A window is ``window_samples`` consecutive samples of the
inputs; it is packed on its own, so windows run in parallel on any number of workers and the
rows of a window depend only on (inputs, config, seed). No Ray here: the Ray actor in
``pipeline.py`` calls ``process_window``, and so do the unit tests.

Rows leave a window in a seeded random order: best-fit-decreasing places the longest samples
first, and a trainer should not see all long samples at once.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from packfeed.client.rows import IGNORE_INDEX, PackedRows
from packfeed.service.config import DataConfig
from packfeed.service.packing import assemble_rows, pack
from packfeed.service.sources import WindowSpec, read_window
from packfeed.service.stats import MAX_SKIP_EXAMPLES, WindowStats
from packfeed.service.tokenize import SampleTokenizer


def row_order(seed: int, window_index: int, num_rows: int) -> np.ndarray:
    """The seeded permutation rows of window ``window_index`` are emitted in."""
    return np.random.default_rng([seed, window_index]).permutation(num_rows)


def process_window(
    spec: WindowSpec, tokenizer: SampleTokenizer, config: DataConfig
) -> tuple[PackedRows, WindowStats]:
    """Pack one window. Returns its rows (``row_index`` local to the window) and its stats.

    Cost: dominated by tokenization; packing and assembling are vectorised numpy.
    """
    raw = read_window(spec, strict=config.strict)
    samples = tokenizer.tokenize(raw)
    lengths = np.diff(samples.offsets)
    packing = pack(lengths, config.seq_len, strategy=config.strategy, overlong=config.overlong)
    rows = assemble_rows(
        packing,
        samples.tokens,
        samples.labels,
        samples.offsets,
        samples.sample_ids,
        seq_len=config.seq_len,
        pad_id=tokenizer.pad_id,
        row_order=row_order(config.seed, spec.index, packing.num_rows),
    )

    skips = list(raw.skips) + list(samples.skips)
    stats = WindowStats(
        samples_read=spec.num_samples,
        samples_packed=len(lengths) - len(packing.dropped),
        truncated=len(packing.truncated),
        split=len(packing.split),
        dropped=len(packing.dropped),
        rows=rows.num_rows,
        tokens=rows.num_real_tokens,
        trained_tokens=int((rows.labels != IGNORE_INDEX).sum()),
        windows=1,
    )
    for skip in skips:
        stats.skipped[skip.reason] += 1
    stats.skip_examples = [dataclasses.asdict(s) for s in skips[:MAX_SKIP_EXAMPLES]]
    stats.check_accounting()
    return rows, stats

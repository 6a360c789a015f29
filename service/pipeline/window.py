"""One packing window: read, tokenize, pack, assemble, account. No Ray here.

A window holds samples of every source of the mixture (``plan.py`` says which); it is packed on
its own, so windows run in parallel on any number of workers and its rows depend only on
(config, seed). The Ray actor in ``pipeline.py`` calls ``process_window``, and so do the unit
tests.

Rows leave a window in a seeded random order: best-fit-decreasing places the longest samples
first, and a trainer should not see all long samples at once.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Any, Mapping, Sequence

import numpy as np

from packfeed.client.offsets import offsets_of, run_sums
from packfeed.client.rows import IGNORE_INDEX, PAD_SAMPLE_ID, PackedRows
from packfeed.service.data.config import DataConfig
from packfeed.service.packing import assemble_rows, pack
from packfeed.service.packing.truncate_pairs import fit_pairs
from packfeed.service.data.plan import StreamPlan
from packfeed.service.inputs.records import record_format
from packfeed.service.inputs.read import RawWindow, WindowSpec, read_window
from packfeed.service.pipeline.stats import MAX_SKIP_EXAMPLES, WindowStats
from packfeed.service import storage
from packfeed.service.tokenize.samples import SampleTokenizer, TokenizedSamples


def window_tokenizers(config: DataConfig, plan: StreamPlan, tokenizer: Any, threads: int) -> dict[str, SampleTokenizer]:
    """One SampleTokenizer per loss mode of the plan's sources (what ``process_window`` takes),
    from ``tokenizer``: a name, a loaded tokenizer or the driver's ``ShippedTokenizer``;
    ``threads``: the encoder's threads."""
    common = dict(add_eos=config.add_eos, strict=config.strict, backend=config.tokenizer_backend, num_threads=threads)
    first = SampleTokenizer(tokenizer, loss=plan.sources[0].loss, **common)
    tokenizers = {plan.sources[0].loss: first}
    for loss in {s.loss for s in plan.sources} - {plan.sources[0].loss}:
        tokenizers[loss] = SampleTokenizer(first.tokenizer, loss=loss, **common)
    return tokenizers


def row_order(seed: int, window_index: int, num_rows: int) -> np.ndarray:
    """The seeded permutation rows of window ``window_index`` are emitted in."""
    return np.random.default_rng([seed, window_index]).permutation(num_rows)


def process_window(
    spec: WindowSpec, tokenizers: Mapping[str, SampleTokenizer], config: DataConfig, plan: StreamPlan
) -> tuple[PackedRows, WindowStats]:
    """Pack one window. Returns its rows (``row_index`` local to the window) and its stats.

    ``tokenizers``: one per loss mode the sources use (``plan.sources[i].loss``).
    Cost: dominated by tokenization; packing and assembling are vectorised numpy.
    """
    with storage.COUNTERS.tally() as io:  # this window's requests to a store (none for local files)
        raw = read_window(spec, strict=config.strict)
    modes = _loss_modes(raw, plan)
    samples = _tokenize(raw, [(mode, tokenizers[mode]) for mode in modes], plan)
    samples, pairs_truncated = _fit_pairs(samples, config)
    lengths = np.diff(samples.offsets)
    packing = pack(lengths, config.seq_len, strategy=config.strategy, overlong=config.overlong, pairs=samples.pairs)
    pad_id = next(iter(tokenizers.values())).pad_id
    rows = assemble_rows(
        packing,
        samples.tokens,
        samples.labels,
        samples.offsets,
        samples.sample_ids,
        seq_len=config.seq_len,
        pad_id=pad_id,
        row_order=row_order(config.seed, spec.index, packing.num_rows),
        pair_chosen_lens=samples.pair_chosen_lens,
    )
    stats = window_stats(spec, raw, samples, packing, rows, plan, pairs_truncated)
    stats.storage = io.counts
    for mode in modes if len(raw) else []:  # the back-ends that tokenized this window's samples
        stats.note_tokenizer(tokenizers[mode])
    return rows, stats


def _fit_pairs(samples: TokenizedSamples, config: DataConfig) -> tuple[TokenizedSamples, np.ndarray]:
    """Under overlong="truncate", overlong preference pairs cut to fit (packing/truncate_pairs.py); the
    samples and the positions of the pairs that were cut. Other policies leave them to ``pack``,
    which drops them (a pair is never split)."""
    pairs = samples.pairs
    if pairs is None or config.overlong != "truncate" or not pairs.any():
        return samples, np.zeros(0, np.int64)
    fitted = fit_pairs(samples.tokens, samples.labels, samples.offsets, samples.pair_chosen_lens,
                       samples.pair_prompt_lens, seq_len=config.seq_len, max_prompt_tokens=config.prompt_budget)
    return replace(samples, tokens=fitted.tokens, labels=fitted.labels, offsets=fitted.offsets,
                   pair_chosen_lens=fitted.chosen_lens, pair_prompt_lens=fitted.prompt_lens), fitted.truncated


def _loss_modes(raw: RawWindow, plan: StreamPlan) -> list[str]:
    """The loss modes of the window's sources, in a fixed order (the rows stay deterministic)."""
    return sorted({plan.sources[i].loss for i in raw.sources.tolist()}) or [plan.sources[0].loss]


def _tokenize(
    raw: RawWindow, tokenizers: Sequence[tuple[str, SampleTokenizer]], plan: StreamPlan
) -> TokenizedSamples:
    """Tokenize the window's records, each with the tokenizer of its source's loss mode
    (``tokenizers``: (mode, tokenizer) in ``_loss_modes`` order)."""
    if len(tokenizers) == 1:
        return tokenizers[0][1].tokenize(raw)
    losses = [s.loss for s in plan.sources]
    parts = []
    for mode, tokenizer in tokenizers:
        positions = [p for p, s in enumerate(raw.sources.tolist()) if losses[s] == mode]
        parts.append(tokenizer.tokenize(raw.select(positions)))
    offsets, base = [np.zeros(1, np.int64)], 0
    for part in parts:  # a part whose samples were all skipped adds no offset, only its skips
        offsets.append(part.offsets[1:] + base)
        base += int(part.offsets[-1])
    paired = any(p.pairs is not None for p in parts)
    return TokenizedSamples(
        tokens=np.concatenate([p.tokens for p in parts]),
        labels=np.concatenate([p.labels for p in parts]),
        offsets=np.concatenate(offsets),
        sample_ids=np.concatenate([p.sample_ids for p in parts]),
        skips=[s for p in parts for s in p.skips],
        pair_chosen_lens=_pair_column(parts, "pair_chosen_lens") if paired else None,
        pair_prompt_lens=_pair_column(parts, "pair_prompt_lens") if paired else None,
    )


def _pair_column(parts: Sequence[TokenizedSamples], name: str) -> np.ndarray:
    """A pair column of the parts one after the other, 0 for the parts without pairs."""
    return np.concatenate([np.zeros(len(p), np.int64) if getattr(p, name) is None else getattr(p, name)
                           for p in parts])


def window_stats(spec: WindowSpec, raw: RawWindow, samples: TokenizedSamples, packing, rows: PackedRows,
                 plan: StreamPlan, pairs_truncated: np.ndarray | None = None) -> WindowStats:
    """Per-source accounting of one window (see stats.py). ``pairs_truncated``: preference
    pairs cut to fit before packing (counted as truncated, like the samples the packer cut)."""
    stats = WindowStats(window=spec.index, epoch=spec.epoch, rows=rows.num_rows)
    num_sources = len(plan.sources)
    read = np.zeros(num_sources, np.int64)
    for piece in spec.pieces:
        read[piece.source] += piece.num_rows
    skips = list(raw.skips) + list(samples.skips)
    skip_sources = plan.source_of([s.sample_id for s in skips]) if skips else np.zeros(0, np.int64)
    kept_sources = plan.source_of(samples.sample_ids)
    dropped = np.bincount(kept_sources[packing.dropped], minlength=num_sources)
    cut = packing.truncated if pairs_truncated is None else np.union1d(packing.truncated, pairs_truncated)
    truncated = np.bincount(kept_sources[cut], minlength=num_sources)
    split = np.bincount(kept_sources[packing.split], minlength=num_sources)
    kept = np.bincount(kept_sources, minlength=num_sources)
    pair_counts = _pair_counts(samples, packing, cut, kept_sources, num_sources)
    tokens, trained = _segment_tokens(rows, plan, num_sources)
    record_sources = raw.sources.tolist()
    for s in range(num_sources):
        if not read[s]:
            continue
        c = stats.source(s)
        c.samples_read = int(read[s])
        c.samples_packed = int(kept[s] - dropped[s])
        c.truncated, c.split, c.dropped = int(truncated[s]), int(split[s]), int(dropped[s])
        c.tokens, c.trained_tokens = int(tokens[s]), int(trained[s])
    for skip, s in zip(skips, skip_sources.tolist()):
        stats.source(s).skipped[skip.reason] += 1
    for (s, fmt), n in Counter(zip(record_sources, map(record_format, raw.records))).items():
        stats.source(s).formats[fmt] += n
    for s, c in stats.sources.items() if pair_counts is not None else ():
        if c.formats["preference"]:  # the sources that read pairs (the others keep no pair counts)
            c.pairs.update({"read": c.formats["preference"], **{k: int(v[s]) for k, v in pair_counts.items()}})
    stats.skip_examples = sorted(skips, key=lambda x: (x.sample_id, x.row))[:MAX_SKIP_EXAMPLES]
    stats.check_accounting()
    return stats


def _pair_counts(samples: TokenizedSamples, packing, cut: np.ndarray, kept_sources: np.ndarray,
                 num_sources: int) -> dict[str, np.ndarray] | None:
    """Per source: preference pairs packed, truncated and dropped (None: the window has none)."""
    pairs = samples.pairs
    if pairs is None:
        return None
    per_source = {name: np.bincount(kept_sources[idx[pairs[idx]]], minlength=num_sources)
                  for name, idx in (("truncated", cut), ("dropped", packing.dropped))}
    per_source["packed"] = np.bincount(kept_sources[pairs], minlength=num_sources) - per_source["dropped"]
    return per_source


def _segment_tokens(rows: PackedRows, plan: StreamPlan, num_sources: int) -> tuple[np.ndarray, np.ndarray]:
    """Real and trained tokens per source, from the rows' segments."""
    real = rows.sample_ids != PAD_SAMPLE_ID
    if not real.any():
        zeros = np.zeros(num_sources, np.int64)
        return zeros, zeros
    sources = plan.source_of(rows.sample_ids[real])
    tokens = np.bincount(sources, weights=rows.seq_lens[real], minlength=num_sources)
    # the segments tile the rows in order
    trained_per_segment = run_sums(rows.labels.reshape(-1) != IGNORE_INDEX, offsets_of(rows.seq_lens))
    trained = np.bincount(sources, weights=trained_per_segment[real], minlength=num_sources)
    return tokens.astype(np.int64), trained.astype(np.int64)

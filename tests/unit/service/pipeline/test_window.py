"""A window whose sources use different loss modes is tokenized one mode at a time and the
parts joined: the join must hold when every sample of a mode was skipped by its tokenizer.
A window's tokens and trained tokens per source count every segment of its rows."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from packfeed.client.rows import IGNORE_INDEX, PAD_SAMPLE_ID, PackedRows
from packfeed.service.inputs.records import Skip
from packfeed.service.inputs.read import RawWindow
from packfeed.service.tokenize.samples import TokenizedSamples
from packfeed.service.pipeline.window import _segment_tokens, _tokenize


class Tokenizes:
    """A tokenizer of one loss mode: sample id i becomes i + 1 tokens of value i, or a skip."""

    def __init__(self, skip: bool) -> None:
        self.skip = skip

    def tokenize(self, raw: RawWindow) -> TokenizedSamples:
        ids = [int(i) for i in raw.sample_ids]
        if self.skip:
            return TokenizedSamples(np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros(1, np.int64),
                                    np.zeros(0, np.int64), [Skip(i, "s", i, "no_trained_tokens", "") for i in ids])
        tokens = np.concatenate([np.full(i + 1, i, np.int32) for i in ids]) if ids else np.zeros(0, np.int32)
        offsets = np.concatenate([[0], np.cumsum([i + 1 for i in ids])]).astype(np.int64)
        return TokenizedSamples(tokens, tokens.copy(), offsets, np.asarray(ids, np.int64))


def test_a_loss_mode_whose_samples_were_all_skipped_joins_with_the_others():
    plan = SimpleNamespace(sources=[SimpleNamespace(loss="all"), SimpleNamespace(loss="completion")])
    sources = np.array([0, 1, 0, 1, 1])
    raw = RawWindow(spec=None, sample_ids=np.arange(5, dtype=np.int64), records=list("abcde"), sources=sources)
    for skipped in ("all", "completion", None):
        tokenizers = [(mode, Tokenizes(skip=mode == skipped)) for mode in ("all", "completion")]
        out = _tokenize(raw, tokenizers, plan)
        kept = [i for i in range(5) if ["all", "completion"][sources[i]] != skipped]
        kept = [i for i in kept if sources[i] == 0] + [i for i in kept if sources[i] == 1]  # one mode after another
        assert out.sample_ids.tolist() == kept
        assert np.diff(out.offsets).tolist() == [i + 1 for i in kept]
        for n, i in enumerate(kept):
            assert (out.tokens[out.offsets[n]:out.offsets[n + 1]] == i).all()
        assert sorted(s.sample_id for s in out.skips) == sorted(set(range(5)) - set(kept))


@pytest.mark.parametrize("seed", range(20))
def test_tokens_and_trained_tokens_per_source_count_every_segment(seed):
    """``_segment_tokens`` against a segment-by-segment count: random rows of random segments
    (padding included, trained tokens anywhere) from 3 sources."""
    rng = np.random.default_rng(seed)
    num_rows, seq_len, num_sources = int(rng.integers(1, 6)), int(rng.integers(1, 40)), 3
    plan = SimpleNamespace(source_of=lambda ids: np.asarray(ids) % num_sources)
    seq_lens, sample_ids, splits = [], [], [0]
    for _ in range(num_rows):
        left = seq_len
        while left:
            n = int(rng.integers(1, left + 1))
            seq_lens.append(n)
            sample_ids.append(PAD_SAMPLE_ID if rng.random() < 0.2 else int(rng.integers(0, 100)))
            left -= n
        splits.append(len(seq_lens))
    tokens = rng.integers(0, 50, (num_rows, seq_len)).astype(np.int32)
    labels = np.where(rng.random((num_rows, seq_len)) < 0.5, tokens, IGNORE_INDEX).astype(np.int32)
    rows = PackedRows(tokens, labels, np.zeros_like(tokens), np.asarray(seq_lens, np.int32),
                      np.asarray(sample_ids, np.int64), np.asarray(splits, np.int64), np.arange(num_rows))
    expected_tokens, expected_trained = np.zeros(num_sources, np.int64), np.zeros(num_sources, np.int64)
    flat, at = labels.reshape(-1), 0
    for n, sample in zip(seq_lens, sample_ids):
        if sample != PAD_SAMPLE_ID:
            expected_tokens[sample % num_sources] += n
            expected_trained[sample % num_sources] += int((flat[at:at + n] != IGNORE_INDEX).sum())
        at += n
    got_tokens, got_trained = _segment_tokens(rows, plan, num_sources)
    assert got_tokens.tolist() == expected_tokens.tolist() and got_trained.tolist() == expected_trained.tolist()

"""A window whose sources use different loss modes is tokenized one mode at a time and the
parts joined: the join must hold when every sample of a mode was skipped by its tokenizer."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from packfeed.service.inputs.records import Skip
from packfeed.service.inputs.read import RawWindow
from packfeed.service.tokenize.samples import TokenizedSamples
from packfeed.service.pipeline.window import _tokenize


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

"""The fast encoder splits out added tokens only in texts that hold an added token's first
character (fast/encoder.py ``_ids``); the ids are HF's either way."""

from __future__ import annotations

import numpy as np

from packfeed.service.tokenize.fast.backend import load_fast

TEXTS = ["plain text, no marker", "", "a < b and c > d", "<|im_start|>user\nhi<|im_end|>\n", "x<|im_", "<",
         "def f(x):\n    return x  # <tag>", "日本語 🦩", "<|endoftext|><|endoftext|>", "end<|im_end|>"]


def test_only_texts_holding_a_first_character_are_split_and_the_ids_are_hfs(toks):
    tok = toks["qwen2.5"]
    fast, _, _ = load_fast(tok.backend_tokenizer, threads=1)
    split_texts = []
    real_split = fast._split
    fast._split = lambda text: split_texts.append(text) or real_split(text)
    lengths, ids = fast._ids(list(TEXTS))
    firsts = {t[0] for t in fast.added}
    assert firsts == {"<"}  # Qwen2.5's added tokens all open with "<"
    assert split_texts == [t for t in TEXTS if "<" in t] and len(split_texts) < len(TEXTS)  # not vacuous
    expected = [tok.backend_tokenizer.encode(t, add_special_tokens=False).ids for t in TEXTS]
    assert lengths.tolist() == list(map(len, expected))
    assert np.array_equal(ids, np.asarray([i for e in expected for i in e], np.int32))

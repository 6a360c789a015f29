"""Edges in text an NFC normalizer changes (fast/nfc_edges.py): the fast encoder answers them from
bytes where NFC keeps the character alone, HF's answer everywhere, with the real Qwen2.5
tokenizer (an NFC normalizer), on texts built from what NFC composes, reorders, expands and
splits: combining marks of several classes, Hangul jamo, singletons, composition exclusions,
backward-composing vowel signs, and characters it leaves alone."""

from __future__ import annotations

import random
import unicodedata

import numpy as np
import pytest
from support.tokenizers import qwen_tokenizer_dir
from test_tokenize import window
from test_tokenize_backend import assert_identical

from packfeed.service.inputs.records import Conversation, PromptCompletion
from packfeed.service.tokenize.encoders import HFEncoder
from packfeed.service.tokenize.fast.backend import load_fast
from packfeed.service.tokenize.fast.nfc_edges import nfc, normalized_byte_at
from packfeed.service.tokenize.samples import SampleTokenizer

HAZARDS = [
    "e", "a", "o", "A", "x", " ", "  ", "\n", ".", "é", "ñ", "日", "🦩", "👩\u200d💻", "<|im_end|>",
    "\u0301", "\u0300", "\u0308", "\u0323", "\u031b", "\u0345", "\u03b1", "\u0399",  # marks of classes 230, 220, 216, 240
    "\u1100", "\u1161", "\u11a8", "가", "각",  # Hangul L, V, T jamo and syllables
    "\u212b", "\u2126", "\u0344", "\u0958", "\u0f73", "\u2329",  # singletons, an expansion, exclusions
    "\u0b47", "\u0b3e", "\u0b57", "\u0cc6", "\u0cc2", "\u0cd5", "\u0dd9", "\u0dcf", "\u0dca",  # vowel signs
    "<", ">", "=", "\u0338",  # ">" + U+0338 is one character, except after an added token
    "\u0627", "\u0653", "\u064e", "\u0651", "\u05d9", "\u05b4", "\u1b05", "\u1b35", "\u0915", "\u093c",
]  # fmt: skip


def hazard_texts(seed: int, n: int, max_pieces: int = 10) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(HAZARDS) for _ in range(rng.randint(1, max_pieces))) for _ in range(n)]


@pytest.fixture(scope="module")
def qwen_tok(tmp_path_factory):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(qwen_tokenizer_dir(str(tmp_path_factory.mktemp("qwen"))))


@pytest.mark.parametrize("text, char, expected", [
    pytest.param("cafe\u0301 au", 5, 5, id="after-a-composed-pair"),
    pytest.param("cafe\u0301 au", 3, None, id="composed-base"),
    pytest.param("cafe\u0301 au", 4, None, id="composed-mark"),
    pytest.param("cafe\u0301 au", 8, 8, id="end"),
    pytest.param("\u212b x", 2, 3, id="after-a-singleton"),
    pytest.param("가\u11a8", 0, None, id="hangul-syllable-takes-a-final"),
    pytest.param("o\u0323\u0301 z", 3, 5, id="after-marks-composed-and-kept"),
])  # fmt: skip
def test_normalized_byte_at(text, char, expected):
    assert normalized_byte_at(text, char) == expected


def test_characters_below_u0300_compose_with_nothing_before_them():
    """The second character of every canonical composition is U+0300 or above (nfc_edges' ASCII
    and Latin-1 text never depends on the character before it)."""
    seconds = set()
    for cp in range(0x110000):
        d = unicodedata.decomposition(chr(cp))
        if d and not d.startswith("<") and len(d.split()) == 2:
            seconds.add(int(d.split()[1], 16))
    assert seconds and min(seconds) >= 0x300


@pytest.mark.parametrize("seed", range(3))
def test_every_edge_of_hazard_texts_equals_hf(qwen_tok, seed):
    """Every character and every span, both edge rules, with and without the post-processor's
    tokens; and not vacuously: most changed texts are answered without HF."""
    backend = qwen_tok.backend_tokenizer
    fast, _, _ = load_fast(backend, threads=1)
    reference = HFEncoder(backend)
    texts = hazard_texts(seed, 60) + ["x<|im_end|>\u0338\u0301 e\u0301 <\u0338 =\u0338", "<|im_end|>\u0338 a"]
    changed = [t for t in texts if not unicodedata.is_normalized("NFC", t)]
    assert len(changed) > 20
    longest = max(map(len, texts))
    for special in (False, True):
        ref, got = (e.encode(texts, special=special, edges=True) for e in (reference, fast))
        assert np.array_equal(ref.ids, got.ids) and ref.lengths.tolist() == got.lengths.tolist()
        for c in range(longest + 1):
            chars = [min(c, len(t)) for t in texts]
            assert got.first_tokens(chars).tolist() == ref.first_tokens(chars).tolist(), c
    ref, got = (e.encode(texts, special=False, edges=True) for e in (reference, fast))
    for lo in range(longest):
        for hi in range(lo, longest + 1):
            spans = [[(min(lo, len(t)), min(hi, len(t)))] for t in texts]
            assert got.span_tokens(spans) == ref.span_tokens(spans), (lo, hi)
    fast.texts_by_reference = 0
    got = fast.encode(changed, special=False, edges=True)
    got.span_tokens([[(0, 1)] for _ in changed])  # the first character: stable in many
    assert fast.texts_by_reference < len(changed)


@pytest.mark.parametrize("seed", range(2))
def test_samples_of_hazard_texts_are_identical(qwen_tok, seed):
    """Conversations (turns and rendered text) and prompt/completion, through both back-ends."""
    rng = random.Random(seed)
    words = hazard_texts(seed, 400, 6)
    records = []
    for k in range(120):
        content = [" ".join(rng.sample(words, rng.randint(1, 4))) for _ in range(4)]
        if k % 3 == 0:
            records.append(PromptCompletion(content[0], content[1]))
        else:
            messages = [{"role": "system", "content": content[0]}] if k % 3 == 1 else []
            messages += [{"role": "user", "content": content[1]}, {"role": "assistant", "content": content[2]}]
            records.append(Conversation(messages))
    for loss in ("auto", "all"):
        hf = SampleTokenizer(qwen_tok, backend="hf", loss=loss)
        fast = SampleTokenizer(qwen_tok, backend="fast", num_threads=1, loss=loss)
        raw = window(records)
        assert_identical(hf.tokenize(raw), fast.tokenize(raw))


def test_a_text_whose_nfc_is_not_what_quicktok_encoded_is_answered_by_hf(qwen_tok, monkeypatch):
    """Python's NFC of another Unicode version than the tokenizer's (its UTF-8 length differs
    from the tokens'): HF answers that text's edges."""
    backend = qwen_tok.backend_tokenizer
    fast, _, _ = load_fast(backend, threads=1)
    texts = ["cafe\u0301 au lait", "naïve e\u0301 x"]
    ref = HFEncoder(backend).encode(texts, special=False, edges=True)
    monkeypatch.setattr(fast, "normalized", lambda text: nfc(text) + "?" if text == texts[0] else nfc(text))
    fast.texts_by_reference = 0
    got = fast.encode(texts, special=False, edges=True)
    assert got.first_tokens([6, 2]).tolist() == ref.first_tokens([6, 2]).tolist()
    assert fast.texts_by_reference == 1

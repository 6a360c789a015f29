"""Steps 1 and 3 of the fast back-end's proof (backend.py): whether a tokenizer's shape is one
the fast path mirrors, and the stress texts both encoders must agree on, ids and the token
under every character edge. Pure functions of a ``tokenizers.Tokenizer`` and the encoders."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from packfeed.client.offsets import starts_of
from packfeed.service.tokenize.encoders import HFEncoder
from packfeed.service.tokenize.fast.encoder import FastEncoder

class FastPathRefused(ValueError):
    """The fast back-end cannot reproduce this tokenizer; the message says why."""


# Texts that probe what a byte-level BPE can get wrong: pre-tokenizer classes (contractions,
# digits, punctuation runs, whitespace before newlines), scripts and combining marks, text
# that NFC changes, emoji sequences split over several byte tokens, controls.
STRESS = [
    "Plain words, commas; and a full stop.",
    "She said: \"it's fine\" -- they'd've LEFT. I'M SURE YOU'LL see; 'quoted' words.",
    "def pack(xs: list[int]) -> int:\n\treturn sum(x ** 2 for x in xs)  # squares\r\n",
    "    indented\n        deeper\n\n\n   \n\t\ttabs\t \n  trailing   ",
    "numbers 0 7 42 2024 3.14159 1,000,000 0x1F 1e-9 -12 +7 100%",
    "résumé naïve façade Zürich São Paulo Ærøskøbing İstanbul",
    "e\u0301 A\u030a \u212b \u1e9b\u0323 n\u0303o",  # not NFC: combining marks, angstrom sign
    "Приветствую, мир! Γειά σου Κόσμε.",
    "שלום עולם. مرحبا بالعالم. नमस्ते दुनिया",
    "漢字かな交じり文。中文标点，全角ＡＢＣ１２３。한국어 문장입니다.",
    "emoji 🚀🔥 family 👨\u200d👩\u200d👧 flag 🇫🇷 skin 👍🏽 keycap 1\ufe0f\u20e3",
    "spaces\u00a0no-break\u2009thin\u3000ideographic\u200bzero-width",
    "control\x00null\x1bescape\x7fdel\u0085nel\u2028line",
    "http://example.org/a/b?c=1&d=%20#x <div class=\"k\">&amp;</div> {\"key\": [1, 2]}",
    "!!!???... ---=== ***/// ((([[[{{{}}}]]]))) <<<>>> ~~~ ``` @@@ ###",
    "x" * 120 + " " + "ab" * 60,
    "\n",
    " ",
    "a",
    "",
]


def backend_spec(backend: Any) -> dict[str, Any]:
    """The parts of a ``tokenizers.Tokenizer``'s JSON that ``shape_refusal`` reads, without
    serializing its vocabulary."""

    def part(component: Any) -> dict | None:
        return None if component is None else json.loads(component.__getstate__())

    model = backend.model
    return {
        "model": {"type": type(model).__name__, **{k: getattr(model, k, None) for k in (
            "dropout", "continuing_subword_prefix", "end_of_word_suffix", "byte_fallback")}},
        "normalizer": part(backend.normalizer),
        "post_processor": part(backend.post_processor),
        "truncation": backend.truncation,
        "padding": backend.padding,
        "added_tokens": [
            {"id": i, "content": t.content, "lstrip": t.lstrip, "rstrip": t.rstrip, "single_word": t.single_word,
             "normalized": t.normalized}
            for i, t in sorted(backend.get_added_tokens_decoder().items())
        ],
    }  # fmt: skip


def shape_refusal(spec: dict[str, Any]) -> str | None:
    """Why the tokenizer JSON ``spec`` (``backend.to_str()``) is outside what the fast path
    mirrors, or None. Normalizer and pre-tokenizer are quicktok's import's to judge."""
    model = spec.get("model") or {}
    if model.get("type") != "BPE":
        return f"model type {model.get('type')!r} is not byte-level BPE (SentencePiece/WordPiece/Unigram use HF)"
    for key in ("dropout", "continuing_subword_prefix", "end_of_word_suffix"):
        if model.get(key):
            return f"BPE model sets {key}={model[key]!r}"
    if model.get("byte_fallback"):
        return "BPE model uses byte_fallback (a SentencePiece-style BPE, not byte-level)"
    for key in ("truncation", "padding"):
        if spec.get(key):
            return f"the tokenizer has {key} enabled"
    normalized = spec.get("normalizer") is not None
    for t in spec.get("added_tokens", []):
        flags = [f for f in ("lstrip", "rstrip", "single_word") if t.get(f)]
        if flags:
            return f"added token {t['content']!r} sets {'/'.join(flags)} (matched with its surroundings)"
        if t.get("normalized") and normalized:
            return f"added token {t['content']!r} is matched after normalization"
    return _post_processor_refusal(spec.get("post_processor"))


def _post_processor_refusal(node: dict | None) -> str | None:
    if node is None:
        return None
    kind = node.get("type")
    if kind == "Sequence":
        for child in node.get("processors", []):
            reason = _post_processor_refusal(child)
            if reason:
                return reason
        return None
    if kind == "ByteLevel":
        return "post-processor ByteLevel trims offsets" if node.get("trim_offsets") else None
    if kind == "TemplateProcessing":
        return None
    return f"post-processor {kind!r} is not supported (only ByteLevel and TemplateProcessing)"

def stress_texts(spec: dict[str, Any], extra: list[str] = ()) -> list[str]:
    """STRESS, and each added token alone, doubled, glued to text and cut in half, and ``extra``."""
    added = [t["content"] for t in spec.get("added_tokens", [])]
    cut = [f"{tok[: len(tok) // 2]} {tok[len(tok) // 2:]}" for tok in added]
    glued = [f"x{tok}{tok}\n{tok[: len(tok) // 2]}y {tok}." for tok in added]
    return [*STRESS, *added, *cut, *glued, *extra]


def compare_encoders(reference: HFEncoder, fast: FastEncoder, texts: list[str]) -> dict[str, int]:
    """Ids (with and without post-processor tokens) and the token under every character edge,
    for both edge rules, must agree. Returns counts of what was compared."""
    tokens = edges = 0
    # text k once per character c of it (and c = len): each copy asks for one completion start
    copies = [(t, c) for t in texts for c in range(len(t) + 1)]
    spans = [[(c, min(c + w, len(t))) for c in range(len(t)) for w in (1, 2, 3, 5, 9)] for t in texts]
    # one empty span per text sends HF to its offsets rule for every span of that text
    offset_spans = [[(c, min(c + w, len(t))) for c in range(0, len(t), 2) for w in (1, 4)] + [(0, 0)] for t in texts]
    for special in (False, True):
        ref = reference.encode(texts, special=special, edges=True)
        got = fast.encode(texts, special=special, edges=True)
        if ref.failed or got.failed:
            raise FastPathRefused(f"a stress text failed to encode: {(ref.failed or got.failed)[0][1]}")
        _same_ids(ref, got, texts, f"add_special_tokens={special}")
        tokens += len(ref.ids)
        ref_c = reference.encode([t for t, _ in copies], special=special, edges=True)
        got_c = fast.encode([t for t, _ in copies], special=special, edges=True)
        chars = [c for _, c in copies]
        _same(ref_c.first_tokens(chars).tolist(), got_c.first_tokens(chars).tolist(), [t for t, _ in copies],
              "the first token at a character", chars)  # fmt: skip
        edges += len(chars)
    for sp in (spans, offset_spans):  # spans only mask chat text, encoded without post-processor tokens
        ref = reference.encode(texts, special=False, edges=True)
        got = fast.encode(texts, special=False, edges=True)
        _same(ref.span_tokens(sp), got.span_tokens(sp), texts, "span tokens", sp)
        edges += 2 * sum(map(len, sp))
    return {"stress_tokens": tokens, "stress_edges": edges}


def _same_ids(ref, got, texts: list[str], what: str) -> None:
    if np.array_equal(ref.lengths, got.lengths) and np.array_equal(ref.ids, got.ids):
        return
    starts, got_starts = starts_of(ref.lengths), starts_of(got.lengths)
    for k, text in enumerate(texts):
        a = ref.ids[starts[k] : starts[k] + ref.lengths[k]].tolist()
        b = got.ids[got_starts[k] : got_starts[k] + got.lengths[k]].tolist()
        if a != b:
            at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            raise FastPathRefused(
                f"ids differ from HF ({what}) on {text[:60]!r} at token {at}: HF {a[at:at + 4]}, fast {b[at:at + 4]}"
            )


def _same(ref: list, got: list, texts: list[str], what: str, asked: list) -> None:
    if ref == got:
        return
    k = next(i for i, (x, y) in enumerate(zip(ref, got)) if x != y)
    raise FastPathRefused(f"{what} differ from HF on {texts[k][:60]!r} (asked {asked[k]}): HF {ref[k]}, fast {got[k]}")

"""Encoder back-ends: a batch of texts -> flat token ids, and the token under a character.

``SampleTokenizer`` (samples.py) asks an encoder two things per format group: the ids of a
batch of texts, and, where a loss mask starts or ends inside a text, which token holds a
given character. Both back-ends give the same answers (proven per tokenizer at load time by
``fast/backend.py``, and by tests):

``HFEncoder``    the tokenizer's own Rust ``tokenizers`` backend. The reference. Character
                 offsets are computed only for the groups whose masks need them.
``FastEncoder``  (fast/encoder.py) quicktok's exact byte-level BPE (PyPI ``quicktok-v1``), an order of magnitude
                 faster per core, with no offsets. In a byte-level BPE every token is a run of
                 the text's UTF-8 bytes, so cumulative token byte lengths say which token
                 holds a byte; the character ``c`` starts at byte ``len(text[:c].encode())``.
                 For "héllo" encoded as ["h", "é", "llo"] (bytes 1, 2, 3), character 2 ("l")
                 is byte 3, held by token 2.

What "holds" means is the HF path's own rule, reproduced exactly (samples.py's docstring
gives the masks built on it):

- ``first_tokens(chars)``: per text, the first token whose characters include ``chars[k]``
  (HF ``char_to_token``); a character split over several byte tokens (an emoji, say) is
  held by the first of them.
- ``span_tokens(spans)``: per character span [lo, hi), the tokens from the first that starts
  at or after ``lo`` to the one holding character ``hi - 1``. HF answers an empty span
  (hi <= lo) from its offset table instead, for every span of that text: tokens from the first
  starting at or after ``lo`` to the first starting at or after ``hi``.

Where the fast path cannot answer from bytes, it asks HF for that text only: a text that an
NFC normalizer changes where an edge falls on a character NFC composes or reorders (elsewhere
its edges map through the normalization: fast/nfc_edges.py), and every text of a batch that
quicktok refuses as a whole (e.g. a lone surrogate), so that such a text is skipped with HF's
own reason and message.
"""

from __future__ import annotations

from itertools import chain
from typing import Any, Sequence

import numpy as np


_EDGE_PROBES = 8  # characters tried at a span edge before reading all offsets of the text


class Encoded:
    """Encodings of the texts of one batch that did not fail.

    Text ``kept[k]`` of the batch is ``ids[starts[k]:starts[k] + lengths[k]]``; ``failed``
    lists (index in the batch, error detail) for texts the tokenizer refused.
    """

    lengths: np.ndarray  # int64 [m]
    ids: np.ndarray  # int32 [T]
    kept: list[int]
    failed: list[tuple[int, str]]

    def first_tokens(self, chars: Sequence[int]) -> np.ndarray:
        """Per kept text: index of the token holding character ``chars[k]`` (see module doc)."""
        raise NotImplementedError

    def span_tokens(self, spans: Sequence[list[tuple[int, int]]]) -> list[list[tuple[int, int]]]:
        """Per kept text: token ranges [a, b) of its character spans (see module doc)."""
        raise NotImplementedError


# ---- the reference: HF tokenizers --------------------------------------------------------------
class HFEncoder:
    """The tokenizer's Rust backend (``tokenizer.backend_tokenizer``)."""

    name = "hf"

    def __init__(self, backend: Any) -> None:
        self.backend = backend

    def encode(self, texts: Sequence[str], *, special: bool, edges: bool) -> "HFEncoded":
        """``special``: add the post-processor's tokens (BOS, ...); ``edges``: keep character
        offsets (encode_batch instead of encode_batch_fast, ~7% slower). A batch that fails is
        encoded text by text; the texts that fail are reported, not raised."""
        encode_batch = getattr(self.backend, "encode_batch_fast", None) if not edges else None
        try:
            encs = (encode_batch or self.backend.encode_batch)(texts, add_special_tokens=special)
            return HFEncoded(encs, list(range(len(texts))), [])
        except Exception:
            encs, kept, failed = [], [], []
            for k, text in enumerate(texts):
                try:
                    encs.append(self.backend.encode(text, add_special_tokens=special))
                    kept.append(k)
                except Exception as e:
                    failed.append((k, f"{type(e).__name__}: {str(e)[:200]}"))
            return HFEncoded(encs, kept, failed)


class HFEncoded(Encoded):
    def __init__(self, encs: list, kept: list[int], failed: list[tuple[int, str]]) -> None:
        self.encodings, self.kept, self.failed = encs, kept, failed
        self.lengths, self.ids = flatten(encs)

    def first_tokens(self, chars: Sequence[int]) -> np.ndarray:
        return np.fromiter((first_token_at(e, c) for e, c in zip(self.encodings, chars)), np.int64, len(chars))

    def span_tokens(self, spans: Sequence[list[tuple[int, int]]]) -> list[list[tuple[int, int]]]:
        return [span_tokens(e, s) for e, s in zip(self.encodings, spans)]


def flatten(encs: list) -> tuple[np.ndarray, np.ndarray]:
    """Encodings -> (lengths int64 [m], ids int32 [T]); one pass, no per-token Python."""
    id_lists = [e.ids for e in encs]
    lengths = np.fromiter(map(len, id_lists), dtype=np.int64, count=len(id_lists))
    ids = np.fromiter(chain.from_iterable(id_lists), dtype=np.int32, count=int(lengths.sum()))
    return lengths, ids


def _first_covered(enc: Any, lo: int, hi: int) -> int | None:
    """Index of the token holding the first covered character in [lo, hi), or None."""
    for c in range(lo, min(hi, lo + _EDGE_PROBES)):
        t = enc.char_to_token(c)
        if t is not None:
            return t
    return None


def first_token_at(enc: Any, char: int) -> int:
    """The token holding ``char`` (or the next covered character); on characters no token
    covers (whitespace a pre-tokenizer dropped), the first token ending after ``char``."""
    t = _first_covered(enc, char, char + _EDGE_PROBES)  # char_to_token is None past the end
    if t is None:
        ends = np.asarray(enc.offsets, dtype=np.int64).reshape(-1, 2)[:, 1]
        t = int(np.argmax(ends > char)) if (ends > char).any() else len(ends)
    return t


def span_tokens(enc: Any, spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Token ranges [a, b) of the tokens whose first character lies in each character span.

    Uses ``char_to_token`` at the span edges (a few calls per span) instead of converting every
    token's offsets to Python; falls back to the offsets when an edge sits on characters no
    token covers (whitespace dropped by the pre-tokenizer). For "...assistant\\n|Hi<|im_end|>\\n|"
    with tokens [..., "assistant", "\\n", "Hi", "<|im_end|>", "\\n"] the span gives "Hi" to "\\n".
    """
    out = []
    for lo, hi in spans:
        a = _first_covered(enc, lo, hi)
        b = None
        for c in range(hi - 1, max(lo, hi - _EDGE_PROBES) - 1, -1):
            b = enc.char_to_token(c)
            if b is not None:
                break
        if a is None or b is None:
            return span_tokens_from_offsets(enc, spans)
        if enc.token_to_chars(a)[0] < lo:  # the token straddles the span start: not in the span
            a += 1
        out.append((a, b + 1))
    return out


def span_tokens_from_offsets(enc: Any, spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    starts = np.asarray(enc.offsets, dtype=np.int64).reshape(-1, 2)[:, 0]
    return [(int(np.searchsorted(starts, lo)), int(np.searchsorted(starts, hi))) for lo, hi in spans]

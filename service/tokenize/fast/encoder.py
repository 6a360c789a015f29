"""quicktok's encoder: ``FastEncoder`` gives ``HFEncoder``'s answers (tokenize/encoders.py: the
ids of a batch of texts, the token under a character) from quicktok's exact byte-level BPE and
the tokens' byte lengths, an order of magnitude faster per core; encoders.py's docstring says
how a character maps to the token holding it. In a text an NFC normalizer changes, an edge
maps through the normalization where NFC keeps its character alone (nfc_edges.py). Where bytes
cannot answer (an edge on a character NFC composes; a batch quicktok refuses as a whole), it
asks the HF reference for that text only.
"""

from __future__ import annotations

import copy
import re
import unicodedata
from typing import Any, Sequence

import numpy as np

from packfeed.client.offsets import concat_ranges, offsets_of, run_sums, starts_of
from packfeed.service.tokenize.encoders import Encoded, HFEncoder, first_token_at, span_tokens
from packfeed.service.tokenize.fast.nfc_edges import nfc, normalized_byte_at

class FastEncoder:
    """quicktok ids; token positions from byte lengths (see the module docstring).

    ``byte_lengths[id]``: UTF-8 length of each token (special tokens: their text).
    ``added``: the tokenizer's added tokens (text -> id), split out of every text first, as
    HF does (leftmost, longest first), the text between them encoded as ordinary text: 4x
    quicker than quicktok's own special-token scan on chat text (measured 14.9 vs 3.5M
    tokens/s). ``prefix``/``suffix``: the ids the HF post-processor adds around every text
    when asked for special tokens (e.g. a BOS), proven constant at load. ``nfc``: the
    tokenizer normalizes to NFC. ``threads``: quicktok worker threads per batch (the actor's
    CPUs).
    """

    name = "fast"

    def __init__(
        self,
        quick: Any,
        reference: HFEncoder,
        *,
        byte_lengths: np.ndarray,
        added: dict[str, int] | None = None,
        prefix: Sequence[int] = (),
        suffix: Sequence[int] = (),
        nfc: bool = False,
        threads: int = 1,
    ) -> None:
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        self.quick, self.reference = quick, reference
        self.byte_lengths = np.asarray(byte_lengths, dtype=np.int32)  # half the bytes to gather per token
        self.prefix = np.asarray(prefix, dtype=np.int32)
        self.suffix = np.asarray(suffix, dtype=np.int32)
        self.nfc, self.threads = nfc, threads
        self.added = dict(added or {})
        by_length = sorted(self.added, key=len, reverse=True)
        pattern = re.compile("(" + "|".join(map(re.escape, by_length)) + ")") if by_length else None
        self._split = pattern.split if pattern else None
        self.added_search = pattern.search if pattern else None  # finds an added token in a text
        firsts = "".join(sorted({t[0] for t in by_length}))  # a text holding none of them holds no added token
        if len(firsts) == 1:  # Qwen2.5's "<": ``in``, a C scan
            self._may_hold_added = lambda text, first=firsts: first in text
        else:
            self._may_hold_added = re.compile("[" + re.escape(firsts) + "]").search if firsts else None
        self.texts_by_reference = 0  # texts the fast path handed to HF for their edges (a count for tests and debugging)

    def rebound(self, reference: HFEncoder, *, threads: int) -> "FastEncoder":
        """This encoder (the same quicktok tokenizer and tables) with another HF reference
        and number of threads: another SampleTokenizer of this process, without loading
        quicktok's files again."""
        other = copy.copy(self)
        other.reference, other.threads, other.texts_by_reference = reference, threads, 0
        return other

    def normalized(self, text: str) -> str:
        """The text as quicktok encodes it under an NFC normalizer: NFC between the added
        tokens, which are split out first (as HF does)."""
        if self._split is None:
            return nfc(text)
        parts = self._split(text)
        parts[0::2] = map(nfc, parts[0::2])
        return "".join(parts)

    def encode(self, texts: Sequence[str], *, special: bool, edges: bool) -> Encoded:
        texts = texts if isinstance(texts, list) else list(texts)
        try:
            lengths, ids = self._ids(texts)
        except Exception:  # e.g. a lone surrogate: HF decides, text by text, with its own reason
            self.texts_by_reference += len(texts)
            return self.reference.encode(texts, special=special, edges=edges)
        nbytes = np.take(self.byte_lengths, ids) if edges else None
        if special and (len(self.prefix) or len(self.suffix)):
            lengths, ids, nbytes = _add_post_tokens(lengths, ids, nbytes, self.prefix, self.suffix)
        changed = []  # texts NFC changes: their edges through nfc_edges.py, or HF's where that cannot say
        if edges and self.nfc:
            changed = [k for k, t in enumerate(texts) if not t.isascii() and not unicodedata.is_normalized("NFC", t)]
        return FastEncoded(texts, lengths, ids, nbytes, changed, self, special)

    def _ids(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(lengths int64 [m], ids int32 [T]): added tokens split out, the rest one batch.

        For "hi<|im_end|>\n" the pieces are "hi", "\n" and the unit lengths [1, 1, 1]
        (piece, added token, piece): one encode_batch for all pieces of all texts, then the
        added tokens' ids are put between them with two masked assignments. A text holding no
        added token's first character is one piece, not split (the split's regex and lists cost
        about as much as quicktok's encode of a short text).
        """
        if self._split is None:
            flat, offsets = self.quick.encode_batch(texts, self.threads, False)
            return np.diff(offsets), flat.view(np.int32)
        pieces, added, units = [], [], []
        split, may_hold = self._split, self._may_hold_added
        for text in texts:
            if not may_hold(text):
                pieces.append(text)
                units.append(1)
                continue
            parts = split(text)  # [piece, added, piece, ..., piece]: odd length
            pieces += parts[0::2]
            added += parts[1::2]
            units.append(len(parts))
        flat, offsets = self.quick.encode_batch(pieces, self.threads, False)
        if not added:
            return np.diff(offsets), flat.view(np.int32)
        units = np.asarray(units, dtype=np.int64)
        unit_offsets = offsets_of(units)  # text k's pieces and added tokens: units [offsets[k], offsets[k+1])
        is_added = ((np.arange(int(units.sum())) - np.repeat(unit_offsets[:-1], units)) & 1).astype(bool)
        unit_lengths = np.ones(len(is_added), dtype=np.int64)
        unit_lengths[~is_added] = np.diff(offsets)
        token_is_added = np.repeat(is_added, unit_lengths)
        ids = np.empty(len(token_is_added), dtype=np.int32)
        ids[~token_is_added] = flat.view(np.int32)
        ids[token_is_added] = np.fromiter(map(self.added.__getitem__, added), np.int32, len(added))
        return run_sums(unit_lengths, unit_offsets), ids


class FastEncoded(Encoded):
    """``nbytes[t]``: UTF-8 bytes of token t in the text as encoded (NFC under an NFC
    normalizer; 0 for post-processor tokens). ``changed``: the texts NFC changes, whose edges
    map through ``nfc_edges.normalized_byte_at``; a text with an edge it cannot map (a character
    NFC composes), or whose NFC here is not what quicktok encoded (``_normalized``), is answered
    by its HF encoding in ``by_reference``, made on first need."""

    def __init__(self, texts: list[str], lengths: np.ndarray, ids: np.ndarray, nbytes: np.ndarray | None,
                 changed: list[int], encoder: FastEncoder, special: bool) -> None:  # fmt: skip
        self.texts, self.lengths, self.ids = texts, lengths, ids
        self.kept, self.failed = list(range(len(texts))), []
        self.by_reference: dict[int, Any] = {}
        self.changed = set(changed)
        self._wholes: dict[int, str | None] = {}  # changed text -> as encoded, made on first need
        self._encoder, self._special = encoder, special
        if nbytes is not None:
            self.starts = starts_of(lengths)  # first token of each text
            byte_offsets = offsets_of(nbytes)  # global: all texts of the batch back to back
            self.byte_starts, self.byte_ends = byte_offsets[:-1], byte_offsets[1:]
            self.base = byte_offsets[self.starts]  # first byte of each text

    def _edge_byte(self, k: int, c: int) -> int | None:
        """UTF-8 offset of character ``c`` of text ``k`` in the text as encoded; None where
        only HF can say (``nfc_edges``)."""
        text = self.texts[k]
        if k not in self.changed:
            return _byte_at(text, c)
        whole = self._normalized(k)
        return None if whole is None else normalized_byte_at(text, c, whole, self._encoder.normalized)

    def _normalized(self, k: int) -> str | None:
        """Text ``k`` as encoded (``FastEncoder.normalized``), made once; None where that is not
        what quicktok encoded (its UTF-8 length differs from the tokens': another Unicode
        version's NFC), so that HF answers."""
        if k not in self._wholes:
            whole = self._encoder.normalized(self.texts[k])
            n = int(self.lengths[k])
            encoded = int(self.byte_ends[self.starts[k] + n - 1] - self.base[k]) if n else 0
            self._wholes[k] = whole if len(whole.encode("utf-8", "surrogatepass")) == encoded else None
        return self._wholes[k]

    def _ask_reference(self, k: int) -> None:
        """Text ``k``'s edges from its HF encoding (its ids are the same: the proof's)."""
        self.by_reference[k] = self._encoder.reference.backend.encode(self.texts[k], add_special_tokens=self._special)
        self._encoder.texts_by_reference += 1

    def first_tokens(self, chars: Sequence[int]) -> np.ndarray:
        at = np.zeros(len(chars), np.int64)
        for k, c in enumerate(chars):
            if k in self.by_reference:
                continue
            b = self._edge_byte(k, c)
            if b is None:
                self._ask_reference(k)
            else:
                at[k] = b
        tokens = np.searchsorted(self.byte_ends, self.base + at, side="right") - self.starts
        tokens = np.minimum(tokens, self.lengths)  # an edge at the very end: no token holds it
        for k, enc in self.by_reference.items():
            tokens[k] = first_token_at(enc, chars[k])
        return tokens

    def span_tokens(self, spans: Sequence[list[tuple[int, int]]]) -> list[list[tuple[int, int]]]:
        # One searchsorted per kind of edge for the whole batch; Python only turns characters
        # into bytes. held: the token holding a byte; from: the first token starting at or after it.
        held, held_at, from_at, owner = [], [], [], []
        for k, (text, sp) in enumerate(zip(self.texts, spans)):
            if k in self.by_reference:
                continue
            n = len(text)
            if any(lo < 0 or hi > n for lo, hi in sp):  # not a span of this text: HF's own answer
                self._ask_reference(k)
                continue
            offsets_rule = any(hi <= lo for lo, hi in sp)  # HF answers from its offsets
            edges = [(self._edge_byte(k, lo), self._edge_byte(k, hi if offsets_rule else hi - 1)) for lo, hi in sp]
            if any(a is None or b is None for a, b in edges):
                self._ask_reference(k)
                continue
            for a, b in edges:
                from_at.append(a)
                held_at.append(b)
                held.append(not offsets_rule)
                owner.append(k)
        out: list[list[tuple[int, int]]] = [[] for _ in spans]
        if owner:
            k = np.asarray(owner, np.int64)
            first, normal = self.starts[k], np.asarray(held, bool)
            lo = self.base[k] + np.asarray(from_at, np.int64)
            edge = self.base[k] + np.asarray(held_at, np.int64)
            # normal rule: a = the token holding lo, or the next one if it starts before lo;
            # b = one past the token holding the last character's first byte
            a_held = np.searchsorted(self.byte_ends, lo, side="right")
            a_held += self.byte_starts[np.minimum(a_held, len(self.ids) - 1)] < lo
            b_held = np.searchsorted(self.byte_ends, edge, side="right") + 1
            # offsets rule: the first tokens starting at or after lo and after the last character
            a_from = np.searchsorted(self.byte_starts, lo, side="left")
            b_from = np.searchsorted(self.byte_starts, edge, side="left")
            limit = first + self.lengths[k]
            a = np.clip(np.where(normal, a_held, a_from), first, limit) - first
            b = np.clip(np.where(normal, b_held, b_from), first, limit) - first
            for owner_k, x, y in zip(owner, a.tolist(), b.tolist()):
                out[owner_k].append((x, y))
        for k, enc in self.by_reference.items():
            out[k] = span_tokens(enc, spans[k])
        return out


def _byte_at(text: str, char: int) -> int:
    """UTF-8 offset of character ``char`` (clipped to the text)."""
    if text.isascii():
        return min(max(char, 0), len(text))
    return len(text[: max(char, 0)].encode("utf-8", "surrogatepass"))


def _add_post_tokens(lengths, ids, nbytes, prefix: np.ndarray, suffix: np.ndarray):
    """Put ``prefix`` before and ``suffix`` after every text (byte length 0: they hold no
    character). lengths [2, 1], ids [5, 6, 7], prefix [1] -> lengths [3, 2], ids [1, 5, 6, 1, 7]."""
    p, s, m = len(prefix), len(suffix), len(lengths)
    new_lengths = lengths + p + s
    new_starts = starts_of(new_lengths)
    dest = concat_ranges(new_starts + p, lengths)  # where each text's own tokens go
    out = np.empty(int(new_lengths.sum()), dtype=np.int32)
    out[dest] = ids
    out_bytes = None
    if nbytes is not None:
        out_bytes = np.zeros(len(out), dtype=nbytes.dtype)
        out_bytes[dest] = nbytes
    if p:
        out[(new_starts[:, None] + np.arange(p)).ravel()] = np.tile(prefix, m)
    if s:
        out[(new_starts[:, None] + p + lengths[:, None] + np.arange(s)).ravel()] = np.tile(suffix, m)
    return new_lengths, out, out_bytes

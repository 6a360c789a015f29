"""Character edges in texts an NFC normalizer changes, answered from bytes where NFC leaves them be.

The fast encoder finds the token under character ``c`` from the UTF-8 offset of ``c`` (encoders.py).
Under an NFC normalizer quicktok encodes ``NFC(text)``, and HF answers in the original text's
characters through the normalizer's alignments, so the offset of ``c`` in the original text is
the wrong one wherever NFC changed something before it. Sending every such text to HF for its
edges cost 40-50% of a window on a corpus with 30% decomposed snippets (bench_multilingual.py).

An edge needs neither where NFC keeps character ``c`` as it is, alone, checked directly:
``NFC(text) == NFC(text[:c]) + text[c] + NFC(text[c + 1:])``. Nothing is then composed or
reordered across ``c`` (for ``"cafe\\u0301"`` neither the ``e`` nor the mark is: NFC makes one
``é`` of the two), ``c`` is at UTF-8 offset ``len(NFC(text[:c]).encode())`` of the encoded text,
and the normalizer's alignment maps that character back to ``c``: the tokens before it are those
starting before that offset, the token holding it the one holding that byte, as in a text NFC
leaves alone. ``normalized_byte_at`` returns that offset, or None where ``c`` is not kept alone
(the caller asks HF for that text). Cost: three normalizations of parts of the text per edge
(C code; microseconds for a few KB). Proven equal to HF by a sweep over texts of combining marks
of several classes, Hangul jamo, singletons and backward-composing vowel signs, at every edge
(tests/unit/service/tokenize/test_nfc_edges.py); the fast back-end's proof compares the first
window's samples with HF's at run time (backend.py).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable


def nfc(text: str) -> str:
    """``NFC(text)``; ASCII as it is, without the call."""
    return text if text.isascii() else unicodedata.normalize("NFC", text)


def normalized_byte_at(text: str, c: int, whole: str | None = None,
                       normalize: Callable[[str], str] = nfc) -> int | None:
    """UTF-8 offset in ``normalize(text)`` of character ``c`` (clipped to the text) where it keeps
    it alone; None where it does not. ``normalize``: NFC, or NFC between a tokenizer's added
    tokens, which HF splits out before it normalizes (a ``>`` ending one does not compose with a
    U+0338 after it: ``FastEncoder.normalized``); ``whole``: ``normalize(text)``, when the caller
    keeps it across edges. For ``"cafe\\u0301 au"`` character 5 (the space) is at byte 5,
    the ``é`` NFC made being two bytes; character 3 (the ``e`` composed with the mark) has no
    offset of its own. An ASCII character before an ASCII one (or the end) needs only to be where
    the text before it ends (``startswith``): no ASCII character composes with one before it, is
    reordered, or composes with an ASCII one after it."""
    n = len(text)
    c = min(max(c, 0), n)
    full = normalize(text) if whole is None else whole
    if c == n:
        return len(full.encode("utf-8", "surrogatepass"))
    head = normalize(text[:c])
    if text[c] < "\x80" and (c + 1 == n or text[c + 1] < "\x80"):
        kept = full.startswith(head) and full[len(head):len(head) + 1] == text[c]
    else:
        kept = full == head + text[c] + normalize(text[c + 1:])
    return len(head.encode("utf-8", "surrogatepass")) if kept else None

"""Conversations of a known ChatML template tokenized straight from their turns (fast back-end).

A ChatML conversation (chat.py ``ChatML``) is, turn after turn,
``<|im_start|>{role}\\n{content}<|im_end|>\\n``. The fast encoder (encoders.py) splits a text's
added tokens out and encodes the text between them alone, so where both markers are added
tokens the conversation's ids are, per turn: the start marker, the turn's text
``{role}\\n{content}`` encoded, the end marker, the ids of ``"\\n"``. ``TurnEncoder`` builds
those ids without rendering the conversation, splitting it again, or mapping character spans
through byte offsets: one quicktok batch of the turns' texts, then numpy. An assistant turn is
trained as chat.py's span says under the HF rule of encoders.py: from the first token that
starts at or after the end of its ``assistant\\n`` header (the end marker when the content is
empty) through its ``"\\n"``; from the conversation's first token when a template with a
default system turn (Qwen2.5's) opens with the assistant. For ``<|im_start|>user\\nhi<|im_end|>\\n
<|im_start|>assistant\\nhello<|im_end|>\\n``: [S] user \\n hi [E] \\n [S] assistant \\n
(hello [E] \\n), the parenthesised tokens trained.

That these are the text path's ids and masks holds by construction only where the split
cannot see anything else, which is checked:

- on the vocabulary, once (``TurnEncoder.of``): both markers are added tokens, no other added
  token can match across a marker's edge (none extends a marker or overlaps one from its
  left), and ``"\\n"`` holds none;
- per turn text: it holds no added token (a regex search, run only on the texts holding the
  first character of one: for Qwen2.5 a ``<``), and under an NFC normalizer, for an assistant
  turn, NFC keeps the first character of its content alone (fast/nfc_edges.py: its edge is then
  at the same byte; quicktok normalizes every turn's ids as HF does).

Every other conversation goes through the text path (render, encode, spans), as does the whole
batch when quicktok refuses it. Proven equal to the text path and to HF by a sweep of random
conversations (tests/unit/service/tokenize/test_chat_tokens.py), and at run time by the fast
back-end's proof, which compares the first window's samples with HF's (backend.py). Cost: 3,083
chats of ~1,000 tokens tokenize in 0.18-0.19 s on one core, 0.24-0.25 s through the text path
(quicktok's encode: 0.13 s of either).
"""

from __future__ import annotations

import unicodedata
from typing import Sequence

import numpy as np

from packfeed.client.offsets import offsets_of, run_sums
from packfeed.service.tokenize.chat import ChatML
from packfeed.service.tokenize.fast.encoder import FastEncoder
from packfeed.service.tokenize.fast.nfc_edges import normalized_byte_at

START, END = "<|im_start|>", "<|im_end|>"
_ASSISTANT = "assistant\n"
_HEADER = len(_ASSISTANT)  # bytes of an assistant turn's text before its content


class TurnEncoder:
    """The ids and trained mask of ChatML conversations from their turns (module docstring)."""

    def __init__(self, fast: FastEncoder, newline: np.ndarray) -> None:
        self.fast = fast
        self.start, self.end = fast.added[START], fast.added[END]
        self.newline = newline  # the ids of "\n"
        self._first_chars = "".join(sorted({t[0] for t in fast.added}))  # for Qwen2.5: "<"
        self._search = fast.added_search

    @classmethod
    def of(cls, encoder: object) -> "TurnEncoder | None":
        """The turn encoder over ``encoder``, or None where its equality with the text path
        is not guaranteed by the vocabulary (or ``encoder`` is not the fast one)."""
        if not isinstance(encoder, FastEncoder) or START not in encoder.added or END not in encoder.added:
            return None
        if any(_crosses(t, marker) for t in encoder.added for marker in (START, END)):
            return None
        if encoder.added_search is not None and encoder.added_search("\n"):
            return None
        try:
            flat, _ = encoder.quick.encode_batch(["\n"], 1, False)
        except Exception:
            return None
        return cls(encoder, flat.view(np.int32).copy())

    def plain(self, text: str) -> bool:
        """Whether the text path would encode turn text ``text`` as one piece of ordinary text,
        with the same trained edge: no added token in it; under an NFC normalizer, an assistant
        turn's header edge (the first character of its content) where NFC keeps it alone
        (nfc_edges.py; the other turns hold no edge, quicktok normalizes their ids as HF does)."""
        first = self._first_chars
        if first and (first in text if len(first) == 1 else any(c in text for c in first)) and self._search(text):
            return False
        if text.isascii() or not self.fast.nfc or not text.startswith(_ASSISTANT):
            return True
        return unicodedata.is_normalized("NFC", text) or normalized_byte_at(text, _HEADER) == _HEADER

    def encode(self, chat: ChatML, conversations: Sequence[list[dict]], all_loss: bool):
        """(taken, lengths, ids, trained): the indices of the ``conversations`` (accepted by
        ``chat``) encoded here, their token counts, flat ids and trained mask; the others need
        the text path. None when quicktok refuses the batch (the text path decides then)."""
        system = None if chat.default_system is None else f"system\n{chat.default_system}"
        texts: list[str] = []
        turns: list[int] = []  # per taken conversation
        taken: list[int] = []
        trained_turns: list[int] = []  # global turn numbers of the assistant turns
        opens: list[int] = []  # the ones trained from their conversation's first token
        for k, messages in enumerate(conversations):
            own = [system] if system is not None and messages[0]["role"] != "system" else []
            own += [f"{m['role']}\n{m['content']}" for m in messages]
            if not all(map(self.plain, own)):
                continue
            first = len(texts)
            for i, m in enumerate(messages):
                if m["role"] == "assistant":
                    trained_turns.append(first + len(own) - len(messages) + i)
                    if i == 0 and system is not None:
                        opens.append(len(trained_turns) - 1)
            texts += own
            turns.append(len(own))
            taken.append(k)
        if not texts:
            return taken, np.zeros(0, np.int64), np.zeros(0, np.int32), np.zeros(0, bool)
        try:
            flat, offsets = self.fast.quick.encode_batch(texts, self.fast.threads, False)
        except Exception:
            return None
        flat, text_lengths = flat.view(np.int32), np.diff(offsets)
        nl = len(self.newline)
        units = text_lengths + 2 + nl  # [S] text [E] "\n"
        unit_starts = offsets_of(units)
        total = int(unit_starts[-1])
        unit_starts = unit_starts[:-1]
        ends = unit_starts + 1 + text_lengths
        ids = np.empty(total, np.int32)
        text_slot = np.ones(total, bool)  # the texts' tokens fill the slots the markers leave, in order
        markers = [(unit_starts, self.start), (ends, self.end)]
        markers += [(ends + 1 + j, t) for j, t in enumerate(self.newline.tolist())]
        for at, value in markers:
            ids[at] = value
            text_slot[at] = False
        ids[text_slot] = flat
        turn_offsets = offsets_of(turns)
        lengths = run_sums(units, turn_offsets)
        if all_loss:
            return taken, lengths, ids, np.ones(total, bool)
        assistant = np.asarray(trained_turns, np.int64)
        lo = unit_starts[assistant] + 1 + self._after_header(flat, offsets[assistant], text_lengths[assistant])
        if opens:  # trained from the conversation's first token: the default system turn's start marker
            owner = np.searchsorted(turn_offsets, assistant[opens], side="right") - 1
            lo[opens] = unit_starts[turn_offsets[owner]]
        hi = unit_starts[assistant] + units[assistant]
        edges = np.empty(2 * len(lo) + 2, np.int64)
        edges[0], edges[1:-1:2], edges[2:-1:2], edges[-1] = 0, lo, hi, total
        runs = np.diff(edges)  # untrained, trained, untrained, ..., untrained
        trained = np.repeat(np.arange(len(runs)) % 2 == 1, runs)
        return taken, lengths, ids, trained

    def _after_header(self, flat: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """Per assistant turn text: its first token starting at or after byte ``_HEADER`` (its
        token count when none does). Token k of a text starts at byte k or later, so the first
        ``_HEADER + 1`` tokens decide."""
        k = np.arange(_HEADER + 1)
        valid = k < lengths[:, None]
        at = np.minimum(starts[:, None] + k, max(len(flat) - 1, 0))
        nbytes = np.where(valid, np.take(self.fast.byte_lengths, flat[at]), 0)
        begins = np.cumsum(nbytes, axis=1) - nbytes
        return ((begins < _HEADER) & valid).sum(axis=1)


def _crosses(token: str, marker: str) -> bool:
    """Whether the added token ``token`` could match where ``marker`` is meant to: at the
    marker's position and longer (it extends the marker), or from before it into it."""
    if token == marker:
        return False
    if token.startswith(marker):
        return True
    return any(marker.startswith(token[k:]) or token[k:].startswith(marker) for k in range(1, len(token)))

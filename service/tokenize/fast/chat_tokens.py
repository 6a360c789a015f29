"""Conversations of a template framed by fixed texts tokenized straight from their turns (fast back-end).

A known ChatML template (chat.py ``ChatML``) and a template learned from what it renders
(chat_frames.py ``FramedTemplate``) render a conversation as fixed texts between the contents:
``lead + c0 + link + c1 + ... + close``. The fast encoder (encoders.py) splits a text's added
tokens out and encodes the text between them alone, so where every link holds an added token a
conversation's ids are, in order: each fixed text's ids (from its first added token to its
last; a lead's text before its first, a close's after its last), and between them each
content's piece: the text after the previous fixed text's last added token, the content, the
text before the next one's first, encoded. For ChatML, ``[S] user\nhi [E] \n [S] assistant\nhello [E] \n``:
pieces ``user\nhi`` and ``assistant\nhello``, fixed ids [S], [E] \n [S], [E] \n. The fixed
ids are encoded once per template; ``TurnEncoder`` builds the rest without rendering the
conversation, splitting it again, or mapping character spans through byte offsets: one
quicktok batch of the pieces, then numpy. An assistant turn is trained as chat.py's span says
under the HF rule of encoders.py: from the first token that starts at or after its content's
first character (the next fixed id when the content is empty) through the fixed ids that start
inside its closing text (ChatML's ``<|im_end|>\n``); from the conversation's first token when a
template that fails on no messages (Qwen2.5's) opens with the assistant. For ``<|im_start|>user\nhi<|im_end|>\n
<|im_start|>assistant\nhello<|im_end|>\n``: [S] user \n hi [E] \n [S] assistant \n
(hello [E] \n), the parenthesised tokens trained.

That these are the text path's ids and masks holds by construction only where the split
cannot see anything else, which is checked:

- per fixed text, once per template: no added token can match across the edge of one of its
  added tokens (none extends one or overlaps one from its left), a link holds one, under an
  NFC normalizer NFC leaves its ids' text as it is, and an assistant turn's closing text ends
  inside the next fixed ids (not in the next piece);
- per piece: it holds no added token (a regex search, run only on the pieces holding the first
  character of one: for Qwen2.5 a ``<``), and under an NFC normalizer, for an assistant turn,
  NFC keeps the first character of its content alone (fast/nfc_edges.py: its edge is then at
  the same byte; quicktok normalizes every piece's ids as HF does).

Every other conversation goes through the text path (render, encode, spans), as does the whole
batch when quicktok refuses it. Proven equal to the text path and to HF by sweeps of random
conversations (tests/unit/service/tokenize/test_chat_tokens.py for the known templates,
test_chat_frames.py for learned ones), and at run time by the fast back-end's proof, which
compares the first window's samples with HF's (backend.py). Cost: 3,083 chats of ~1,000 tokens
tokenize in 0.18-0.19 s on one core, 0.24-0.25 s through the text path (quicktok's encode:
0.13 s of either).
"""

from __future__ import annotations

import unicodedata
from typing import Sequence

import numpy as np

from packfeed.client.offsets import offsets_of, run_sums, starts_of
from packfeed.service.tokenize.fast.encoder import FastEncoder
from packfeed.service.tokenize.fast.nfc_edges import normalized_byte_at

class _Fixed:
    """A fixed text of a template as the turn encoder puts it between contents: ``before``
    (its text before its first added token) ends the previous content's piece, ``after`` (its
    text after its last added token) opens the next one, ``ids`` are the rest's; ``trained``:
    how many of ``ids`` start inside an assistant turn's closing text (after an assistant turn)."""

    __slots__ = ("before", "ids", "after", "trained")

    def __init__(self, before: str, ids: np.ndarray, after: str, trained: int) -> None:
        self.before, self.ids, self.after, self.trained = before, ids, after, trained


class TurnEncoder:
    """The ids and trained mask of conversations of a template framed by fixed texts
    (chat.py's ``ChatML``, chat_frames.py's ``FramedTemplate``) from their turns (module docstring)."""

    def __init__(self, fast: FastEncoder) -> None:
        self.fast = fast
        self._first_chars = "".join(sorted({t[0] for t in fast.added}))  # for Qwen2.5: "<"
        self._search = fast.added_search
        self._frames: dict[int, tuple[object, dict]] = {}  # id(template) -> (template, its fixed texts by place)

    @classmethod
    def of(cls, encoder: object) -> "TurnEncoder | None":
        """The turn encoder over ``encoder``, or None where it is not the fast one or has no
        added tokens (nothing then separates the turns' pieces)."""
        if not isinstance(encoder, FastEncoder) or not encoder.added or encoder.added_search is None:
            return None
        return cls(encoder)

    def plain(self, text: str, header: int = -1) -> bool:
        """Whether the text path would encode the piece ``text`` as one piece of ordinary text,
        with the same trained edge: no added token in it; under an NFC normalizer, where an
        assistant turn's content starts (character ``header``; -1: no edge), NFC keeps that
        character alone at the byte where the text before it ends (nfc_edges.py; quicktok
        normalizes the ids as HF does)."""
        first = self._first_chars
        if first and (first in text if len(first) == 1 else any(c in text for c in first)) and self._search(text):
            return False
        if header < 0 or text.isascii() or not self.fast.nfc:
            return True
        return unicodedata.is_normalized("NFC", text) or (
            normalized_byte_at(text, header) == len(text[:header].encode("utf-8", "surrogatepass")))

    def _fixed(self, cache: dict, key: tuple, text: str, place: str, close: str) -> _Fixed | None:
        """``text`` (a lead, link or close) as a ``_Fixed``, made once per template and place
        (``key``: the roles before and after it, None for the conversation's start or end);
        None where the split could see something else at its edges (an added token that
        extends one of its own or overlaps one from the left) or a link holds no added token."""
        entry = cache.get(key, False)
        if entry is not False:
            return entry
        parts = self.fast._split(text)  # [literal, added, literal, ..., literal]
        markers = parts[1::2]
        entry = None
        if (markers or place != "link") and not any(_crosses(t, m) for t in self.fast.added for m in set(markers)):
            before = parts[0] if place != "lead" and markers else ("" if place == "lead" else text)
            after = parts[-1] if place != "close" and markers else ("" if place == "close" else text)
            middle = text[len(before):len(text) - len(after)]
            ids = self.fast._ids([middle])[1] if middle else np.zeros(0, np.int32)
            trained = 0
            if place == "link" and close and len(close) < len(before):
                cache[key] = None  # the assistant turn's span would end inside the next piece
                return None
            if place == "link" and close:
                edge = len(close[len(before):].encode())  # the closing text's end, in bytes of the middle
                starts = np.cumsum(np.take(self.fast.byte_lengths, ids)) - np.take(self.fast.byte_lengths, ids)
                trained = int((starts < edge).sum())
            if not self.fast.nfc or unicodedata.is_normalized("NFC", middle):
                entry = _Fixed(before, ids, after, trained)
        cache[key] = entry
        return entry

    def _template(self, chat) -> dict:
        got = self._frames.get(id(chat))
        if got is None or got[0] is not chat:
            got = self._frames[id(chat)] = (chat, {})
        return got[1]

    def encode(self, chat, conversations: Sequence[list[dict]], all_loss: bool):
        """(taken, lengths, ids, trained): the indices of the ``conversations`` (accepted by
        ``chat``) encoded here, their token counts, flat ids and trained mask; the others need
        the text path. None when quicktok refuses the batch (the text path decides then)."""
        cache, close_a = self._template(chat), chat.assistant_close()
        pieces: list[str] = []
        fixed: list[_Fixed] = []  # per conversation: lead, link..., close
        turns: list[int] = []  # per taken conversation
        taken: list[int] = []
        headers: list[int] = []  # per trained turn: its piece's bytes before its content (-1: from the start)
        trained_turns: list[tuple[int, int]] = []  # (taken conversation, turn)
        for k, messages in enumerate(conversations):
            own_fixed, own_pieces, own_headers = [], [], []
            prev = None
            for m in messages:
                role = m["role"]
                f = cache.get((prev, role), False)  # (None, role): the lead
                if f is False:
                    f = (self._fixed(cache, (prev, role), chat.fixed_lead(role), "lead", close_a) if prev is None else
                         self._fixed(cache, (prev, role), chat.fixed_link(prev, role), "link",
                                     close_a if prev == "assistant" else ""))
                if f is None:
                    break
                if own_pieces:
                    own_pieces[-1] += f.before
                own_fixed.append(f)
                own_pieces.append(f.after + m["content"])
                if role == "assistant":
                    start = chat.assistant_from(prev)
                    if start is None:
                        break
                    own_headers.append((len(own_pieces) - 1, -1 if start == "start" else len(f.after)))
                prev = role
            else:
                f = cache.get((prev, None), False)  # (role, None): the close
                if f is False:
                    f = self._fixed(cache, (prev, None), chat.fixed_close(prev), "close", "")
                if f is not None:
                    own_pieces[-1] += f.before
                    own_fixed.append(f)
                    edges = dict(own_headers)
                    if all(self.plain(t, edges.get(j, -1)) for j, t in enumerate(own_pieces)):
                        for j, h in own_headers:
                            trained_turns.append((len(taken), j))
                            headers.append(-1 if h < 0 else len(own_pieces[j][:h].encode("utf-8", "surrogatepass")))
                        pieces += own_pieces
                        fixed += own_fixed
                        turns.append(len(own_pieces))
                        taken.append(k)
        if not pieces:
            return taken, np.zeros(0, np.int64), np.zeros(0, np.int32), np.zeros(0, bool)
        try:
            flat, offsets = self.fast.quick.encode_batch(pieces, self.fast.threads, False)
        except Exception:
            return None
        return (taken, *self._assemble(flat.view(np.int32), offsets, fixed, turns, trained_turns, headers, all_loss))

    def _assemble(self, flat, offsets, fixed, turns, trained_turns, headers, all_loss):
        """Conversation k is fixed[0], piece[0], fixed[1], ..., piece[n-1], fixed[n]: lengths,
        ids and trained mask of every conversation, from the pieces' ids and the fixed ids."""
        turns = np.asarray(turns, np.int64)
        piece_lengths = np.diff(offsets)
        segments = 2 * turns + 1
        seg_offsets = offsets_of(segments)
        # pieces sit at odd places of each conversation's segments
        piece_seg = np.repeat(seg_offsets[:-1], turns) + 2 * (np.arange(len(piece_lengths)) -
                                                               np.repeat(starts_of(turns), turns)) + 1
        is_piece = np.zeros(int(seg_offsets[-1]), bool)
        is_piece[piece_seg] = True
        fixed_ids = [f.ids for f in fixed]
        seg_lengths = np.empty(len(is_piece), np.int64)
        seg_lengths[is_piece] = piece_lengths
        seg_lengths[~is_piece] = np.fromiter(map(len, fixed_ids), np.int64, len(fixed_ids))
        token_is_piece = np.repeat(is_piece, seg_lengths)
        ids = np.empty(len(token_is_piece), np.int32)
        ids[token_is_piece] = flat
        ids[~token_is_piece] = np.concatenate(fixed_ids) if fixed_ids else np.zeros(0, np.int32)
        lengths = run_sums(seg_lengths, seg_offsets)
        total = len(ids)
        if all_loss:
            return lengths, ids, np.ones(total, bool)
        if not trained_turns:
            return lengths, ids, np.zeros(total, bool)
        seg_starts = starts_of(seg_lengths)
        conv, turn = np.asarray(trained_turns, np.int64).T
        piece = seg_offsets[conv] + 2 * turn + 1
        global_piece = starts_of(turns)[conv] + turn  # index into the pieces' batch
        header = np.asarray(headers, np.int64)
        lo = seg_starts[piece] + self._after_header(flat, offsets[global_piece], piece_lengths[global_piece],
                                                    np.maximum(header, 0))
        conv_offsets = offsets_of(lengths)
        from_start = header < 0
        lo[from_start] = conv_offsets[conv[from_start]]
        after = starts_of(turns + 1)[conv] + turn + 1  # the fixed text after each trained turn
        closing = np.fromiter((fixed[i].trained for i in after.tolist()), np.int64, len(after))
        hi = np.where(turn == turns[conv] - 1, conv_offsets[conv + 1], seg_starts[piece + 1] + closing)
        edges = np.empty(2 * len(lo) + 2, np.int64)
        edges[0], edges[1:-1:2], edges[2:-1:2], edges[-1] = 0, lo, np.maximum(hi, lo), total
        runs = np.diff(edges)  # untrained, trained, untrained, ..., untrained
        trained = np.repeat(np.arange(len(runs)) % 2 == 1, runs)
        return lengths, ids, trained

    def _after_header(self, flat: np.ndarray, starts: np.ndarray, lengths: np.ndarray,
                      header: np.ndarray) -> np.ndarray:
        """Per assistant piece: its first token starting at or after byte ``header`` (its token
        count when none does). Token k of a piece starts at byte k or later, so the first
        ``header + 1`` tokens decide."""
        k = np.arange(int(header.max(initial=0)) + 1)
        valid = k < lengths[:, None]
        at = np.minimum(starts[:, None] + k, max(len(flat) - 1, 0))
        nbytes = np.where(valid, np.take(self.fast.byte_lengths, flat[at]), 0)
        begins = np.cumsum(nbytes, axis=1) - nbytes
        return ((begins < header[:, None]) & valid).sum(axis=1)


def _crosses(token: str, marker: str) -> bool:
    """Whether the added token ``token`` could match where ``marker`` is meant to: at the
    marker's position and longer (it extends the marker), or from before it into it."""
    if token == marker:
        return False
    if token.startswith(marker):
        return True
    return any(marker.startswith(token[k:]) or token[k:].startswith(marker) for k in range(1, len(token)))

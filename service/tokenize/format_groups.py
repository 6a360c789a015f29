"""Each sample format as a group of encoded samples, and the groups merged back in record order.

``SampleTokenizer.tokenize`` (samples.py) splits a window's records by format, encodes each
format as one batch (one encoder call: the cost is per batch, not per sample), and merges the
groups so that sample k of the output is the k-th record kept. A ``FormatGroup`` is CSR: sample
i is ``ids[starts[i]:starts[i] + lengths[i]]``, ``trained`` marks the tokens the loss trains.

What is trained, by format and ``loss`` ("auto" by default):

=====================  ====================================  ================================
format                 tokens                                trained ("auto"/"completion")
=====================  ====================================  ================================
text                   tokenizer(text) (its special tokens)  every token ("completion" too)
prompt_completion,     tokenizer(prompt + completion)        the completion: from the first
strings                                                      token that ends inside it
prompt_completion,     chat template of prompt + completion  the completion messages, from the
messages               (ids == apply_chat_template's)        end of the generation prompt
messages               apply_chat_template(messages) ids     assistant turns (see below)
preference             prompt + chosen, then prompt +        both answers (pair_tokens.py: one
                       rejected (TRL's DPO tokenization)     sample of two segments)
=====================  ====================================  ================================

``loss="all"`` trains every token. Which characters of a chat sample are assistant turns:
chat.py; the tokens under characters: encoders.py (``first_tokens``, ``span_tokens``); the mask
kernels: masks.py. Chat samples of a template rendered in Python (chat.py) go through the fast
encoder's turn encoder when it has one (``turns_group``: fast/chat_tokens.py), the others are rendered to text
(``rendered_group``). A record an encoder or a template refuses is appended to ``skipped`` as
(position, reason, detail), not raised; a ``ChatTemplateError`` (the template cannot say where
the assistant turns are) is the run's error.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from packfeed.client.offsets import starts_of, take_runs
from packfeed.service.inputs.read import RawWindow
from packfeed.service.inputs.records import TEMPLATE_ERROR, TOKENIZER_ERROR, Conversation
from packfeed.service.tokenize.chat import ChatRenderer, ChatTemplateError, render_record
from packfeed.service.tokenize.encoders import Encoded
from packfeed.service.tokenize.fast.chat_tokens import TurnEncoder
from packfeed.service.tokenize.masks import ranges_to_mask


@dataclass
class FormatGroup:
    """Encoded samples of one format group, before they are merged in record order."""

    positions: np.ndarray  # int64 [m], indices into RawWindow.records
    lengths: np.ndarray  # int64 [m]
    ids: np.ndarray  # int32 [T]
    trained: np.ndarray  # bool [T]
    chosen_lens: np.ndarray | None = None  # int64 [m], pairs' chosen segments (0: no pair); None: no pairs
    prompt_lens: np.ndarray | None = None  # int64 [m]


def merge_groups(groups: list[FormatGroup]) -> FormatGroup:
    """Concatenate format groups and reorder their samples by record position. For groups at
    positions [0, 2] and [1] with lengths [2, 1] and [3], the merged lengths are [2, 3, 1]."""
    if not groups:
        e = np.zeros(0, dtype=np.int64)
        return FormatGroup(e, e, np.zeros(0, dtype=np.int32), np.zeros(0, dtype=bool))
    if len(groups) == 1:
        return groups[0]
    positions = np.concatenate([g.positions for g in groups])
    lengths = np.concatenate([g.lengths for g in groups])
    ids = np.concatenate([g.ids for g in groups])
    trained = np.concatenate([g.trained for g in groups])
    order = np.argsort(positions, kind="stable")
    new_lengths = lengths[order]
    new_starts = starts_of(lengths)[order]  # each sample's tokens, in the new order
    merged = FormatGroup(positions[order], new_lengths, take_runs(ids, new_starts, new_lengths),
                         take_runs(trained, new_starts, new_lengths))
    if any(g.chosen_lens is not None for g in groups):
        zeros = [np.zeros(len(g.positions), np.int64) for g in groups]
        merged.chosen_lens = np.concatenate([z if g.chosen_lens is None else g.chosen_lens
                                             for g, z in zip(groups, zeros)])[order]
        merged.prompt_lens = np.concatenate([z if g.prompt_lens is None else g.prompt_lens
                                             for g, z in zip(groups, zeros)])[order]
    return merged


def text_group(encoder: Any, records: list[Any], pos: list[int], skipped: list) -> FormatGroup | None:
    """Plain texts: their special tokens encoded, every token trained."""
    if not pos:
        return None
    texts = records if len(pos) == len(records) else [records[i] for i in pos]
    enc, pos = encode_batch(encoder, texts, pos, True, skipped, edges=False)
    return FormatGroup(np.asarray(pos, np.int64), enc.lengths, enc.ids, np.ones(len(enc.ids), dtype=bool))


def standard_group(encoder: Any, records: list[Any], pos: list[int], skipped: list,
                   all_loss: bool) -> FormatGroup | None:
    """tokenizer(prompt + completion); trained from the first token that ends after the prompt
    (where the prompt's and the whole text's tokens diverge, as TRL does)."""
    if not pos:
        return None
    texts = [records[i].prompt + records[i].completion for i in pos]
    enc, kept = encode_batch(encoder, texts, pos, True, skipped, edges=not all_loss)
    if all_loss:
        return FormatGroup(np.asarray(kept, np.int64), enc.lengths, enc.ids, np.ones(len(enc.ids), dtype=bool))
    first = enc.first_tokens([len(records[p].prompt) for p in kept])
    ranges = [[(f, n)] for f, n in zip(first.tolist(), enc.lengths.tolist())]
    return FormatGroup(np.asarray(kept, np.int64), enc.lengths, enc.ids, ranges_to_mask(enc.lengths, ranges))


def turns_group(turns: TurnEncoder | None, renderer: Callable[[], ChatRenderer], raw: RawWindow, pos: list[int],
                all_loss: bool) -> tuple[FormatGroup | None, list[int]]:
    """The conversations of a template rendered in Python that the fast encoder tokenizes from their
    turns (chat_tokens.py; ``turns`` None: this encoder has none), and the positions left for
    the text path. ``renderer``: the tokenizer's ``ChatRenderer``, made on first use."""
    if turns is None:
        return None, pos
    chat_renderer, chat, candidates, rest = renderer(), None, [], []
    for i in pos:
        r = raw.records[i]
        native = chat_renderer.native_for(r.messages, r.tools) if type(r) is Conversation else None
        if native is not None and (chat is None or native is chat):
            chat = native
            candidates.append(i)
        else:
            rest.append(i)
    if not candidates:
        return None, pos
    out = turns.encode(chat, [raw.records[i].messages for i in candidates], all_loss)
    if out is None:
        return None, pos
    taken, lengths, ids, trained = out
    chat_renderer.paths["turns"] += len(taken)
    if len(taken) < len(candidates):
        taken_set = set(taken)
        rest = sorted(rest + [p for k, p in enumerate(candidates) if k not in taken_set])
    return FormatGroup(np.asarray([candidates[k] for k in taken], np.int64), lengths, ids, trained), rest


def rendered_group(encoder: Any, renderer: Callable[[], ChatRenderer], raw: RawWindow, pos: list[int],
                   skipped: list, all_loss: bool) -> FormatGroup | None:
    """Conversations (and prompt/completion given as messages) rendered to text, encoded, and
    trained where their spans say."""
    texts, spans, ok = [], [], []
    for i in pos:
        try:
            text, sp = render_record(renderer(), raw, i, all_loss)
        except ChatTemplateError:
            raise
        except Exception as e:  # the template raised on this conversation (raise_exception, ...)
            skipped.append((i, TEMPLATE_ERROR, f"{type(e).__name__}: {str(e)[:200]}"))
            continue
        texts.append(text)
        spans.append(sp)
        ok.append(i)
    enc, kept = encode_batch(encoder, texts, ok, False, skipped, edges=not all_loss)
    if len(kept) != len(ok):
        kept_set = set(kept)
        spans = [s for p, s in zip(ok, spans) if p in kept_set]
    if all_loss:
        return FormatGroup(np.asarray(kept, np.int64), enc.lengths, enc.ids, np.ones(len(enc.ids), dtype=bool))
    ranges = enc.span_tokens(spans)
    return FormatGroup(np.asarray(kept, np.int64), enc.lengths, enc.ids, ranges_to_mask(enc.lengths, ranges))


def encode_batch(encoder: Any, texts: Sequence[str], pos: list[int], special: bool, skipped: list, *,
                 edges: bool) -> tuple[Encoded, list[int]]:
    """Batch-encode; texts the tokenizer refuses are skipped (``tokenizer_error``).
    ``edges``: the mask needs the tokens under characters (HF then computes offsets)."""
    enc = encoder.encode(texts, special=special, edges=edges)
    for k, detail in enc.failed:
        skipped.append((pos[k], TOKENIZER_ERROR, detail))
    return enc, [pos[k] for k in enc.kept] if enc.failed else list(pos)

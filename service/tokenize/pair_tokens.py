"""Preference pairs to tokens, as TRL's ``DPOTrainer`` tokenizes them (trl 1.16,
``DPOTrainer._prepare_dataset``).

A pair becomes one sample of two segments: ``prompt + chosen`` then ``prompt + rejected``.
Three texts are encoded per pair: the prompt, prompt + chosen and prompt + rejected (strings
concatenated and encoded with the tokenizer's special tokens; conversations rendered by the
chat template, the prompt with the generation prompt, and encoded without). The prompt is the
first P tokens, where P = min(common prefix of the prompt's ids with each whole text's ids),
so both segments start with the same P tokens even when tokens merge across the boundary;
the answers are the rest of each text (TRL: ``prompt_ids[:P]``, ``prompt_chosen_ids[P:]``).

Trained: the answers (every token under ``loss="all"``). With ``add_eos`` an EOS is appended to
each segment not ending with one, and trained: TRL appends it to standard answers; for
conversational ones TRL relies on the template's end of turn (set ``add_eos = false`` to match
it where the template does not end on EOS). A pair whose either segment trains no token after
its first is skipped (``no_trained_tokens``).

Worked example, prompt ids [1, 2], prompt + chosen [1, 2, 3], prompt + rejected [1, 2, 4, 5],
EOS 0: sample [1, 2, 3, 0, 1, 2, 4, 5, 0], trained [0, 0, 1, 1, 0, 0, 1, 1, 1], chosen
segment length 4, prompt length 2.

Cost: one batched encode of 3 texts per pair and a few numpy calls per pair; conversational
pairs add 3 template renders each.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from packfeed.service.inputs.read import RawWindow
from packfeed.service.inputs.records import NO_TRAINED_TOKENS, TEMPLATE_ERROR, TOKENIZER_ERROR
from packfeed.service.tokenize.chat import ChatRenderer, ChatTemplateError, locate_error


@dataclass
class PairGroup:
    """Encoded pairs, in the order of ``positions`` (indices into RawWindow.records)."""

    positions: np.ndarray  # int64 [m]
    lengths: np.ndarray  # int64 [m]: both segments
    ids: np.ndarray  # int32 [T]
    trained: np.ndarray  # bool [T]
    chosen_lens: np.ndarray  # int64 [m]: tokens of the chosen segment (the first)
    prompt_lens: np.ndarray  # int64 [m]: prompt tokens at the start of both segments


def encode_pairs(encoder: Any, raw: RawWindow, pos: list[int], skipped: list, *,
                 renderer: Callable[[], ChatRenderer], all_loss: bool, eos: int | None) -> PairGroup | None:
    """Encode the preference records at ``pos`` (``renderer()``: the chat renderer, made on first
    use); skips go to ``skipped`` as (position, reason, detail). ``eos``: appended to each
    segment unless it ends with it (None: add_eos is off)."""
    if not pos:
        return None
    standard = [i for i in pos if type(raw.records[i].chosen) is str]
    chat = [i for i in pos if type(raw.records[i].chosen) is not str]
    encoded: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    _encode_texts(encoder, [(i, _standard_texts(raw.records[i])) for i in standard], True, skipped, encoded)
    rendered = []
    for i in chat:
        try:
            r = raw.records[i]
            rendered.append((i, renderer().preference(r.prompt, r.chosen, r.rejected, r.tools)))
        except ChatTemplateError as e:
            raise locate_error(e, raw, i) from None
        except Exception as e:  # the template raised on this pair (raise_exception, ...)
            skipped.append((i, TEMPLATE_ERROR, f"{type(e).__name__}: {str(e)[:200]}"))
    _encode_texts(encoder, rendered, False, skipped, encoded)

    positions, ids, trained, chosen_lens, prompt_lens = [], [], [], [], []
    for i in sorted(encoded):
        prompt, with_chosen, with_rejected = encoded[i]
        p = min(_common_prefix(prompt, with_chosen), _common_prefix(prompt, with_rejected))
        segments = [_segment(with_chosen, p, all_loss, eos), _segment(with_rejected, p, all_loss, eos)]
        if not all(t[1:].any() for _, t in segments):
            skipped.append((i, NO_TRAINED_TOKENS, "the chosen or the rejected answer trains no token"))
            continue
        positions.append(i)
        ids += [s for s, _ in segments]
        trained += [t for _, t in segments]
        chosen_lens.append(len(segments[0][0]))
        prompt_lens.append(p)
    lengths = np.asarray([len(ids[2 * k]) + len(ids[2 * k + 1]) for k in range(len(positions))], np.int64)
    return PairGroup(
        positions=np.asarray(positions, np.int64),
        lengths=lengths,
        ids=np.concatenate(ids).astype(np.int32, copy=False) if ids else np.zeros(0, np.int32),
        trained=np.concatenate(trained) if trained else np.zeros(0, bool),
        chosen_lens=np.asarray(chosen_lens, np.int64),
        prompt_lens=np.asarray(prompt_lens, np.int64),
    )


def _standard_texts(record: Any) -> tuple[str, str, str]:
    return record.prompt, record.prompt + record.chosen, record.prompt + record.rejected


def _encode_texts(encoder: Any, items: list[tuple[int, tuple[str, str, str]]], special: bool, skipped: list,
                  out: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]) -> None:
    """Encode three texts per pair in one batch; a pair with a text the tokenizer refuses is
    skipped (``tokenizer_error``)."""
    if not items:
        return
    enc = encoder.encode([t for _, texts in items for t in texts], special=special, edges=False)
    failed = {k // 3: detail for k, detail in reversed(enc.failed)}  # the first failure of each pair
    starts = np.concatenate([[0], np.cumsum(enc.lengths)])
    arrays = {k: enc.ids[starts[n]:starts[n + 1]] for n, k in enumerate(enc.kept)}
    for j, (i, _) in enumerate(items):
        if j in failed:
            skipped.append((i, TOKENIZER_ERROR, failed[j]))
        else:
            out[i] = (arrays[3 * j], arrays[3 * j + 1], arrays[3 * j + 2])


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


def _segment(ids: np.ndarray, prompt: int, all_loss: bool, eos: int | None) -> tuple[np.ndarray, np.ndarray]:
    trained = np.ones(len(ids), bool) if all_loss else np.arange(len(ids)) >= prompt
    if eos is not None and (not len(ids) or ids[-1] != eos):
        ids, trained = np.append(ids, np.int32(eos)), np.append(trained, True)
    return ids.astype(np.int32, copy=False), trained

"""Tokenization: RawWindow -> TokenizedSamples (flat token ids, labels, sample offsets).

One ``SampleTokenizer`` per actor loads the tokenizer once; ``tokenize`` turns a window of
validated records (see records.py) into flat arrays, CSR style: sample i is
``tokens[offsets[i]:offsets[i+1]]``, its id ``sample_ids[i]``. Labels hold the token where the
loss trains it and IGNORE_INDEX elsewhere; the first token of each sample is NOT masked here
(the packer does that, see client/rows.py).

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
preference             prompt + chosen, then prompt +        both answers (pairs.py: one
                       rejected (TRL's DPO tokenization)     sample of two segments)
=====================  ====================================  ================================

``loss="all"`` trains every token. With ``add_eos`` an EOS is appended unless the sample
already ends with one; it is trained when the token before it is. Which characters of a chat
sample are assistant turns: chat.py (``ChatTemplateError`` when the template cannot say); the
mask kernels: masks.py. A sample left with no trained token after its first (e.g. no assistant
turn) is skipped as ``no_trained_tokens``.

Encoders (encoders.py): the tokenizer's own Rust backend (``backend="hf"``) or quicktok's exact
byte-level BPE (``"fast"``, ~25x the HF single-core rate on code with Qwen2.5's vocabulary),
with identical ids and masks; ``"auto"`` (the default) takes the fast one only after proving it
on this tokenizer and on the first window's samples (backend.py).

Chat samples: a known template (the bundled ChatML, Qwen2.5) renders in Python (chat.py);
with the fast encoder its conversations are tokenized straight from their turns, without a
rendered text (chat_tokens.py); any other template renders through Jinja, 1 + 2 * (assistant
turns) renders per conversation when only assistant turns are trained.

Cost: one batched encode per window and format group, a few numpy passes over the flat
arrays, and O(1) Python calls per sample. Measured per 1M tokens on one core
(bench/bench_tokenize.py, Python sources): text 1.5 s with HF, 0.07 s fast; chat through Jinja
1.7 s with HF, 0.25 s fast, of which 0.1 s is rendering; Qwen2.5 chats from their turns
~0.06 s fast (the bench's 3,083 chats of ~1,000 tokens: 0.18-0.19 s, 0.24-0.25 s through the text path).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from packfeed.client.offsets import offsets_of, starts_of, take_runs
from packfeed.client.rows import IGNORE_INDEX
from packfeed.service.data.config import LOSS_MODES
from packfeed.service.inputs.read import RawWindow
from packfeed.service.inputs.records import (
    NO_TRAINED_TOKENS, TEMPLATE_ERROR, TOKENIZER_ERROR, Conversation, Preference, PromptCompletion, Skip,
)
from packfeed.service.tokenize.fast.backend import BACKENDS, EncoderChoice
from packfeed.service.tokenize.chat import ChatRenderer, ChatTemplateError, locate_error, render_record
from packfeed.service.tokenize.fast.chat_tokens import TurnEncoder
from packfeed.service.tokenize.encoders import Encoded
from packfeed.service.tokenize.hf_hub import hub_kwargs, hub_unreachable, hub_unreachable_error, looks_local
from packfeed.service.tokenize.masks import append_eos, has_trained_token_after_first, ranges_to_mask
from packfeed.service.tokenize.pair_tokens import encode_pairs

logger = logging.getLogger(__name__)


@dataclass
class TokenizedSamples:
    """Sample i: ``tokens[offsets[i]:offsets[i+1]]``, labels alike, id ``sample_ids[i]``.

    A preference pair is one sample: its chosen segment (the first ``pair_chosen_lens[i]``
    tokens) then its rejected one, each opening with the same ``pair_prompt_lens[i]`` prompt
    tokens. Both arrays are None when the window holds no pair (0 for a sample that is none)."""

    tokens: np.ndarray  # int32 [T]
    labels: np.ndarray  # int32 [T]; the token where trained, IGNORE_INDEX where not
    offsets: np.ndarray  # int64 [n + 1]
    sample_ids: np.ndarray  # int64 [n], in the window's order (one loss mode after another)
    skips: list[Skip] = field(default_factory=list)
    pair_chosen_lens: np.ndarray | None = None  # int64 [n]
    pair_prompt_lens: np.ndarray | None = None  # int64 [n]

    @property
    def pairs(self) -> np.ndarray | None:
        """bool [n]: which samples are preference pairs; None when none is."""
        return None if self.pair_chosen_lens is None else self.pair_chosen_lens > 0

    def __len__(self) -> int:
        return len(self.sample_ids)

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)


@dataclass
class _Group:
    """Encoded samples of one format group, before they are merged in record order."""

    positions: np.ndarray  # int64 [m], indices into RawWindow.records
    lengths: np.ndarray  # int64 [m]
    ids: np.ndarray  # int32 [T]
    trained: np.ndarray  # bool [T]
    chosen_lens: np.ndarray | None = None  # int64 [m], pairs' chosen segments (0: no pair); None: no pairs
    prompt_lens: np.ndarray | None = None  # int64 [m]


def _rendered(renderer: ChatRenderer, raw: RawWindow, i: int, all_loss: bool) -> Any:
    """What packing gets from rendering record ``i`` of ``raw``: its text(s) and spans, or
    the name of the exception the template raised (a skip). A ChatTemplateError is raised."""
    r = raw.records[i]
    try:
        if type(r) is Preference:
            return renderer.preference(r.prompt, r.chosen, r.rejected, r.tools)
        return render_record(renderer, raw, i, all_loss)
    except ChatTemplateError:
        raise
    except Exception as e:  # the template raised on this sample: a skip when packing, not the run's error
        return type(e).__name__


class SampleTokenizer:
    """Tokenizes windows of samples; load once per actor (loading takes ~1 s for 150k vocabs).

    ``tokenizer`` is a local directory or Hub id for ``AutoTokenizer.from_pretrained``, an
    already loaded fast tokenizer, or a ``ShippedTokenizer`` (a packing actor's: ``ship()`` on
    the driver). Sets no global state (thread counts are the caller's).

    ``backend`` picks the encoder (encoders.py): ``hf`` the tokenizer's own Rust backend;
    ``fast`` quicktok, refused with ``FastPathRefused`` (a ValueError) when it cannot prove
    that it reproduces this tokenizer; ``auto`` quicktok when proven, else HF (the reason goes
    into the window stats; the driver says it once per run). The proof (backend.py) runs on the first window that holds samples:
    shape, import and stress checks (~1.7 s for a 150k vocabulary, done at construction for
    ``fast`` so that a refusal comes before any data is read), then that window's first
    samples tokenized with both back-ends must give identical tokens, labels and skips.
    ``backend_report`` says what was chosen and what was checked. ``num_threads``: quicktok
    threads per batch (default: the CPUs this process may use); the HF path follows
    RAYON_NUM_THREADS.
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        loss: str = "auto",
        add_eos: bool = True,
        strict: bool = False,
        backend: str = "auto",
        num_threads: int | None = None,
    ) -> None:
        if loss not in LOSS_MODES:
            raise ValueError(f"loss must be one of {', '.join(LOSS_MODES)}; got {loss!r}")
        if backend not in BACKENDS:
            raise ValueError(f"tokenizer backend must be one of {', '.join(BACKENDS)}; got {backend!r}")
        if num_threads is not None and num_threads < 1:
            raise ValueError(f"num_threads must be >= 1, got {num_threads}")
        if isinstance(tokenizer, str):
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(tokenizer, **hub_kwargs(tokenizer))
        self._tok = tokenizer
        self._backend = getattr(tokenizer, "backend_tokenizer", None)
        if self._backend is None:
            raise ValueError(f"tokenizer {self.name!r} has no fast (Rust `tokenizers`) backend; a fast one is required")
        self._eos = tokenizer.eos_token_id
        self._pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self._eos
        if self._eos is None and add_eos:
            raise ValueError(f"tokenizer {self.name!r} has no eos token; set add_eos=False or give it one")
        if self._pad is None:
            raise ValueError(f"tokenizer {self.name!r} has neither a pad nor an eos token")
        self.loss, self.add_eos, self.strict = loss, add_eos, strict
        self._chat: ChatRenderer | None = None
        self._turns: tuple[Any, TurnEncoder | None] | None = None  # (encoder, its turn encoder): chat_tokens.py
        self._native_chat = getattr(tokenizer, "native_chat", True)  # known chat templates rendered in Python (chat.py)
        self._encoders = EncoderChoice(
            self._backend, backend, name=self.name, threads=num_threads or _available_cpus(), probes=self._probe_texts,
            proof=getattr(tokenizer, "fast_proof", None),  # a ShippedTokenizer's: the driver's steps 1-3
        )

    @property
    def tokenizer(self) -> Any:
        return self._tok

    def ship(self) -> Any:
        """This tokenizer as the packing actors get it (``ShippedTokenizer``): rebuilt there
        without transformers, with the driver's steps 1-3 of the fast back-end's proof."""
        from packfeed.service.tokenize.shipped import ShippedTokenizer

        return ShippedTokenizer.of(self._tok, self._encoders.proof(), native_chat=self._native_chat)

    @property
    def name(self) -> str:
        return str(getattr(self._tok, "name_or_path", "") or type(self._tok).__name__)

    @property
    def backend(self) -> str:
        """The encoder in use: "hf", "fast", or "undecided" before the first window with samples."""
        return self._encoders.name

    @property
    def backend_report(self) -> dict[str, Any]:
        """The back-end asked for and chosen, why, and what its proof checked and cost."""
        return self._encoders.report

    def take_backend_report(self) -> dict[str, Any] | None:
        """``backend_report`` once, after the back-end is chosen (for the run's stats); else None."""
        return self._encoders.take_report()

    @property
    def pad_id(self) -> int:
        return int(self._pad)

    @property
    def eos_id(self) -> int | None:
        return None if self._eos is None else int(self._eos)

    @property
    def vocab_size(self) -> int:
        return len(self._tok)

    def tokenize(self, raw: RawWindow) -> TokenizedSamples:
        encoder = self._encoders.encoder
        if encoder is None:  # chosen on the first window with samples (backend.py)
            if not len(raw):
                return self._tokenize(raw, self._encoders.hf)
            encoder = self._encoders.choose(raw, self._tokenize)
        out = self._tokenize(raw, encoder)
        if out.skips and self.strict:
            raise raw.bad_sample_error(out.skips[0])
        return out

    def check_chat_template(self, raw: RawWindow, *, loss: str | None = None) -> int:
        """Render ``raw``'s conversational samples (``messages``, and prompt/completion given as
        messages) as packing them under ``loss`` (default: this tokenizer's) would: the driver's
        check of the probed rows before Ray starts. Raises ``ChatTemplateError`` naming the first
        such row when the tokenizer has no chat template, or one that cannot locate its
        assistant turns; a row the template itself raises on is left to packing (a skip).
        A known template's Python rendering (chat.py) is checked here against Jinja on every
        such row: a difference is logged and the run (this tokenizer and what ``ship()`` gives
        the actors) renders with Jinja. Returns the number of conversational samples. Cost:
        1 + 2 x (assistant turns) renders per conversational sample each way, no encoding."""
        pos = [i for i, r in enumerate(raw.records) if type(r) is Conversation or
               (type(r) in (PromptCompletion, Preference) and type(r.prompt) is not str)]
        if not pos:
            return 0
        try:
            jinja = ChatRenderer(self._tok, self.name, native=False)
        except ChatTemplateError as e:
            raise locate_error(e, raw, pos[0]) from None
        all_loss = (loss or self.loss) == "all"
        native = ChatRenderer(self._tok, self.name) if self._native_chat else None
        for i in pos:
            expected = _rendered(jinja, raw, i, all_loss)
            if native is not None and _rendered(native, raw, i, all_loss) != expected:
                source, row = raw.spec.locate(int(raw.sample_ids[i]))
                logger.warning("tokenizer %r: the Python rendering of its chat template differs from Jinja on %s row %d "
                               "(a packfeed bug, please report it): this run renders every conversation with Jinja",
                               self.name, source, row)  # fmt: skip
                self._native_chat, self._chat, native = False, None, None
        return len(pos)

    def check_backend(self) -> str | None:
        """Under ``backend="auto"``: steps 1-3 of the fast back-end's proof now, on the driver
        before Ray starts (~1 s for a 150k vocabulary; a refusal usually in milliseconds), so
        that a refusal is said before the packing actors start, not after. Returns that line
        (also logged once; the actors' same line is not repeated), or None when the fast
        back-end passed them (each actor still proves it on its first window) or the back-end
        was chosen by name. See ``backend.EncoderChoice.check_early``."""
        return self._encoders.check_early()

    def _probe_texts(self) -> list[str]:
        """A conversation rendered by the chat template, if there is one and it renders."""
        try:
            renderer = ChatRenderer(self._tok, self.name)
            messages = [{"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello! ✓"}]
            return [renderer.render(messages, None), renderer.render(messages[:1], None, True)]
        except Exception:
            return []

    # ---- tokenization with one encoder -------------------------------------------------------
    def _tokenize(self, raw: RawWindow, encoder: Any) -> TokenizedSamples:
        records = raw.records
        text_pos, std_pos, chat_pos, pair_pos = [], [], [], []
        for i, r in enumerate(records):
            if type(r) is str:
                text_pos.append(i)
            elif type(r) is PromptCompletion and type(r.prompt) is str:
                std_pos.append(i)
            elif type(r) is Preference:
                pair_pos.append(i)
            else:
                chat_pos.append(i)
        skipped: list[tuple[int, str, str]] = []  # (position, reason, detail)
        groups = [
            g
            for g in (
                self._encode_text(encoder, records, text_pos, skipped),
                self._encode_standard(encoder, records, std_pos, skipped),
                self._encode_chat(encoder, raw, chat_pos, skipped),
            )
            if g is not None
        ]
        g = _merge(groups)
        positions, lengths, ids, trained = g.positions, g.lengths, g.ids, g.trained
        if self.add_eos:
            lengths, ids, trained = append_eos(lengths, ids, trained, self._eos)
        keep = has_trained_token_after_first(lengths, trained)
        if not keep.all():
            skipped += [(int(p), NO_TRAINED_TOKENS, "no token after the first is trained") for p in positions[~keep]]
            token_keep = np.repeat(keep, lengths)
            positions, lengths, ids, trained = positions[keep], lengths[keep], ids[token_keep], trained[token_keep]
        g = _Group(positions, lengths, ids, trained)
        pairs = encode_pairs(encoder, raw, pair_pos, skipped, renderer=self._renderer, all_loss=self.loss == "all",
                             eos=self._eos if self.add_eos else None)  # their EOS: per segment
        if pairs is not None:
            g = _merge([g, _Group(pairs.positions, pairs.lengths, pairs.ids, pairs.trained, pairs.chosen_lens,
                                  pairs.prompt_lens)])
        skips = self._skips(raw, skipped)
        labels = np.where(g.trained, g.ids, np.int32(IGNORE_INDEX)).astype(np.int32, copy=False)
        return TokenizedSamples(g.ids, labels, offsets_of(g.lengths), raw.sample_ids[g.positions], skips,
                                g.chosen_lens, g.prompt_lens)

    def _renderer(self) -> ChatRenderer:
        if self._chat is None:
            self._chat = ChatRenderer(self._tok, self.name, native=self._native_chat)
        return self._chat

    # ---- format groups ---------------------------------------------------------------------
    def _encode_text(self, encoder: Any, records: list[Any], pos: list[int], skipped: list) -> _Group | None:
        if not pos:
            return None
        texts = records if len(pos) == len(records) else [records[i] for i in pos]
        enc, pos = self._encode(encoder, texts, pos, True, skipped, edges=False)
        return _Group(np.asarray(pos, np.int64), enc.lengths, enc.ids, np.ones(len(enc.ids), dtype=bool))

    def _encode_standard(self, encoder: Any, records: list[Any], pos: list[int], skipped: list) -> _Group | None:
        """tokenizer(prompt + completion); trained from the first token that ends after the prompt
        (where the prompt's and the whole text's tokens diverge, as TRL does)."""
        if not pos:
            return None
        texts = [records[i].prompt + records[i].completion for i in pos]
        all_loss = self.loss == "all"
        enc, kept = self._encode(encoder, texts, pos, True, skipped, edges=not all_loss)
        if all_loss:
            return _Group(np.asarray(kept, np.int64), enc.lengths, enc.ids, np.ones(len(enc.ids), dtype=bool))
        first = enc.first_tokens([len(records[p].prompt) for p in kept])
        ranges = [[(f, n)] for f, n in zip(first.tolist(), enc.lengths.tolist())]
        return _Group(np.asarray(kept, np.int64), enc.lengths, enc.ids, ranges_to_mask(enc.lengths, ranges))

    def _encode_chat(self, encoder: Any, raw: RawWindow, pos: list[int], skipped: list) -> _Group | None:
        if not pos:
            return None
        all_loss = self.loss == "all"
        by_turns, pos = self._encode_turns(encoder, raw, pos, all_loss)
        by_text = self._encode_rendered(encoder, raw, pos, skipped, all_loss) if pos else None
        groups = [g for g in (by_turns, by_text) if g is not None]
        return _merge(groups) if groups else None

    def _encode_turns(self, encoder: Any, raw: RawWindow, pos: list[int],
                      all_loss: bool) -> tuple[_Group | None, list[int]]:
        """The conversations of a known ChatML template that the fast encoder tokenizes from their
        turns (chat_tokens.py), and the positions left for the text path."""
        if self._turns is None or self._turns[0] is not encoder:
            self._turns = (encoder, TurnEncoder.of(encoder))
        turns = self._turns[1]
        if turns is None:
            return None, pos
        renderer, chat, candidates, rest = self._renderer(), None, [], []
        for i in pos:
            r = raw.records[i]
            native = renderer.native_for(r.messages, r.tools) if type(r) is Conversation else None
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
        if len(taken) < len(candidates):
            taken_set = set(taken)
            rest = sorted(rest + [p for k, p in enumerate(candidates) if k not in taken_set])
        return _Group(np.asarray([candidates[k] for k in taken], np.int64), lengths, ids, trained), rest

    def _encode_rendered(self, encoder: Any, raw: RawWindow, pos: list[int], skipped: list,
                         all_loss: bool) -> _Group | None:
        """Conversations (and prompt/completion given as messages) rendered to text, encoded, and
        trained where their spans say."""
        texts, spans, ok = [], [], []
        for i in pos:
            try:
                text, sp = render_record(self._renderer(), raw, i, all_loss)
            except ChatTemplateError:
                raise
            except Exception as e:  # the template raised on this conversation (raise_exception, ...)
                skipped.append((i, TEMPLATE_ERROR, f"{type(e).__name__}: {str(e)[:200]}"))
                continue
            texts.append(text)
            spans.append(sp)
            ok.append(i)
        enc, kept = self._encode(encoder, texts, ok, False, skipped, edges=not all_loss)
        if len(kept) != len(ok):
            kept_set = set(kept)
            spans = [s for p, s in zip(ok, spans) if p in kept_set]
        if all_loss:
            return _Group(np.asarray(kept, np.int64), enc.lengths, enc.ids, np.ones(len(enc.ids), dtype=bool))
        ranges = enc.span_tokens(spans)
        return _Group(np.asarray(kept, np.int64), enc.lengths, enc.ids, ranges_to_mask(enc.lengths, ranges))

    def _encode(
        self, encoder: Any, texts: Sequence[str], pos: list[int], special: bool, skipped: list, *, edges: bool
    ) -> tuple[Encoded, list[int]]:
        """Batch-encode; texts the tokenizer refuses are skipped (``tokenizer_error``).
        ``edges``: the mask needs the tokens under characters (HF then computes offsets)."""
        enc = encoder.encode(texts, special=special, edges=edges)
        for k, detail in enc.failed:
            skipped.append((pos[k], TOKENIZER_ERROR, detail))
        return enc, [pos[k] for k in enc.kept] if enc.failed else list(pos)

    def _skips(self, raw: RawWindow, skipped: list[tuple[int, str, str]]) -> list[Skip]:
        skips = []
        for p, reason, detail in sorted(skipped):
            skips.append(raw.spec.skip(int(raw.sample_ids[p]), reason, detail))
        return skips


def _available_cpus() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _merge(groups: list[_Group]) -> _Group:
    """Concatenate format groups and reorder their samples by record position."""
    if not groups:
        e = np.zeros(0, dtype=np.int64)
        return _Group(e, e, np.zeros(0, dtype=np.int32), np.zeros(0, dtype=bool))
    if len(groups) == 1:
        return groups[0]
    positions = np.concatenate([g.positions for g in groups])
    lengths = np.concatenate([g.lengths for g in groups])
    ids = np.concatenate([g.ids for g in groups])
    trained = np.concatenate([g.trained for g in groups])
    order = np.argsort(positions, kind="stable")
    new_lengths = lengths[order]
    new_starts = starts_of(lengths)[order]  # each sample's tokens, in the new order
    merged = _Group(positions[order], new_lengths, take_runs(ids, new_starts, new_lengths),
                    take_runs(trained, new_starts, new_lengths))
    if any(g.chosen_lens is not None for g in groups):
        zeros = [np.zeros(len(g.positions), np.int64) for g in groups]
        merged.chosen_lens = np.concatenate([z if g.chosen_lens is None else g.chosen_lens
                                             for g, z in zip(groups, zeros)])[order]
        merged.prompt_lens = np.concatenate([z if g.prompt_lens is None else g.prompt_lens
                                             for g, z in zip(groups, zeros)])[order]
    return merged


def load_tokenizer(name_or_path: str, *, snapshot: bool = False, **kwargs: Any) -> SampleTokenizer:
    """A SampleTokenizer for a tokenizer the user named, loaded once on the driver so that a
    mistake is one clear ValueError before Ray starts: a typo in a path, a file instead of a
    directory, a corrupt tokenizer.json, a Hub id that cannot be loaded (not cached, no network).
    A Hub id while the Hub is unreachable loads from the local cache only (``hub_unreachable``:
    one probe, not transformers' retries), or fails in one line when it is not cached.

    ``snapshot``: for a caller that packs with it and ships it (pack, serve), not one that
    saves or decodes with it: a local directory whose files an earlier load saw unchanged
    comes back from its snapshot (snapshots.py) as a ``ShippedTokenizer``, without
    transformers; a first load keeps one."""
    from packfeed.service.tokenize import snapshots

    local = os.path.isdir(name_or_path)
    if looks_local(name_or_path) and not local:
        what = "is a file" if os.path.exists(name_or_path) else "does not exist"
        raise ValueError(f"tokenizer {name_or_path!r} {what}: give the directory holding tokenizer.json "
                         "(e.g. service/assets/tokenizer) or a Hugging Face id")
    key = snapshots.directory_key(name_or_path) if snapshot and local else None
    kept = snapshots.load(name_or_path, key)
    if kept is not None:
        return SampleTokenizer(kept, **kwargs)
    unreachable = None if local else hub_unreachable(name_or_path)
    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(name_or_path, **({"local_files_only": True} if unreachable else {}))
    except Exception as e:  # transformers raises OSError, ValueError, JSONDecodeError, Exception...
        if unreachable:
            raise hub_unreachable_error("tokenizer", name_or_path, unreachable) from None
        detail = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
        raise ValueError(
            f"tokenizer {name_or_path!r}: cannot load it ({type(e).__name__}: {detail}); give a directory with a "
            "valid tokenizer.json (and tokenizer_config.json), or a Hugging Face id already in the local cache"
        ) from None
    if unreachable:
        logger.info("tokenizer %r: the Hugging Face Hub is unreachable (%s): loaded from the local cache",
                    name_or_path, unreachable)
    loaded = SampleTokenizer(tokenizer, **kwargs)
    if key is not None:
        from packfeed.service.tokenize.shipped import ShippedTokenizer

        snapshots.store(key, ShippedTokenizer.of(tokenizer))
    return loaded

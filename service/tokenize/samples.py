"""Tokenization: RawWindow -> TokenizedSamples (flat token ids, labels, sample offsets).

One ``SampleTokenizer`` per actor loads the tokenizer once; ``tokenize`` turns a window of
validated records (see records.py) into flat arrays, CSR style: sample i is
``tokens[offsets[i]:offsets[i+1]]``, its id ``sample_ids[i]``. Labels hold the token where the
loss trains it and IGNORE_INDEX elsewhere; the first token of each sample is NOT masked here
(the packer does that, see client/rows.py).

What is trained, by format and ``loss`` (the table), and how each format is encoded as one batch
and merged back in record order: format_groups.py. With ``add_eos`` an EOS is appended unless the
sample already ends with one; it is trained when the token before it is. A sample left with no
trained token after its first (e.g. no assistant turn) is skipped as ``no_trained_tokens``.

Encoders (encoders.py): the tokenizer's own Rust backend (``backend="hf"``) or quicktok's exact
byte-level BPE (``"fast"``, ~25x the HF single-core rate on code with Qwen2.5's vocabulary),
with identical ids and masks; ``"auto"`` (the default) takes the fast one only after proving it
on this tokenizer and on the first window's samples (backend.py).

Chat samples: a known template (the bundled ChatML, Qwen2.5), or one whose rendering is fixed
text around each content (chat_frames.py: ChatML written any way, Llama 3, Gemma...), renders
in Python (chat.py); with the fast encoder its conversations are tokenized straight from their
turns, without a rendered text (chat_tokens.py); any other template renders through Jinja,
1 + 2 * (assistant turns) renders per conversation when only assistant turns are trained.

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
from typing import Any

import numpy as np

from packfeed.client.offsets import offsets_of
from packfeed.client.rows import IGNORE_INDEX
from packfeed.service.data.config import LOSS_MODES
from packfeed.service.inputs.read import RawWindow
from packfeed.service.inputs.records import NO_TRAINED_TOKENS, Conversation, Preference, PromptCompletion, Skip
from packfeed.service.tokenize import snapshots
from packfeed.service.tokenize.chat import ChatRenderer, ChatTemplateError, locate_error, render_record
from packfeed.service.tokenize.fast.backend import BACKENDS, EncoderChoice
from packfeed.service.tokenize.fast.chat_tokens import TurnEncoder
from packfeed.service.tokenize.format_groups import (
    FormatGroup,
    merge_groups,
    rendered_group,
    standard_group,
    text_group,
    turns_group,
)
from packfeed.service.tokenize.hf_hub import hub_kwargs, hub_unreachable, hub_unreachable_error, looks_local
from packfeed.service.tokenize.masks import append_eos, has_trained_token_after_first
from packfeed.service.tokenize.pair_tokens import encode_pairs
from packfeed.service.tokenize.shipped import ShippedTokenizer

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
        """``backend_report`` once, after the back-end is chosen (for the run's stats); else None.
        Where a chat template is rendered through Jinja (not known by its text nor by what it
        renders: chat_frames.py), ``chat_template`` says why and how many samples so far."""
        report = self._encoders.take_report()
        if report is not None and self._chat is not None and self._chat.reasons:
            report["chat_template"] = {"rendered_by": "jinja", "reasons": sorted(set(self._chat.reasons.values())),
                                       "samples": self._chat.paths["jinja"]}
        return report

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
                text_group(encoder, records, text_pos, skipped),
                standard_group(encoder, records, std_pos, skipped, self.loss == "all"),
                self._encode_chat(encoder, raw, chat_pos, skipped),
            )
            if g is not None
        ]
        g = merge_groups(groups)
        positions, lengths, ids, trained = g.positions, g.lengths, g.ids, g.trained
        if self.add_eos:
            lengths, ids, trained = append_eos(lengths, ids, trained, self._eos)
        keep = has_trained_token_after_first(lengths, trained)
        if not keep.all():
            skipped += [(int(p), NO_TRAINED_TOKENS, "no token after the first is trained") for p in positions[~keep]]
            token_keep = np.repeat(keep, lengths)
            positions, lengths, ids, trained = positions[keep], lengths[keep], ids[token_keep], trained[token_keep]
        g = FormatGroup(positions, lengths, ids, trained)
        pairs = encode_pairs(encoder, raw, pair_pos, skipped, renderer=self._renderer, all_loss=self.loss == "all",
                             eos=self._eos if self.add_eos else None)  # their EOS: per segment
        if pairs is not None:
            g = merge_groups([g, FormatGroup(pairs.positions, pairs.lengths, pairs.ids, pairs.trained,
                                             pairs.chosen_lens, pairs.prompt_lens)])
        skips = self._skips(raw, skipped)
        labels = np.where(g.trained, g.ids, np.int32(IGNORE_INDEX)).astype(np.int32, copy=False)
        return TokenizedSamples(g.ids, labels, offsets_of(g.lengths), raw.sample_ids[g.positions], skips,
                                g.chosen_lens, g.prompt_lens)

    def _renderer(self) -> ChatRenderer:
        if self._chat is None:
            self._chat = ChatRenderer(self._tok, self.name, native=self._native_chat)
        return self._chat

    # ---- format groups (format_groups.py) -------------------------------------------------------
    def _encode_chat(self, encoder: Any, raw: RawWindow, pos: list[int], skipped: list) -> FormatGroup | None:
        if not pos:
            return None
        all_loss = self.loss == "all"
        if self._turns is None or self._turns[0] is not encoder:
            self._turns = (encoder, TurnEncoder.of(encoder))
        by_turns, pos = turns_group(self._turns[1], self._renderer, raw, pos, all_loss)
        by_text = rendered_group(encoder, self._renderer, raw, pos, skipped, all_loss) if pos else None
        groups = [g for g in (by_turns, by_text) if g is not None]
        return merge_groups(groups) if groups else None

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
        snapshots.store(key, ShippedTokenizer.of(tokenizer))
    return loaded

"""Choosing the encoder back-end of a tokenizer: ``hf``, ``fast``, or ``auto`` (fast if proven).

The fast back-end (``encoders.FastEncoder``, quicktok) is used only for a tokenizer it has
reproduced exactly. ``load_fast`` proves it in three steps, each refusing with a reason a
user can read:

1. **Shape** (microseconds): a byte-level BPE the fast path can mirror: BPE model without
   dropout, word prefixes/suffixes or byte fallback; no truncation or padding set on the
   backend; added tokens matched as plain strings (no lstrip / rstrip / single_word, not
   normalized under a normalizer); a post-processor that adds the same tokens around every
   text (none, ByteLevel without offset trimming, TemplateProcessing, or a Sequence of them).
   SentencePiece, WordPiece and Unigram tokenizers stop here.
2. **Import** (~2 s for a 150k vocabulary here): ``quicktok.import_tokenizer`` on the loaded
   backend's JSON; quicktok refuses normalizers other than NFC, pre-tokenizer patterns it
   has no scanner for, and fails if its own stress suite differs from ``tokenizers``.
3. **Stress** (~0.3 s): ``STRESS`` texts plus each added token inside text, against HF:
   ids with and without the post-processor's tokens, and the token under EVERY character edge
   for both edge rules the loss masks use.

``tokenize.SampleTokenizer`` then runs step 4 on its first window (a sample of the real
inputs through the whole tokenization, masks included, with both back-ends) before it trusts
the fast one. Under ``auto`` any refusal (or any error while loading quicktok) falls back to HF
(the actor notes why at DEBUG; the driver says each distinct choice once per run, from the
window stats: ``log_choices``); under ``fast`` it raises ``FastPathRefused``. The whole proof costs ~3 s per
packing actor on this machine, once. pack, serve and train run steps 1-3 on the driver too, before
Ray starts (``EncoderChoice.check_early``; ``fast`` at construction), so a tokenizer refused at load
is said before the actors start (the bundled demo tokenizer: in 3 ms; a 150k vocabulary that
passes costs the driver ~1.2 s).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import shutil
import tempfile
import time
from typing import Any, Callable

import numpy as np

from packfeed.client.offsets import starts_of
from packfeed.service.data.config import TOKENIZER_BACKENDS
from packfeed.service.tokenize.encoders import FastEncoder, HFEncoder
from packfeed.service.inputs.records import Conversation, Preference, PromptCompletion
from packfeed.service.inputs.read import RawWindow

logger = logging.getLogger(__name__)

BACKENDS = TOKENIZER_BACKENDS  # one list of choices, the config's
VERIFY_CHARS = 1 << 18  # characters of real samples tokenized twice in step 4 (~0.1-0.3 s)

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


class FastPathRefused(ValueError):
    """The fast back-end cannot reproduce this tokenizer; the message says why."""


class EncoderChoice:
    """The encoder of one ``SampleTokenizer``: fixed for ``hf``; for ``auto`` and ``fast``
    chosen by ``choose`` on the first window with samples (steps 1-4, module docstring).

    ``report``: {"requested", "backend", "reason", "checks": what was compared and its cost in
    seconds, "seconds": the whole choice}. ``probes`` gives extra stress texts (a rendered
    chat). ``fast`` runs steps 1-3 here, so a refusal comes before any data is read.
    """

    def __init__(self, backend: Any, requested: str, *, name: str, threads: int,
                 probes: Callable[[], list[str]] = list) -> None:  # fmt: skip
        self.hf = HFEncoder(backend)
        self.fast: FastEncoder | None = None
        self.encoder: Any = self.hf if requested == "hf" else None
        self.report: dict[str, Any] = {"tokenizer": name, "requested": requested}
        self._name, self._threads, self._probes, self._taken = name, threads, probes, False
        self._load_seconds = 0.0
        if requested == "hf":
            self.report.update(backend="hf", reason="requested")
        elif requested == "fast":
            try:
                self._load()
            except FastPathRefused as e:
                raise self._refused(e) from None

    @property
    def name(self) -> str:
        return "undecided" if self.encoder is None else self.encoder.name

    def take_report(self) -> dict[str, Any] | None:
        """``report`` the first time it is asked for after the choice; None otherwise."""
        if self.encoder is None or self._taken:
            return None
        self._taken = True
        return dict(self.report)

    def choose(self, raw: RawWindow, tokenize: Callable[[RawWindow, Any], Any]) -> Any:
        """Step 4 on ``raw``'s first samples, ``tokenize(window, encoder)`` giving the
        TokenizedSamples; sets and returns the encoder. Raises ``FastPathRefused`` under
        ``fast``; under ``auto`` logs the refusal once and returns the HF encoder."""
        started = time.perf_counter()
        loaded_before = self._load_seconds if self.fast is not None else 0.0  # under "fast", at construction
        try:
            if self.fast is None:
                self._load()
            sample = verification_sample(raw)
            t0 = time.perf_counter()
            reference = tokenize(sample, self.hf)
            try:
                candidate = tokenize(sample, self.fast)
            except Exception as e:  # a fault of the fast path is a refusal, not the data's error
                raise FastPathRefused(f"the fast back-end raised {type(e).__name__}: {e}") from None
            self.report["checks"].update(check_window(reference, candidate, sample))
            self.report["checks"]["sample_seconds"] = round(time.perf_counter() - t0, 3)
        except FastPathRefused as e:
            if self.report["requested"] == "fast":
                raise self._refused(e) from None
            # Said once per run by the driver (log_choices), not once per packing actor.
            logger.debug("tokenizer %r: using the HF back-end, the fast one was refused: %s", self._name, e)
            self.encoder, self.fast = self.hf, None
            self.report.update(backend="hf", reason=str(e))
        else:
            self.encoder = self.fast
            self.report.update(backend="fast", reason="verified")
        self.report["seconds"] = round(loaded_before + time.perf_counter() - started, 3)
        return self.encoder

    def check_early(self) -> str | None:
        """Under ``auto``, steps 1-3 now rather than at the first window (the driver calls it
        before Ray starts): a refusal decides HF at once and is logged here, its line
        remembered so that ``log_choices`` does not say it again when the packing actors
        report the same refusal. Returns that line; None when steps 1-3 passed (step 4 is
        still each actor's) or the back-end is not ``auto``."""
        if self.report["requested"] != "auto" or self.encoder is not None or self.fast is not None:
            return None
        try:
            self._load()
        except FastPathRefused as e:
            self.encoder = self.hf
            self.report.update(backend="hf", reason=str(e), seconds=round(self._load_seconds, 3))
            line = _choice_line(self.report)
            _SAID_EARLY.add(line)
            logger.info("%s", line)
            return line
        return None

    def _load(self) -> None:
        started = time.perf_counter()
        try:
            self.fast, self.report["checks"] = load_fast(self.hf.backend, threads=self._threads, texts=self._probes())
        except FastPathRefused:
            raise
        except Exception as e:  # quicktok itself failed: not the user's error under "auto"
            raise FastPathRefused(f"loading the fast back-end failed: {type(e).__name__}: {e}") from None
        finally:
            self._load_seconds = time.perf_counter() - started

    def _refused(self, e: Exception) -> FastPathRefused:
        return FastPathRefused(
            f"tokenizer {self._name!r}: the fast back-end cannot reproduce it: {e} (--tokenizer-backend auto or hf "
            "uses the Hugging Face tokenizer)"
        )


# Lines this process said before Ray started (EncoderChoice.check_early): the actors' reports
# of the same choice are not said again.
_SAID_EARLY: set[str] = set()


def log_choices(checks: list[dict[str, Any]], start: int) -> None:
    """Log the back-end choices ``checks[start:]`` (``EncoderChoice.report``s, as the packing
    actors send them in their window stats: a run's ``RunStats.tokenizer_checks``) that differ
    from every earlier one and from what the driver said before Ray (``check_early``): one
    line per run and choice, not one per actor."""
    said = {_choice_line(report) for report in checks[:start]} | _SAID_EARLY
    for report in checks[start:]:
        line = _choice_line(report)
        if line and line not in said:
            said.add(line)
            logger.info("%s", line)


def _choice_line(report: dict[str, Any]) -> str | None:
    if report.get("backend") == "hf" and report.get("requested") == "auto":
        return (f"tokenizer {report.get('tokenizer')!r}: the HF tokenizers back-end packs, the fast one was refused: "
                f"{report.get('reason')}")
    if report.get("backend") == "fast":
        return f"tokenizer {report.get('tokenizer')!r}: the fast back-end packs (identical rows, proven per actor)"
    return None


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


def load_fast(backend: Any, *, threads: int = 1, texts: list[str] = ()) -> tuple[FastEncoder, dict[str, Any]]:
    """Steps 1-3 (module docstring) on the HF ``backend`` (a ``tokenizers.Tokenizer``) and
    ``texts`` (extra probes, e.g. a rendered chat). Returns the encoder and what was checked;
    raises ``FastPathRefused``. Leaves no file behind."""
    started = time.perf_counter()
    try:
        import quicktok
    except ImportError:
        raise FastPathRefused("quicktok is not installed (pip install quicktok-v1)") from None
    spec = backend_spec(backend)
    reason = shape_refusal(spec)
    if reason:
        raise FastPathRefused(reason)
    spec_text = backend.to_str()
    workdir = tempfile.mkdtemp(prefix="packfeed-quicktok-")
    try:
        path = os.path.join(workdir, "tokenizer.json")
        with open(path, "w", encoding="utf-8") as f:
            f.write(spec_text)
        log = io.StringIO()
        try:
            with contextlib.redirect_stdout(log):
                quicktok.import_tokenizer(path, "packfeed", data_dir=workdir)
            quick = quicktok.Tokenizer("packfeed", workdir)
        except Exception as e:  # quicktok.importer.ImportRefused, or a file it could not read
            raise FastPathRefused(f"quicktok refused the import: {_first_reason(str(e))}") from None
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    imported = time.perf_counter()

    n_vocab = max(quick.n_vocab, backend.get_vocab_size(with_added_tokens=True))
    byte_lengths = np.zeros(n_vocab, dtype=np.int64)
    for i in range(quick.n_vocab):
        try:
            byte_lengths[i] = len(quick.decode_single_token_bytes(i))
        except KeyError:
            pass
    reference = HFEncoder(backend)
    prefix, suffix = _post_tokens(backend)
    added = {t["content"]: t["id"] for t in spec["added_tokens"]}
    encoder = FastEncoder(quick, reference, byte_lengths=byte_lengths, added=added, prefix=prefix, suffix=suffix,
                          nfc=(spec.get("normalizer") or {}).get("type") == "NFC", threads=threads)  # fmt: skip
    probes = stress_texts(spec, texts)
    checked = compare_encoders(reference, encoder, probes)
    return encoder, {
        "encoder": f"quicktok {getattr(quicktok, '__version__', '?')}",
        "threads": threads,
        "import_seconds": round(imported - started, 3),
        "stress_texts": len(probes),
        **checked,
        "stress_seconds": round(time.perf_counter() - imported, 3),
    }


def _first_reason(message: str) -> str:
    """quicktok's refusal in one line: "REFUSED: unrecognized pretokenizer pattern — ...
    pattern: X ..." -> "unrecognized pretokenizer pattern (pattern: X)"."""
    lines = [line.strip() for line in message.splitlines() if line.strip()] or [message]
    head = lines[0].removeprefix("REFUSED:").split(" — ")[0].strip()
    pattern = next((line for line in lines[1:] if line.startswith("pattern:")), None)
    return f"{head} ({pattern[:160]})" if pattern else head[:300]


def _post_tokens(backend: Any) -> tuple[list[int], list[int]]:
    """The ids the post-processor puts before and after a text (the same for every text,
    checked by ``compare_encoders``). Refuses a post-processor that changes the text's ids."""
    probe = "post processor probe"
    bare = backend.encode(probe, add_special_tokens=False).ids
    full = backend.encode(probe, add_special_tokens=True).ids
    for i in range(len(full) - len(bare) + 1):
        if full[i : i + len(bare)] == bare:
            return full[:i], full[i + len(bare) :]
    raise FastPathRefused("the post-processor changes the text's own tokens")


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


# ---- step 4: the first window, tokenized by both back-ends ------------------------------------
def verification_sample(raw: RawWindow, max_chars: int = VERIFY_CHARS) -> RawWindow:
    """The window's first samples, up to ``max_chars`` characters of content (at least one)."""
    total, n = 0, 0
    for record in raw.records:
        total += _record_chars(record)
        n += 1
        if total >= max_chars:
            break
    return RawWindow(raw.spec, raw.sample_ids[:n], raw.records[:n], [])


def _record_chars(record: Any) -> int:
    if type(record) is str:
        return len(record)
    if type(record) is PromptCompletion and type(record.prompt) is str:
        return len(record.prompt) + len(record.completion)
    if type(record) is Preference:
        parts = (record.prompt, record.chosen, record.rejected)
        if type(record.prompt) is str:
            return sum(map(len, parts))
        return sum(len(m.get("content") or "") + 16 for messages in parts for m in messages)
    messages = record.messages if type(record) is Conversation else record.prompt + record.completion
    return sum(len(m.get("content") or "") + 16 for m in messages)  # + the template's markup


def check_window(reference: Any, candidate: Any, sample: RawWindow) -> dict[str, int]:
    """Two TokenizedSamples of ``sample`` must be identical: sample ids, lengths, tokens,
    labels, and skips with their reasons and messages. Raises ``FastPathRefused`` naming the
    first sample that differs."""
    ref_skips = [(s.sample_id, s.reason, s.detail) for s in reference.skips]
    got_skips = [(s.sample_id, s.reason, s.detail) for s in candidate.skips]
    if ref_skips != got_skips:
        raise FastPathRefused(f"skips differ on the first window's samples: HF {ref_skips[:2]}, fast {got_skips[:2]}")
    if not np.array_equal(reference.sample_ids, candidate.sample_ids):
        raise FastPathRefused("the fast back-end kept other samples than HF")
    for field in ("pair_chosen_lens", "pair_prompt_lens"):
        a, b = getattr(reference, field), getattr(candidate, field)
        if (a is None) != (b is None) or (a is not None and not np.array_equal(a, b)):
            raise FastPathRefused(f"{field} of the preference pairs differ from HF")
    for i, sid in enumerate(reference.sample_ids.tolist()):
        a0, a1 = reference.offsets[i], reference.offsets[i + 1]
        b0, b1 = candidate.offsets[i], candidate.offsets[i + 1]
        for field in ("tokens", "labels"):
            a, b = getattr(reference, field)[a0:a1], getattr(candidate, field)[b0:b1]
            if not np.array_equal(a, b):
                at = int(np.argmax(a[: len(b)] != b[: len(a)])) if len(a) == len(b) else min(len(a), len(b))
                source, row = sample.spec.locate(sid)
                raise FastPathRefused(
                    f"{field} differ from HF on {source} row {row} (sample {sid}) at token {at}: "
                    f"HF {a[at:at + 4].tolist()}, fast {b[at:at + 4].tolist()}"
                )
    return {"sample_records": len(sample.records), "sample_tokens": int(len(reference.tokens))}

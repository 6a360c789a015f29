"""Choosing the encoder back-end of a tokenizer: ``hf``, ``fast``, or ``auto`` (fast if proven).

The fast back-end (``fast.encoder.FastEncoder``, quicktok) is used only for a tokenizer it has
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
   has no scanner for, and fails if its own stress suite differs from ``tokenizers``. Its
   files are cached on local disk by the backend's JSON (quick_cache.py): a tokenizer
   imported once on a machine is not imported again.
3. **Stress** (~0.3-0.7 s): ``STRESS`` texts plus each added token inside text, against HF:
   ids with and without the post-processor's tokens, and the token under EVERY character edge
   for both edge rules the loss masks use. (Steps 1 and 3 are fast_checks.py.) Its pass is
   kept on local disk too, keyed by every input and packfeed's check code: the same
   tokenizer, templates and code pass again without the comparison.

``tokenize.SampleTokenizer`` then runs step 4 on its first window (a sample of the real
inputs through the whole tokenization, masks included, with both back-ends) before it trusts
the fast one. Under ``auto`` any refusal (or any error while loading quicktok) falls back to HF
(the actor notes why at DEBUG; the driver says each distinct choice once per run, from the
window stats: ``log_choices``); under ``fast`` it raises ``FastPathRefused``. pack, serve and
train run steps 1-3 on the driver, before Ray starts (``EncoderChoice.check_early``; ``fast`` at
construction), so a tokenizer refused at load is said before the actors start (the bundled demo
tokenizer: in 3 ms; a 150k vocabulary that passes costs the driver ~1.2 s), and ship their
outcome to the packing actors (``EncoderChoice.proof``, ``FastProof``, shipped.py): an actor
then rebuilds the fast encoder from quicktok's files in milliseconds rather than ~2.5 s, and
runs step 4 alone. A tokenizer an actor loads by name (no proof) runs all four steps there.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from packfeed.service.data.config import TOKENIZER_BACKENDS
from packfeed.service.tokenize.fast import quick_cache
from packfeed.service.tokenize.encoders import HFEncoder
from packfeed.service.tokenize.fast.encoder import FastEncoder
from packfeed.service.tokenize.fast.checks import (
    FastPathRefused,
    backend_spec,
    compare_encoders,
    shape_refusal,
    stress_texts,
)
from packfeed.service.inputs.records import Conversation, Preference, PromptCompletion
from packfeed.service.inputs.read import RawWindow

logger = logging.getLogger(__name__)

BACKENDS = TOKENIZER_BACKENDS  # one list of choices, the config's
QUICKTOK_NAME = "packfeed"  # the name quicktok's files carry
VERIFY_CHARS = 1 << 18  # characters of real samples tokenized twice in step 4 (~0.1-0.3 s)

@dataclass(frozen=True)
class FastProof:
    """Steps 1-3 as one process ran them on a backend, for the packing actors that get the same
    backend (``ShippedTokenizer``): quicktok's imported files and what was checked, or why the
    fast back-end was refused. An actor then skips quicktok's import and the stress texts (~2 s
    for a 150k vocabulary); step 4 still runs in every actor, on its own first window."""

    files: dict | None = None  # file name -> bytes (``load_fast``)
    checks: dict | None = None
    refused: str | None = None
    # The encoder built from ``files`` in the process that proved them; not pickled: another
    # SampleTokenizer of that process (the driver's head start) reuses it instead of loading
    # quicktok's files again (~0.25 s for a 150k vocabulary).
    loaded: Any = field(default=None, compare=False, repr=False)

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "loaded"}

    def __setstate__(self, state: dict) -> None:
        for k, v in {**state, "loaded": None}.items():
            object.__setattr__(self, k, v)


class EncoderChoice:
    """The encoder of one ``SampleTokenizer``: fixed for ``hf``; for ``auto`` and ``fast``
    chosen by ``choose`` on the first window with samples (steps 1-4, module docstring).

    ``report``: {"requested", "backend", "reason", "checks": what was compared and its cost in
    seconds, "seconds": the whole choice}. ``probes`` gives extra stress texts (a rendered
    chat). ``fast`` runs steps 1-3 here, so a refusal comes before any data is read.
    """

    def __init__(self, backend: Any, requested: str, *, name: str, threads: int,
                 probes: Callable[[], list[str]] = list, proof: FastProof | None = None) -> None:  # fmt: skip
        self.hf = HFEncoder(backend)
        self.fast: FastEncoder | None = None
        self._proof = proof  # steps 1-3 as another process ran them on this backend (``proof()``)
        self._files: dict | None = None  # quicktok's files, when steps 1-3 ran or were taken from a proof
        self.encoder: Any = self.hf if requested == "hf" else None
        self.report: dict[str, Any] = {"tokenizer": name, "requested": requested}
        self._name, self._threads, self._probes, self._taken = name, threads, probes, False
        self._refusal: str | None = None  # why steps 1-3 refused the fast back-end
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
        """Steps 1-3, or their outcome taken from ``proof`` (the driver's, for this backend)."""
        started = time.perf_counter()
        try:
            if self._proof is not None:
                if self._proof.refused is not None:
                    raise FastPathRefused(self._proof.refused)
                if self._proof.loaded is not None:  # proven in this process: its encoder, rebound
                    self.fast = self._proof.loaded.rebound(self.hf, threads=self._threads)
                else:
                    self.fast = encoder_from_files(self.hf.backend, self._proof.files, threads=self._threads)
                self._files = self._proof.files
                self.report["checks"] = {**self._proof.checks, "threads": self._threads,
                                         "steps_1_3": "proven by the driver"}
            else:
                self.fast, self.report["checks"], self._files = load_fast(
                    self.hf.backend, threads=self._threads, texts=self._probes())
        except FastPathRefused as e:
            self._refusal = str(e)
            raise
        except Exception as e:  # quicktok itself failed: not the user's error under "auto"
            self._refusal = f"loading the fast back-end failed: {type(e).__name__}: {e}"
            raise FastPathRefused(self._refusal) from None
        finally:
            self._load_seconds = time.perf_counter() - started

    def proof(self) -> FastProof | None:
        """What steps 1-3 decided here, for processes that get this backend as it is
        (``ShippedTokenizer``): quicktok's files and the checks, or the refusal. None when
        they have not run (``hf``, or ``auto`` before ``check_early``)."""
        if self._files is not None and self.fast is not None:
            checks = {k: v for k, v in self.report["checks"].items() if not k.startswith("sample_")}
            return FastProof(files=self._files, checks=checks, loaded=self.fast)
        if self._refusal is not None:
            return FastProof(refused=self._refusal)
        return None

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
    said = {line for report in checks[:start] for line in _lines(report)} | _SAID_EARLY
    for report in checks[start:]:
        for line in _lines(report):
            if line not in said:
                said.add(line)
                logger.info("%s", line)


def _lines(report: dict[str, Any]) -> list[str]:
    """The back-end choice's line and, where a chat template is rendered through Jinja, why."""
    chat = report.get("chat_template") or {}
    lines = [f"tokenizer {report.get('tokenizer')!r}: its chat template is rendered through Jinja per sample: {reason}"
             for reason in chat.get("reasons", ())]
    choice = _choice_line(report)
    return ([choice] if choice else []) + lines


def _choice_line(report: dict[str, Any]) -> str | None:
    if report.get("backend") == "hf" and report.get("requested") == "auto":
        return (f"tokenizer {report.get('tokenizer')!r}: the HF tokenizers back-end packs, the fast one was refused: "
                f"{report.get('reason')}")
    if report.get("backend") == "fast":
        return f"tokenizer {report.get('tokenizer')!r}: the fast back-end packs (identical rows, proven by each packing process)"
    return None


def load_fast(backend: Any, *, threads: int = 1, texts: list[str] = (),
              cache: bool = True) -> tuple[FastEncoder, dict[str, Any], dict]:
    """Steps 1-3 (module docstring) on the HF ``backend`` (a ``tokenizers.Tokenizer``) and
    ``texts`` (extra probes, e.g. a rendered chat). Returns the encoder, what was checked, and
    quicktok's imported files (name -> bytes: what ``encoder_from_files`` rebuilds the encoder
    from in another process, without steps 2-3); raises ``FastPathRefused``. Step 2 takes
    quicktok's files from the local cache when this backend was imported before (``cache``,
    quick_cache.py); step 3 passes at once when it passed before on the very same inputs and
    code (``quick_cache.verdict_entry``); step 1 runs every time. Leaves no file behind but the
    cache's."""
    started = time.perf_counter()
    try:
        import quicktok
    except ImportError:
        raise FastPathRefused("quicktok is not installed (pip install quicktok-v1)") from None
    spec = backend_spec(backend)
    reason = shape_refusal(spec)
    if reason:
        raise FastPathRefused(reason)
    text, version = backend.to_str(), getattr(quicktok, "__version__", "?")
    files = quick_cache.load(text, version) if cache else None
    cached = files is not None
    if not cached:
        files = _import_quicktok(quicktok, text)
        quick_cache.store(text, version, files)
    imported = time.perf_counter()
    try:
        encoder = encoder_from_files(backend, files, threads=threads, spec=spec)
        probes = stress_texts(spec, texts)
        verdict = quick_cache.verdict_entry(text, version, files, probes, threads)
        checked = quick_cache.load_verdict(verdict)
        stress = "passed before" if checked is not None else "run"
        if checked is None:
            checked = compare_encoders(encoder.reference, encoder, probes)
            quick_cache.store_verdict(verdict, checked)
    except FastPathRefused:
        if not cached:
            raise
        quick_cache.forget(text, version)  # a damaged or stale entry: import again, without it
        return load_fast(backend, threads=threads, texts=texts, cache=False)
    return encoder, {
        "encoder": f"quicktok {version}",
        "threads": threads,
        "import": "cached" if cached else "imported",
        "import_seconds": round(imported - started, 3),
        "stress_texts": len(probes),
        "stress": stress,
        **checked,
        "stress_seconds": round(time.perf_counter() - imported, 3),
    }, files


def _import_quicktok(quicktok: Any, backend_json: str) -> dict[str, bytes]:
    """Step 2: quicktok's import of the backend's JSON (its own checks included); its files."""
    with tempfile.TemporaryDirectory(prefix="packfeed-quicktok-") as workdir:
        path = os.path.join(workdir, "tokenizer.json")
        with open(path, "w", encoding="utf-8") as f:
            f.write(backend_json)
        log = io.StringIO()
        try:
            with contextlib.redirect_stdout(log):
                quicktok.import_tokenizer(path, QUICKTOK_NAME, data_dir=workdir)
        except Exception as e:  # quicktok.importer.ImportRefused, or a file it could not read
            raise FastPathRefused(f"quicktok refused the import: {_first_reason(str(e))}") from None
        os.remove(path)
        return {name: open(os.path.join(workdir, name), "rb").read() for name in os.listdir(workdir)}


def encoder_from_files(backend: Any, files: dict, *, threads: int = 1, spec: dict | None = None) -> FastEncoder:
    """The FastEncoder of ``backend`` from quicktok's files for it (``load_fast``'s third
    result): milliseconds, where importing takes ~2 s for a 150k vocabulary. Proves nothing:
    the caller holds the proof that these files reproduce this backend."""
    import quicktok

    try:
        with tempfile.TemporaryDirectory(prefix="packfeed-quicktok-") as workdir:
            for name, data in files.items():
                with open(os.path.join(workdir, name), "wb") as f:
                    f.write(data)
            quick = quicktok.Tokenizer(QUICKTOK_NAME, workdir)
    except Exception as e:  # a file it could not read
        raise FastPathRefused(f"quicktok could not load its files: {_first_reason(str(e))}") from None
    spec = spec if spec is not None else backend_spec(backend)
    n_vocab = max(quick.n_vocab, backend.get_vocab_size(with_added_tokens=True))
    byte_lengths = np.zeros(n_vocab, dtype=np.int64)
    for i in range(quick.n_vocab):
        try:
            byte_lengths[i] = len(quick.decode_single_token_bytes(i))
        except KeyError:
            pass
    prefix, suffix = _post_tokens(backend)
    added = {t["content"]: t["id"] for t in spec["added_tokens"]}
    return FastEncoder(quick, HFEncoder(backend), byte_lengths=byte_lengths, added=added, prefix=prefix,
                       suffix=suffix, nfc=(spec.get("normalizer") or {}).get("type") == "NFC",
                       threads=threads)  # fmt: skip


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
    for column in ("pair_chosen_lens", "pair_prompt_lens"):
        a, b = getattr(reference, column), getattr(candidate, column)
        if (a is None) != (b is None) or (a is not None and not np.array_equal(a, b)):
            raise FastPathRefused(f"{column} of the preference pairs differ from HF")
    for i, sid in enumerate(reference.sample_ids.tolist()):
        a0, a1 = reference.offsets[i], reference.offsets[i + 1]
        b0, b1 = candidate.offsets[i], candidate.offsets[i + 1]
        for column in ("tokens", "labels"):
            a, b = getattr(reference, column)[a0:a1], getattr(candidate, column)[b0:b1]
            if not np.array_equal(a, b):
                at = int(np.argmax(a[: len(b)] != b[: len(a)])) if len(a) == len(b) else min(len(a), len(b))
                source, row = sample.spec.locate(sid)
                raise FastPathRefused(
                    f"{column} differ from HF on {source} row {row} (sample {sid}) at token {at}: "
                    f"HF {a[at:at + 4].tolist()}, fast {b[at:at + 4].tolist()}"
                )
    return {"sample_records": len(sample.records), "sample_tokens": int(len(reference.tokens))}

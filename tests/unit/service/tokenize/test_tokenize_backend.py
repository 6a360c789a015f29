"""The fast tokenizer back-end gives the HF back-end's rows exactly, or is not used.

Same rows: on the bundled corpus and on sweeps that put loss-mask edges where byte-level BPE
is hardest (inside a pre-token, inside a character split over several byte tokens, next to a
special token, in text an NFC normalizer changes), the fast back-end's tokens, labels and skips
equal the HF back-end's, with the real Qwen2.5 tokenizer (built in-process from the quicktok-v1
wheel) and with the bundled demo tokenizer, which the fast back-end must accept. Refusals: tokenizers the fast path cannot mirror fall back to HF under ``auto`` with one
log line saying why, and raise under ``fast``."""

from __future__ import annotations

import argparse
import dataclasses
import logging

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_tokenize import check_invariants, window
from support.tokenizers import (
    gpt2_regex_tokenizer,
    merge_order_trap,
    qwen_tokenizer_dir,
    sample,
    small_bpe,
    transformers_tokenizer,
    word_tokenizer,
)

from packfeed.client.rows import IGNORE_INDEX
from packfeed.service.assets import demo_corpus_paths, demo_tokenizer_path
from packfeed.service.commands.args import add_data_arguments, data_config_from_args
from packfeed.service.data.config import DataConfig
from packfeed.service.tokenize.encoders import HFEncoder
from packfeed.service.tokenize.fast.encoder import FastEncoder
from packfeed.service.inputs.records import Conversation, PromptCompletion
from packfeed.service.data.plan import build_plan
from packfeed.service.inputs.read import read_window
from packfeed.service.tokenize.samples import SampleTokenizer, TokenizedSamples
from packfeed.service.tokenize.fast.backend import FastPathRefused, load_fast, verification_sample
from packfeed.service.pipeline.window import process_window

SPLIT_CHARS = "🦩🪿龘ꙮ𓀀"  # each is two or three byte tokens in Qwen's vocabulary


@pytest.fixture(scope="module")
def qwen_tok(tmp_path_factory):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(qwen_tokenizer_dir(str(tmp_path_factory.mktemp("qwen"))))


@pytest.fixture(scope="module")
def hf(qwen_tok):
    return SampleTokenizer(qwen_tok, backend="hf")


@pytest.fixture(scope="module")
def fast(qwen_tok):
    return SampleTokenizer(qwen_tok, backend="fast", num_threads=1)


def both(hf: SampleTokenizer, fast: SampleTokenizer, records, loss: str = "auto") -> TokenizedSamples:
    """Tokenize ``records`` with both back-ends (``loss`` for both); assert identical; return one."""
    hf.loss = fast.loss = loss
    try:
        a = hf.tokenize(window(records))
        b = fast.tokenize(window(records))
    finally:
        hf.loss = fast.loss = "auto"
    assert fast.backend == "fast" and hf.backend == "hf"
    assert_identical(a, b)
    return a


def assert_identical(a: TokenizedSamples, b: TokenizedSamples) -> None:
    check_invariants(a)
    for name in ("tokens", "labels", "offsets", "sample_ids"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert a.skips == b.skips


def trained_text(tok, out: TokenizedSamples, i: int) -> str:
    tokens, labels = sample(out, i)
    return tok.decode(labels[labels != IGNORE_INDEX])


# ---- the same rows ---------------------------------------------------------------------------
@pytest.mark.parametrize("tokenizer", ["qwen", "bundled"])
@pytest.mark.parametrize("loss", ["auto", "all"])
def test_bundled_corpus_packs_to_identical_rows(request, tokenizer, loss):
    """With Qwen2.5 and with the bundled demo tokenizer (the quick start's: built so that the
    fast back-end accepts it, issue 25)."""
    from transformers import AutoTokenizer

    if tokenizer == "qwen":
        tok = request.getfixturevalue("qwen_tok")
    else:
        tok = AutoTokenizer.from_pretrained(demo_tokenizer_path())
    config = DataConfig.from_inputs(demo_corpus_paths(), tokenizer=tokenizer, seq_len=1024, loss=loss, window_samples=2048)
    plan = build_plan(config)
    hf = SampleTokenizer(tok, backend="hf", loss=loss)
    fast = SampleTokenizer(tok, backend="auto", loss=loss, num_threads=1)
    specs = [plan.window(k) for k in range(plan.num_windows)]
    kinds = set()
    for spec in specs:
        kinds |= {type(r).__name__ for r in read_window(spec).records}
        a, stats_a = process_window(spec, {loss: hf}, config, plan)
        b, stats_b = process_window(spec, {loss: fast}, config, plan)
        for column in ("input_ids", "labels", "position_ids", "seq_lens", "sample_ids"):
            assert np.array_equal(getattr(a, column), getattr(b, column)), (spec.index, column)
        assert stats_a.tokenizer_backends == {"hf": 1} and stats_b.tokenizer_backends == {"fast": 1}
        assert dataclasses.replace(stats_a, tokenizer_backends=None, tokenizer_checks=None) == dataclasses.replace(
            stats_b, tokenizer_backends=None, tokenizer_checks=None)
    assert fast.backend == "fast" and fast.backend_report["reason"] == "verified"
    assert kinds == {"str", "PromptCompletion", "Conversation"} and len(specs) > 1
    if loss == "auto":
        assert 0 < (a.labels != IGNORE_INDEX).sum() < a.num_real_tokens  # masks are not all-or-nothing


def test_the_bundled_assets_are_what_the_build_script_writes(tmp_path):
    """service/assets/build.py is deterministic and the committed corpus and tokenizer are its
    output, byte for byte: a change to the build (such as the pre-tokenizer that made the
    tokenizer one the fast back-end accepts) ships with its rebuilt assets."""
    from pathlib import Path

    from packfeed.service.assets import build

    build.main(tmp_path)
    bundled = Path(demo_tokenizer_path()).parent
    written = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    assert len(written) == 6 and {p.parts[0] for p in written} == {"corpus", "tokenizer"}
    for path in written:
        assert (tmp_path / path).read_bytes() == (bundled / path).read_bytes(), path


# Edges a reader can check: the token that holds the completion's first character is trained,
# even when it starts in the prompt (as on the HF path: "from the first token that ends inside").
EDGES = [
    pytest.param("The capital of France is", " Paris.", " Paris.<|endoftext|>", id="leading-space"),
    pytest.param("The capital of France is P", "aris.", " Paris.<|endoftext|>", id="edge-inside-a-token"),
    pytest.param("The capital of France is", "Paris.", "Paris.<|endoftext|>", id="no-space-starts-a-token"),
    pytest.param("naïv", "e", "ve<|endoftext|>", id="inside-a-token-after-a-two-byte-character"),
    pytest.param("日本", "語です", "語です<|endoftext|>", id="cjk"),
    pytest.param("x = 12", "34", "34<|endoftext|>", id="digits-one-per-token"),
    # " 🦩" is [" \xf0\x9f", "\xa6", "\xa9"]: the first piece holds the prompt's space too
    pytest.param("flamingo: ", "🦩 pink", " 🦩 pink<|endoftext|>", id="split-character-after-the-edge"),
    pytest.param("flamingo 🦩", "!", "!<|endoftext|>", id="split-character-before-the-edge"),
    # NFC folds the mark into the prompt's "é": no token holds it, the next one is trained
    pytest.param("cafe", "\u0301 au lait", " au lait<|endoftext|>", id="combining-mark-not-nfc"),
    pytest.param("<|im_start|>user", "<|im_end|>", "<|im_end|><|endoftext|>", id="special-token-at-the-edge"),
    pytest.param("a <|im_", "end|> b", "<|im_end|> b<|endoftext|>", id="special-token-across-the-edge"),
]  # fmt: skip


@pytest.mark.parametrize("prompt, completion, expected", EDGES)
def test_prompt_completion_edges(hf, fast, qwen_tok, prompt, completion, expected):
    out = both(hf, fast, [PromptCompletion(prompt, completion)])
    assert trained_text(qwen_tok, out, 0) == expected


ALPHABET = "ab Zé日本 \n\t.,'!0123" + SPLIT_CHARS + "\u0301\u00a0"
pieces = st.lists(st.sampled_from([*ALPHABET, "<|im_end|>", "<|endoftext|>", "'s", "\r\n", "  "]), max_size=12).map("".join)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pairs=st.lists(st.tuples(pieces, pieces.filter(lambda s: s.strip())), min_size=1, max_size=8),
       loss=st.sampled_from(["auto", "completion", "all"]))  # fmt: skip
def test_random_prompt_completion_edges(hf, fast, pairs, loss):
    both(hf, fast, [PromptCompletion(p, c) for p, c in pairs], loss)


contents = st.lists(st.sampled_from([*ALPHABET, "<|im_start|>", "<tool_call>", " hi", "\n\n"]), max_size=10).map("".join)


@st.composite
def conversations(draw):
    messages = [{"role": "system", "content": draw(contents)}] if draw(st.booleans()) else []
    for _ in range(draw(st.integers(1, 3))):
        messages += [{"role": "user", "content": draw(contents)}, {"role": "assistant", "content": draw(contents)}]
    return messages


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(convs=st.lists(conversations(), min_size=1, max_size=5), conversational_pc=st.booleans())
def test_random_conversations_identical_masks(hf, fast, convs, conversational_pc):
    records = [Conversation(m) for m in convs]
    if conversational_pc:
        records += [PromptCompletion(m[:-1], m[-1:]) for m in convs]
    both(hf, fast, records)


def test_generation_markers_with_empty_and_split_spans(qwen_tok, tmp_path):
    """{% generation %} spans come from the template; an empty one sends HF to its offsets rule
    for the whole conversation, where a span ending in a split character keeps its last piece."""
    from transformers import AutoTokenizer

    qwen_tok.save_pretrained(tmp_path)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    tok.chat_template = (
        "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' }}{% if m['role'] == 'assistant' %}"
        "{% generation %}{{ m['content'] }}{% endgeneration %}{% else %}{{ m['content'] }}{% endif %}"
        "{{ '<|im_end|>\\n' }}{% endfor %}"
    )
    user = {"role": "user", "content": "bird?"}
    bird = {"role": "assistant", "content": "a 🦩"}
    records = [Conversation([user, bird]), Conversation([user, bird, user, {"role": "assistant", "content": ""}])]
    out = both(SampleTokenizer(tok, backend="hf"), SampleTokenizer(tok, backend="fast", num_threads=1), records)
    # normal rule: the span's last character is held by its first byte token; offsets rule: all of it
    assert trained_text(tok, out, 0) == "a \ufffd"
    assert trained_text(tok, out, 1) == "a 🦩"


def test_fast_edges_equal_hf_at_every_character(qwen_tok):
    """Both edge rules, every character and every span of short texts, against HF directly."""
    backend = qwen_tok.backend_tokenizer
    fast, _, _ = load_fast(backend, threads=1)
    reference = HFEncoder(backend)
    texts = ["a 🦩b龘 c", "x<|im_end|>\n🪿's", "e\u0301 naïve 日本語", "  \n\tword𓀀"]
    for special in (False, True):
        ref, got = (e.encode(texts, special=special, edges=True) for e in (reference, fast))
        assert np.array_equal(ref.ids, got.ids)
        for c in range(max(map(len, texts)) + 1):
            chars = [min(c, len(t)) for t in texts]
            assert ref.first_tokens(chars).tolist() == got.first_tokens(chars).tolist(), c
    ref, got = (e.encode(texts, special=False, edges=True) for e in (reference, fast))
    for lo in range(max(map(len, texts))):
        for hi in range(lo, max(map(len, texts)) + 1):
            spans = [[(min(lo, len(t)), min(hi, len(t)))] for t in texts]
            assert ref.span_tokens(spans) == got.span_tokens(spans), (lo, hi)
    assert fast.texts_by_reference > 0  # the non-NFC text took the HF path for its edges


@pytest.mark.parametrize("odd_at", [(0,), (4,), (0, 1), (2, 3), (0, 4), (0, 1, 2, 3, 4)])
def test_texts_the_normalizer_changes_answer_like_hf_wherever_they_are(qwen_tok, odd_at):
    """Texts NFC would change keep quicktok's ids (HF's); their edges map through NFC where it
    keeps the character alone, and come from HF's encoding of that text (once) where it
    composes it (the "e" of "cafe\u0301"), at the batch's start, end, side by side, all of them."""
    backend = qwen_tok.backend_tokenizer
    fast, _, _ = load_fast(backend, threads=1)
    reference = HFEncoder(backend)
    texts = [f"cafe\u0301 {k} 🪿 e\u0301" if k in odd_at else f"naïve {k} 🦩 word" for k in range(5)]
    for special in (False, True):
        fast.texts_by_reference = 0
        ref, got = (e.encode(texts, special=special, edges=True) for e in (reference, fast))
        assert got.lengths.tolist() == ref.lengths.tolist() and np.array_equal(got.ids, ref.ids)
        spans = [[(0, 2), (5, 9)] for _ in texts]  # edges NFC keeps: no text needs HF
        assert got.span_tokens(spans) == ref.span_tokens(spans)
        assert got.first_tokens([5] * len(texts)).tolist() == ref.first_tokens([5] * len(texts)).tolist()
        assert fast.texts_by_reference == 0
        for c in range(max(map(len, texts)) + 1):
            chars = [min(c, len(t)) for t in texts]
            assert got.first_tokens(chars).tolist() == ref.first_tokens(chars).tolist(), c
        assert fast.texts_by_reference == len(odd_at)  # character 3 is composed: HF's answer, asked once
        spans = [[(0, 4), (5, len(t))] for t in texts]
        assert got.span_tokens(spans) == ref.span_tokens(spans)


# ---- bad input -------------------------------------------------------------------------------
def test_text_the_tokenizer_refuses_is_the_same_skip_under_both(hf, fast):
    records = [
        "fine text",
        "lone \ud800 surrogate",
        PromptCompletion("prompt", " bad \udfff completion"),
        Conversation([{"role": "user", "content": "\ud800"}, {"role": "assistant", "content": "ok"}]),
        PromptCompletion("good", " completion"),
    ]
    out = both(hf, fast, records)
    assert [(s.sample_id, s.reason) for s in out.skips] == [(1, "tokenizer_error"), (2, "tokenizer_error"),
                                                             (3, "tokenizer_error")]  # fmt: skip
    assert list(out.sample_ids) == [0, 4]


# ---- the choice, the proof, the refusals -------------------------------------------------------
@pytest.mark.parametrize("single, first", [("<s> $A", "<s>"), ("$A </s>", "The"), ("<s> $A </s>", "<s>")])
def test_post_processor_tokens_are_reproduced(single, first):
    from tokenizers import processors

    post = processors.TemplateProcessing(single=single, special_tokens=[("<s>", 2000), ("</s>", 2001)])
    tok = transformers_tokenizer(small_bpe(post_processor=post))
    records = ["The cat sat.", PromptCompletion("The dog", " ran off."), PromptCompletion("x", "y</s>")]
    fast = SampleTokenizer(tok, backend="fast", num_threads=1)
    out = both(SampleTokenizer(tok, backend="hf"), fast, records, "auto")
    assert tok.convert_ids_to_tokens(int(sample(out, 0)[0][0])) == first
    assert sample(out, 0)[0][-1] == tok.eos_token_id and trained_text(tok, out, 1).startswith(" ran")


def refused_tokenizers():
    from tokenizers import AddedToken, normalizers, processors

    lowercase = small_bpe()
    lowercase.normalizer = normalizers.Lowercase()
    stripping = small_bpe()
    stripping.add_special_tokens([AddedToken("<sep>", lstrip=True, special=True)])
    trimming = small_bpe(post_processor=processors.ByteLevel(trim_offsets=True))
    return [
        pytest.param(lambda: transformers_tokenizer(small_bpe(pattern=r"\w+|\s+|[^\w\s]+")), "unrecognized pretokenizer pattern",
                     id="pattern-without-a-scanner"),
        pytest.param(lambda: transformers_tokenizer(lowercase), "unsupported normalizer", id="lowercase-normalizer"),
        pytest.param(lambda: transformers_tokenizer(stripping), "'<sep>' sets lstrip", id="added-token-lstrip"),
        pytest.param(lambda: transformers_tokenizer(trimming), "trims offsets", id="offset-trimming-post-processor"),
        pytest.param(lambda: word_tokenizer("chatml"), "model type 'WordLevel'", id="word-level-model"),
        pytest.param(gpt2_regex_tokenizer, "unrecognized pretokenizer pattern (pattern: GPT2_BYTELEVEL_DEFAULT)",
                     id="gpt2-default-regex"),
    ]  # fmt: skip


@pytest.mark.parametrize("make, reason", refused_tokenizers())
def test_refused_tokenizer_falls_back_under_auto_and_raises_under_fast(make, reason, caplog):
    tok = make()
    records = ["The cat sat.", PromptCompletion("The dog", " ran off.")]
    with pytest.raises(FastPathRefused, match=reason.replace("(", r"\(").replace(")", r"\)")):
        SampleTokenizer(tok, backend="fast")
    auto = SampleTokenizer(tok, backend="auto")
    assert auto.backend == "undecided"
    with caplog.at_level(logging.DEBUG, logger="packfeed.service.tokenize.fast.backend"):
        for _ in range(3):
            assert_identical(SampleTokenizer(tok, backend="hf").tokenize(window(records)), auto.tokenize(window(records)))
    assert auto.backend == "hf" and reason in auto.backend_report["reason"]
    warnings = fallback_lines(caplog)
    assert len(warnings) == 1 and "using the HF back-end" in warnings[0] and reason in warnings[0]


def fallback_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "packfeed.service.tokenize.fast.backend"]


def test_a_difference_only_the_data_shows_falls_back_at_the_first_window(caplog):
    tok = merge_order_trap()
    records = ["plain text first", "then qzx appears"]
    fast = SampleTokenizer(tok, backend="fast")  # shape, import and stress checks pass
    assert fast.backend_report["checks"]["stress_edges"] > 0
    with pytest.raises(FastPathRefused, match=r"tokens differ from HF on mem\.jsonl row 1 \(sample 1\) at token 5"):
        fast.tokenize(window(records))
    auto = SampleTokenizer(tok)
    with caplog.at_level(logging.DEBUG, logger="packfeed.service.tokenize.fast.backend"):
        out = auto.tokenize(window(records))
    assert auto.backend == "hf" and "row 1 (sample 1)" in auto.backend_report["reason"]
    assert_identical(SampleTokenizer(tok, backend="hf").tokenize(window(records)), out)
    assert len(fallback_lines(caplog)) == 1


def test_auto_proves_the_fast_path_on_the_first_window_and_reports_it(qwen_tok):
    auto = SampleTokenizer(qwen_tok, num_threads=2)
    assert auto.backend == "undecided" and auto.take_backend_report() is None
    auto.tokenize(window([]))  # no samples: nothing proven yet
    assert auto.backend == "undecided"
    records = [f"document {i}: caf\u00e9 🦩" for i in range(50)] + [PromptCompletion("q", " a")]
    out = auto.tokenize(window(records))
    report = auto.take_backend_report()
    assert report["requested"] == "auto" and report["backend"] == "fast" and report["reason"] == "verified"
    checks = report["checks"]
    assert checks["threads"] == 2 and checks["sample_records"] == 51 and checks["sample_tokens"] == len(out.tokens)
    assert checks["stress_texts"] > 40 and checks["stress_edges"] > 10_000 and report["seconds"] > 0
    assert auto.take_backend_report() is None  # once per actor


def test_verification_sample_is_bounded_and_never_empty():
    texts = ["x" * 1000] * 10
    assert len(verification_sample(window(texts), max_chars=2500)) == 3
    assert len(verification_sample(window(texts), max_chars=1)) == 1
    assert len(verification_sample(window(texts), max_chars=1 << 20)) == 10


def test_threads_are_the_callers(qwen_tok):
    assert SampleTokenizer(qwen_tok, backend="fast", num_threads=3)._encoders.fast.threads == 3
    with pytest.raises(ValueError, match="num_threads"):
        SampleTokenizer(qwen_tok, num_threads=0)
    with pytest.raises(ValueError, match="threads"):
        FastEncoder(None, None, byte_lengths=[], threads=0)


# ---- configuration -------------------------------------------------------------------------------
def test_backend_is_configurable_but_not_part_of_the_stream_identity():
    base = dict(tokenizer="tok", seq_len=128)
    hashes = {DataConfig.from_inputs(["a.jsonl"], **base, tokenizer_backend=b).config_hash() for b in ("auto", "hf", "fast")}
    assert len(hashes) == 1 and DataConfig.from_inputs(["a.jsonl"], **base, seed=1).config_hash() not in hashes
    assert DataConfig.from_inputs(["a.jsonl"], **base).tokenizer_backend == "auto"
    with pytest.raises(ValueError, match="tokenizer_backend must be one of auto, hf, fast"):
        DataConfig.from_inputs(["a.jsonl"], **base, tokenizer_backend="quick")
    with pytest.raises(ValueError, match="tokenizer backend must be one of"):
        SampleTokenizer(word_tokenizer("chatml"), backend="rust")
    parser = argparse.ArgumentParser()
    add_data_arguments(parser)
    args = parser.parse_args(["a.jsonl", "--tokenizer", "t", "--seq-len", "8", "--tokenizer-backend", "hf"])
    assert data_config_from_args(args).tokenizer_backend == "hf"
    args = parser.parse_args(["a.jsonl", "--tokenizer", "t", "--seq-len", "8"])
    assert data_config_from_args(args, {"data": {"tokenizer_backend": "fast"}}).tokenizer_backend == "fast"


def test_a_runs_back_end_choices_are_logged_once_each(caplog):
    from packfeed.service.tokenize.fast.backend import log_choices

    refused = {"tokenizer": "t", "requested": "auto", "backend": "hf", "reason": "quicktok refused the import: x"}
    proven = {"tokenizer": "t", "requested": "auto", "backend": "fast", "reason": "verified"}
    asked = {"tokenizer": "t", "requested": "hf", "backend": "hf", "reason": "requested"}
    checks: list = []
    with caplog.at_level(logging.INFO, logger="packfeed.service.tokenize.fast.backend"):
        for new in ([refused, refused], [asked], [refused, proven], [proven]):  # actors reporting, window by window
            said = len(checks)
            checks.extend(new)
            log_choices(checks, said)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["tokenizer 't': the HF tokenizers back-end packs, the fast one was refused: quicktok refused the "
                     "import: x", "tokenizer 't': the fast back-end packs (identical rows, proven by each packing process)"]


def test_a_refusal_at_load_is_said_by_the_driver_before_the_actors_report_it(caplog):
    """Issue 24: under auto the fallback reason came only after Ray started (from the actors'
    window stats). ``check_backend`` runs the load-time checks on the driver and says it; the
    actors' identical reports are not said again."""
    from packfeed.service.tokenize.fast.backend import log_choices

    tok = gpt2_regex_tokenizer()
    driver = SampleTokenizer(tok)
    with caplog.at_level(logging.INFO, logger="packfeed.service.tokenize.fast.backend"):
        line = driver.check_backend()
        assert driver.backend == "hf" and driver.check_backend() is None  # decided: said once
        actor = SampleTokenizer(tok)  # a packing actor: undecided until its first window
        actor.tokenize(window(["The cat sat."]))
        log_choices([actor.take_backend_report()], 0)
    assert line.endswith("the fast one was refused: quicktok refused the import: unrecognized pretokenizer pattern "
                         "(pattern: GPT2_BYTELEVEL_DEFAULT)")
    assert [r.getMessage() for r in caplog.records] == [line]
    assert SampleTokenizer(tok, backend="hf").check_backend() is None
    passes = SampleTokenizer(merge_order_trap())  # steps 1-3 pass: step 4 stays each actor's
    assert passes.check_backend() is None and passes.backend == "undecided"

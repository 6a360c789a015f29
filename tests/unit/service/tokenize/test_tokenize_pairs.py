"""Preference pairs through SampleTokenizer: one sample of two segments (prompt + chosen, then
prompt + rejected) with the answers trained, EOS per segment, pairs in record order among the
other kinds, the skips of a pair, and the fast back-end's pairs equal to HF's.

Goldens are written with ``show`` per segment: tokens as words, trained runs in [brackets]."""

from __future__ import annotations

import numpy as np
import pytest

from packfeed.client.rows import IGNORE_INDEX
from packfeed.service.inputs.records import Conversation, Preference, PromptCompletion
from packfeed.service.tokenize.samples import SampleTokenizer, TokenizedSamples

from support.pairs import memory_window as window
from support.pairs import pair_segments
from support.tokenizers import show, word_tokenizer

USER = [{"role": "user", "content": "what color is the sky ?"}]
BLUE = [{"role": "assistant", "content": "blue"}]
NO = [{"role": "assistant", "content": "no"}]


def segments(tok, out: TokenizedSamples, i: int) -> tuple[str, str]:
    """Sample i (a pair) as its two segments, shown."""
    chosen, rejected = pair_segments(out, i)
    return show(tok, *chosen), show(tok, *rejected)


@pytest.fixture(scope="module")
def toks():
    return {style: word_tokenizer(style) for style in ("chatml", "gemma", "llama2")}


GOLDENS = [
    pytest.param("chatml", Preference("the sky is", " blue .", " not blue ."),
                 ("the sky is [blue . </s>]", "the sky is [not blue . </s>]"), 3, id="standard"),
    pytest.param("gemma", Preference("the sky is", " blue .", " not blue ."),
                 ("<bos> the sky is [blue . <eos>]", "<bos> the sky is [not blue . <eos>]"), 4,
                 id="standard-bos-in-both-segments"),
    pytest.param("chatml", Preference(USER, BLUE, NO),
                 ("<|im_start|> user what color is the sky ? <|im_end|> <|im_start|> assistant [blue <|im_end|> </s>]",
                  "<|im_start|> user what color is the sky ? <|im_end|> <|im_start|> assistant [no <|im_end|> </s>]"),
                 11, id="conversational"),
    pytest.param("llama2", Preference(USER, BLUE, NO),
                 ("<s> [INST] what color is the sky ? [/INST] [blue </s>]", "<s> [INST] what color is the sky ? [/INST] [no </s>]"),
                 9, id="conversational-template-ends-with-eos-once"),
    pytest.param("chatml", Preference("", "hello world", "bye"), ("[hello world </s>]", "[bye </s>]"), 0,
                 id="empty-prompt-first-token-masked-by-the-packer-not-here"),
]


@pytest.mark.parametrize("style, record, want, prompt_len", GOLDENS)
def test_goldens(toks, style, record, want, prompt_len):
    tok = toks[style]
    out = SampleTokenizer(tok, backend="hf").tokenize(window([record]))
    assert segments(tok, out, 0) == want
    assert out.pair_prompt_lens.tolist() == [prompt_len]
    chosen, rejected = np.split(out.tokens, [int(out.pair_chosen_lens[0])])
    np.testing.assert_array_equal(chosen[:prompt_len], rejected[:prompt_len])  # the same prompt tokens
    assert not (out.labels[:prompt_len] != IGNORE_INDEX).any()


def test_loss_all_and_no_eos(toks):
    tok = toks["chatml"]
    record = Preference("the sky is", " blue .", " no .")
    all_loss = SampleTokenizer(tok, loss="all", backend="hf").tokenize(window([record]))
    assert segments(tok, all_loss, 0) == ("[the sky is blue . </s>]", "[the sky is no . </s>]")
    no_eos = SampleTokenizer(tok, add_eos=False, backend="hf").tokenize(window([record]))
    assert segments(tok, no_eos, 0) == ("the sky is [blue .]", "the sky is [no .]")
    assert all_loss.pair_prompt_lens.tolist() == no_eos.pair_prompt_lens.tolist() == [3]


def test_pairs_keep_record_order_among_other_kinds(toks):
    tok = toks["chatml"]
    records = ["hello world", Preference("the sky is", " blue", " no"), PromptCompletion("the sky is", " blue"),
               Preference(USER, BLUE, NO), Conversation(USER + BLUE)]
    out = SampleTokenizer(tok, backend="hf").tokenize(window(records, first_id=10))
    assert out.sample_ids.tolist() == [10, 11, 12, 13, 14]
    assert out.pairs.tolist() == [False, True, False, True, False]
    assert out.pair_chosen_lens.tolist()[::2] == [0, 0, 0] and out.pair_prompt_lens.tolist()[::2] == [0, 0, 0]
    assert show(tok, out.tokens[: out.offsets[1]], out.labels[: out.offsets[1]]) == "[hello world </s>]"
    assert segments(tok, out, 1) == ("the sky is [blue </s>]", "the sky is [no </s>]")
    alone = SampleTokenizer(tok, backend="hf").tokenize(window([records[3]]))
    lo, hi = out.offsets[3], out.offsets[4]
    np.testing.assert_array_equal(out.tokens[lo:hi], alone.tokens)  # the same pair, alone or mixed
    np.testing.assert_array_equal(out.labels[lo:hi], alone.labels)


def test_windows_without_pairs_have_no_pair_columns(toks):
    out = SampleTokenizer(toks["chatml"], backend="hf").tokenize(window(["hello world", Conversation(USER + BLUE)]))
    assert out.pair_chosen_lens is None and out.pair_prompt_lens is None and out.pairs is None


def test_a_pair_without_trained_answer_is_skipped_whole(toks):
    tok = toks["chatml"]
    # add_eos off and an answer that is only the prompt's last word again: nothing after the first token trains
    records = [Preference("the sky is", " blue", " no"), Preference("", "blue", "no")]
    out = SampleTokenizer(tok, add_eos=False, backend="hf").tokenize(window(records))
    assert out.sample_ids.tolist() == [0]
    assert [(s.sample_id, s.reason) for s in out.skips] == [(1, "no_trained_tokens")]


def test_template_error_skips_the_pair(toks):
    tok = toks["llama2"]  # its template raises unless roles alternate
    bad = Preference(USER + USER, BLUE, NO)
    out = SampleTokenizer(tok, backend="hf").tokenize(window([bad, Preference(USER, BLUE, NO)]))
    assert out.sample_ids.tolist() == [1]
    assert [(s.sample_id, s.reason) for s in out.skips] == [(0, "template_error")]


def test_fast_back_end_gives_hf_pairs():
    from packfeed.service.assets import demo_tokenizer_path

    records = [Preference("Question: What is 2 plus 2?\nAnswer:", " 4.", " 5."),
               Preference([{"role": "user", "content": "What is the capital of Kareth?"}],
                          [{"role": "assistant", "content": "Sollun."}], [{"role": "assistant", "content": "Brell."}]),
               "Once upon a time a fox.", Preference("", "café ✓ naïve", "cafe")]
    hf = SampleTokenizer(demo_tokenizer_path(), backend="hf").tokenize(window(records))
    fast_tok = SampleTokenizer(demo_tokenizer_path(), backend="fast")
    fast = fast_tok.tokenize(window(records))
    assert fast_tok.backend == "fast"
    for name in ("tokens", "labels", "offsets", "sample_ids", "pair_chosen_lens", "pair_prompt_lens"):
        np.testing.assert_array_equal(getattr(fast, name), getattr(hf, name), err_msg=name)
    assert hf.pairs.tolist() == [True, True, False, True]


def test_the_drivers_template_check_covers_conversational_pairs(toks):
    from packfeed.service.tokenize.chat import ChatTemplateError

    tok = word_tokenizer("chatml")
    tok.chat_template = None
    checker = SampleTokenizer(tok, backend="hf")
    assert checker.check_chat_template(window([Preference("the sky is", " blue", " no")])) == 0  # strings need none
    with pytest.raises(ChatTemplateError, match="mem.jsonl: row 1, sample 1: .*no chat template"):
        checker.check_chat_template(window([Preference("the sky is", " blue", " no"), Preference(USER, BLUE, NO)]))
    assert SampleTokenizer(toks["chatml"], backend="hf").check_chat_template(window([Preference(USER, BLUE, NO)])) == 1


def test_the_fast_back_ends_proof_compares_the_pair_columns(toks):
    from dataclasses import replace

    from packfeed.service.tokenize.fast.backend import FastPathRefused, check_window

    raw = window([Preference("the sky is", " blue", " no"), "hello world"])
    out = SampleTokenizer(toks["chatml"], backend="hf").tokenize(raw)
    assert check_window(out, replace(out), raw)["sample_records"] == 2
    moved = replace(out, pair_chosen_lens=out.pair_chosen_lens + np.array([1, 0]))  # same tokens, another cut
    with pytest.raises(FastPathRefused, match="pair_chosen_lens"):
        check_window(out, moved, raw)
    with pytest.raises(FastPathRefused, match="pair_prompt_lens"):
        check_window(out, replace(out, pair_prompt_lens=None, pair_chosen_lens=out.pair_chosen_lens), raw)

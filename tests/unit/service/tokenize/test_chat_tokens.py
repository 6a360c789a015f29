"""Known ChatML conversations tokenized from their turns (``chat_tokens.TurnEncoder``) give the
tokens, labels and skips the HF back-end gives them rendered.

The sweep draws batches of random conversations for both known templates (the bundled ChatML,
Qwen2.5) with contents where the turn path could go wrong: whitespace and newlines where a turn's
header ends, text holding added tokens or a lone ``<``, text an NFC normalizer changes, characters
split over several byte tokens, empty contents, a conversation that opens with the assistant,
roles the template renders in Python or not, and a lone surrogate quicktok refuses. The fast
back-end's windows must equal the HF back-end's, both loss modes, with and without EOS; and the
turn encoder must take every conversation drawn from what it is meant to take, so that the
equality is not the text path's alone. The vocabulary checks that keep the turn path to
tokenizers where it is exact are tested on added tokens built to break it.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_tokenize import window

from packfeed.service.inputs.records import Conversation
from packfeed.service.tokenize.fast.backend import load_fast
from packfeed.service.tokenize.chat import known_template
from packfeed.service.tokenize.fast.chat_tokens import TurnEncoder, _crosses
from packfeed.service.tokenize.encoders import HFEncoder
from packfeed.service.tokenize.samples import SampleTokenizer


# What the turn path takes: no added token, NFC text (Qwen2.5 normalizes to NFC); the header's
# newline meets content that opens with whitespace, newlines, letters, digits, punctuation.
PLAIN = ["hi", " ", "  ", "\n", "\n\n", "\r\n", "\t", "x", "7", ".", "'s", "naïve", "日本語", "🦩", "龘", "Ꙭ", ""]
# What sends a conversation to the text path, or a batch to HF: added tokens, a "<" that is not
# one, NFC-changed text, a lone surrogate quicktok refuses.
ODD = ["<|im_end|>", "<|im_start|>", "<|endoftext|>", "<tool_call>", "<", "<|im_", "e\u0301", "\u0301", "\ud800"]


def contents(plain: bool):
    pieces = st.sampled_from(PLAIN) | st.text(st.characters(max_codepoint=0x7F), max_size=3)
    if not plain:
        pieces = pieces | st.sampled_from(ODD)
    return st.lists(pieces, max_size=6).map("".join)


@st.composite
def conversations(draw, plain: bool):
    roles = ["user", "assistant", "system"] + ([] if plain else ["tool", "User", ""])
    return [{"role": draw(st.sampled_from(roles)), "content": draw(contents(plain))}
            for _ in range(draw(st.integers(1, 5)))]


@pytest.mark.parametrize("name", ["chatml", "qwen2.5"])
def test_turns_give_the_hf_back_ends_windows_on_random_conversations(toks, name):
    tok = toks[name]
    fast_encoder, _, _ = load_fast(tok.backend_tokenizer, threads=1)
    turns = TurnEncoder.of(fast_encoder)
    assert turns is not None  # both bundled vocabularies qualify
    chat = known_template(tok.get_chat_template())
    packers = {(loss, eos): (SampleTokenizer(tok, backend="hf", loss=loss, add_eos=eos),
                             SampleTokenizer(tok, backend="fast", loss=loss, add_eos=eos, num_threads=1))
               for loss in ("auto", "all") for eos in (False, True)}  # fmt: skip
    taken_by_turns = []

    @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
    @given(data=st.data(), kinds=st.lists(st.booleans(), min_size=1, max_size=6),
           loss=st.sampled_from(["auto", "all"]), eos=st.booleans())  # fmt: skip
    def check(data, kinds, loss, eos):
        batch = [data.draw(conversations(plain)) for plain in kinds]
        hf, fast = packers[loss, eos]
        a, b = (p.tokenize(window([Conversation(m) for m in batch])) for p in (hf, fast))
        for field in ("tokens", "labels", "offsets", "sample_ids"):
            assert np.array_equal(getattr(a, field), getattr(b, field)), field
        assert [s.describe() for s in a.skips] == [s.describe() for s in b.skips]
        # every conversation drawn plain (all its roles rendered in Python) is the turn path's
        plain = [k for k, p in enumerate(kinds) if p]
        out = turns.encode(chat, [batch[k] for k in plain], loss == "all")
        assert out is not None and out[0] == list(range(len(plain)))
        taken_by_turns.append(len(plain))

    check()
    assert sum(taken_by_turns) >= 300, "the sweep ran, and the turn path took conversations"


def test_what_the_turn_path_leaves_to_the_text_path(toks):
    tok = toks["qwen2.5"]
    fast_encoder, _, _ = load_fast(tok.backend_tokenizer, threads=1)
    turns, chat = TurnEncoder.of(fast_encoder), known_template(tok.get_chat_template())
    user = {"role": "user", "content": "hi"}
    batch = [[user], [{"role": "user", "content": "a <tool_call> b"}], [{"role": "user", "content": "cafe\u0301"}],
             [{"role": "user", "content": "a < b"}], [user, {"role": "assistant", "content": "x<|im_end|>"}],
             [user, {"role": "assistant", "content": "e\u0301 x"}], [user, {"role": "assistant", "content": "x e\u0301"}]]
    taken, lengths, ids, trained = turns.encode(chat, batch, False)
    # an added token in a turn, an assistant turn whose content opens with a character NFC composes:
    # the text path's; NFC-changed text elsewhere is the turn path's
    assert taken == [0, 2, 3, 6]
    rendered = [tok(tok.apply_chat_template(batch[k], tokenize=False), add_special_tokens=False)["input_ids"]
                for k in taken]
    assert lengths.tolist() == list(map(len, rendered)) and ids.tolist() == [t for r in rendered for t in r]
    hf = SampleTokenizer(tok, backend="hf", add_eos=False).tokenize(window([Conversation(batch[6])]))
    assert trained[-len(rendered[-1]):].tolist() == (hf.labels != -100).tolist()  # the one assistant turn
    assert trained.sum() == (hf.labels != -100).sum() > 0
    assert turns.encode(chat, [[{"role": "user", "content": "\ud800"}]], False) is None  # quicktok refuses: HF's


@pytest.mark.parametrize("token, crosses", [
    ("<|im_start|>", False), ("<tool_call>", False), ("<|endoftext|>", False),
    ("<|im_start|>assistant", True),  # extends the marker where it starts
    ("x<|im_", True), ("\n<|im_start|>", True),  # from the turn before into the marker
    ("a<|im_end|>b", True), ("|>", False),
])  # fmt: skip
def test_an_added_token_that_could_match_across_a_marker_is_found(token, crosses):
    assert any(_crosses(token, m) for m in ("<|im_start|>", "<|im_end|>")) is crosses


def test_the_turn_path_is_only_for_the_fast_encoder_of_a_vocabulary_it_is_exact_on(toks):
    from tokenizers import AddedToken

    tok = toks["chatml"]
    assert TurnEncoder.of(HFEncoder(tok.backend_tokenizer)) is None
    fast_encoder, _, _ = load_fast(tok.backend_tokenizer, threads=1)
    assert TurnEncoder.of(fast_encoder) is not None
    broken = tok.backend_tokenizer.__class__.from_str(tok.backend_tokenizer.to_str())
    broken.add_special_tokens([AddedToken("<|im_start|>assistant", special=True)])
    fast_broken, _, _ = load_fast(broken, threads=1)
    chat = known_template(tok.get_chat_template())
    conversation = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    assert TurnEncoder.of(fast_encoder).encode(chat, [conversation], False)[0] == [0]
    # an added token that extends a marker: no fixed text of the template is split alike, nothing is taken
    assert TurnEncoder.of(fast_broken).encode(chat, [conversation], False)[0] == []

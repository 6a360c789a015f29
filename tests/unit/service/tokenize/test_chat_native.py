"""Known chat templates rendered in Python (``chat.ChatML``) against transformers' Jinja.

A known template is picked by the exact text of the template; it renders only the
conversations it accepts, and for those everything packing takes from a render (the text, the
trained spans, a prompt's length, a preference pair's three texts, an exception that makes a
skip) must equal Jinja's. Proven here over random conversations that reach inside and outside
what the Python rendering accepts (roles it does not render, tool calls, list contents, tools,
reasoning fields, text that looks like the template's own markers), and end to end on the
tokenized windows. The driver's run-time check (a difference sends the run through Jinja) is
tested with a deliberately wrong rendering.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.tokenizers import CHATML, qwen_chat_template
from test_tokenize import window

from packfeed.service.assets.build import CHATML_TEMPLATE
from packfeed.service.inputs.records import Conversation, Preference, PromptCompletion
from packfeed.service.tokenize import chat
from packfeed.service.tokenize.chat import ChatML, ChatRenderer, known_template, template_hash
from packfeed.service.tokenize.samples import SampleTokenizer


# ---- which templates are known -----------------------------------------------------------------
def test_the_known_templates_are_picked_by_their_exact_text(toks):
    assert known_template(CHATML_TEMPLATE).name == "chatml"  # the bundled tokenizer's (assets/build.py)
    qwen = qwen_chat_template()  # TRL's copy of Qwen2.5's template
    assert known_template(qwen).name == "qwen2.5"
    assert known_template(qwen.removesuffix("\n")) is known_template(qwen.removesuffix("\n") + "\n")
    for name, tok in toks.items():  # as transformers loads them from the saved files
        assert known_template(tok.get_chat_template()).name == name
    edited = qwen.replace("helpful assistant", "helpful  assistant")
    assert known_template(edited) is None and known_template(qwen + "\n\n") is None
    assert known_template(CHATML) is None  # the same ChatML, written differently: Jinja
    assert known_template(None) is None
    assert set(chat.KNOWN_TEMPLATES) == {template_hash(CHATML_TEMPLATE), template_hash(qwen)}


# ---- the sweep against Jinja ---------------------------------------------------------------------
PIECES = ["hi", " ", "\n", "<|im_start|>", "<|im_end|>", "assistant\n", "system", "{{ x }}", "{% if %}", "日本語",
          "🚀", "\r\n", "\t", "'", '"', "\\", ""]  # fmt: skip
texts = st.lists(st.sampled_from(PIECES) | st.text(max_size=4), max_size=6).map("".join)
ROLES = ["user", "assistant", "system"] * 4 + ["tool", "developer"]  # mostly the ones rendered in Python
TOOL_CALL = [{"type": "function", "function": {"name": "weather", "arguments": {"city": "Paris"}}}]
TOOLS = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]


@st.composite
def messages(draw, plain: bool = False):
    """Conversations; ``plain``: only ones both known templates render in Python (non-empty,
    string roles they render and contents, fields the templates do not read)."""
    out = []
    for _ in range(draw(st.integers(1 if plain else 0, 6))):
        odd_role = not plain and not draw(st.integers(0, 9))
        m = {"role": draw(st.sampled_from(["User", ""] if odd_role else ROLES[:12] if plain else ROLES)),
             "content": draw(texts)}
        extra = draw(st.integers(0, 29))
        if extra == 0 and not plain:
            m["tool_calls"] = TOOL_CALL
        elif extra == 1:
            m["tool_calls"] = []  # falsy: a plain turn for Qwen2.5
        elif extra == 2 and not plain:
            m["content"] = [{"type": "text", "text": m["content"]}]
        elif extra == 3:
            m["reasoning_content"] = draw(texts)  # aliased by transformers, read by neither template
        elif extra == 4:
            m["name"] = "bob"
        elif extra == 5 and not plain:
            del m["content"]
        out.append(m)
    return out


def outcome(f, *args):
    """What packing takes from a render: its result, or the exception's type (a skip)."""
    try:
        return f(*args)
    except chat.ChatTemplateError as e:
        return ("ChatTemplateError", str(e))
    except Exception as e:
        return type(e).__name__


@pytest.mark.parametrize("name", ["chatml", "qwen2.5"])
def test_python_rendering_equals_jinja_on_random_conversations(toks, name):
    tok = toks[name]
    native, jinja = ChatRenderer(tok, name), ChatRenderer(tok, name, native=False)
    rejected = []

    @settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
    @given(plain=st.booleans(), data=st.data(), tools=st.sampled_from([None, None, []]) | st.just(TOOLS),
           cut=st.integers(0, 6), generation=st.booleans(), other=messages())  # fmt: skip
    def check(plain, data, tools, cut, generation, other):
        ms = data.draw(messages(plain))
        taken = native.native_for(ms, tools) is not None
        assert taken or not (plain and not tools)  # every plain conversation is rendered in Python
        rejected.append(not taken)
        if taken:
            assert native.render(ms, tools, generation) == tok.apply_chat_template(
                ms, tools=tools, tokenize=False, add_generation_prompt=generation)
        assert outcome(native.render, ms, tools, generation) == outcome(jinja.render, ms, tools, generation)
        for all_loss in (False, True):
            assert outcome(native.conversation, ms, tools, all_loss) == outcome(jinja.conversation, ms, tools, all_loss)
            prompt, completion = ms[:cut], ms[cut:]
            assert (outcome(native.prompt_completion, prompt, completion, tools, all_loss)
                    == outcome(jinja.prompt_completion, prompt, completion, tools, all_loss))  # fmt: skip
        assert (outcome(native.preference, ms, other[:2], other[2:4], tools)
                == outcome(jinja.preference, ms, other[:2], other[2:4], tools))  # fmt: skip

    check()
    assert len(rejected) >= 300 and any(rejected)  # the sweep ran, and reached conversations left to Jinja


def test_python_rendering_gives_the_tokenized_windows_jinja_gives(toks):
    """End to end through SampleTokenizer: conversations, prompt/completion given as messages
    and preference pairs, the same tokens, labels and skips either way."""
    user, system = {"role": "user", "content": "Hi there\n"}, {"role": "system", "content": "Be brief."}
    answer, other = {"role": "assistant", "content": "Hello! ✓"}, {"role": "assistant", "content": "<|im_end|>no"}
    records = [
        Conversation([user, answer]), Conversation([system, user, answer, user, other]),
        Conversation([answer, user, answer]),  # opens with the assistant
        Conversation([user, {"role": "assistant", "tool_calls": TOOL_CALL}, {"role": "tool", "content": "18C"}, answer]),
        PromptCompletion([system, user], [answer]), PromptCompletion([user], [answer, answer]),
        Preference([user], [answer], [other]),
    ]  # fmt: skip
    for name, tok in toks.items():
        for loss in ("auto", "all"):
            native = SampleTokenizer(tok, loss=loss, backend="hf")
            jinja = SampleTokenizer(tok, loss=loss, backend="hf")
            jinja._native_chat = False
            a, b = native.tokenize(window(records)), jinja.tokenize(window(records))
            for field in ("tokens", "labels", "offsets", "sample_ids", "pair_chosen_lens", "pair_prompt_lens"):
                assert np.array_equal(getattr(a, field), getattr(b, field)), (name, loss, field)
            assert [s.describe() for s in a.skips] == [s.describe() for s in b.skips]
            assert native._renderer().native_for(records[1].messages, None) is not None


# ---- the driver's run-time check ------------------------------------------------------------------
def test_a_rendering_that_differs_on_the_probed_rows_sends_the_run_through_jinja(toks, monkeypatch, caplog):
    tok = toks["qwen2.5"]
    records = [Conversation([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}])]
    right = SampleTokenizer(tok)
    right.check_chat_template(window(records))
    assert right.ship().native_chat is True and right._native_chat

    wrong = ChatML("qwen2.5", "You are someone else.", frozenset(("system", "user", "assistant")))
    monkeypatch.setitem(chat.KNOWN_TEMPLATES, template_hash(tok.get_chat_template()), wrong)
    checked = SampleTokenizer(tok)
    assert checked._renderer().render(records[0].messages, None).startswith("<|im_start|>system\nYou are someone")
    with caplog.at_level(logging.WARNING):
        assert checked.check_chat_template(window(records)) == 1
    assert "differs from Jinja on mem.jsonl row 0" in caplog.text
    shipped = checked.ship()
    assert shipped.native_chat is False
    expected = SampleTokenizer(tok, backend="hf")
    expected._native_chat = False
    for packer in (checked, SampleTokenizer(shipped, backend="hf")):  # the driver's, and an actor's
        out = packer.tokenize(window(records))
        assert np.array_equal(out.tokens, expected.tokenize(window(records)).tokens)
        assert "You are Qwen" in tok.decode(out.tokens)

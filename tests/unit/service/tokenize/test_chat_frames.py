"""Chat templates known by what they render (chat_frames.py): ChatML written three ways (one with
Qwen2.5's default system turn) and Llama 3's take the turn path of the fast back-end and give
the rows of rendering every sample through Jinja; a template that is not fixed text around the
contents falls back to Jinja, counted, with its reason.

Real tokenizers: Qwen2.5's 151k vocabulary built offline (conftest), given each template; for
Llama 3 the same vocabulary with Llama 3's header and turn markers added as special tokens.
"""

from __future__ import annotations

import copy
import logging

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_chat_tokens import contents
from test_tokenize import window

from packfeed.service.inputs.records import Conversation
from packfeed.service.tokenize.chat import ChatRenderer, ChatTemplateError, known_template
from packfeed.service.tokenize.chat_frames import FramedTemplate, learn_frames
from packfeed.service.tokenize.fast.backend import log_choices
from packfeed.service.tokenize.samples import SampleTokenizer

# ChatML three ways: loops, whitespace control, quotes, filters and variable names differ; the texts rendered do not
CHATML_LOOP = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
               "'<|im_end|>' + '\n'}}{% endfor %}"
               "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
CHATML_TRIMMED = (
    "{%- for turn in messages -%}\n"
    "    {{- \"<|im_start|>\" ~ turn.role ~ \"\\n\" -}}\n"
    "    {{- turn.content -}}\n"
    "    {{- \"<|im_end|>\\n\" -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt %}{{ \"<|im_start|>assistant\\n\" }}{% endif -%}\n"
)
CHATML_QWEN_SYSTEM = (
    "{% set ns = namespace(first=true) %}{% for m in messages %}"
    "{% if ns.first and m.role != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
    "{% set ns.first = false %}{{ '<|im_start|>%s\\n%s<|im_end|>\\n' | format(m.role, m.content) }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
FRAMED = {"chatml-loop": CHATML_LOOP, "chatml-trimmed": CHATML_TRIMMED, "chatml-qwen-system": CHATML_QWEN_SYSTEM,
          "llama3": LLAMA3}
# not fixed text around each content: each turn's header holds its number
NUMBERED = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + ' ' + loop.index|string + '\n' + m['content'] + "
            "'<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant ' + "
            "(messages|length + 1)|string + '\n' }}{% endif %}")


@pytest.fixture(scope="module")
def templated(toks):
    """{name: Qwen2.5's tokenizer with that chat template}."""
    out = {}
    for name, template in {**FRAMED, "numbered": NUMBERED}.items():
        tok = copy.deepcopy(toks["qwen2.5"])
        if name == "llama3":
            tok.add_special_tokens({"bos_token": "<|begin_of_text|>", "additional_special_tokens": [
                "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]})
        tok.chat_template = template
        assert known_template(template) is None  # no template hash knows them
        out[name] = tok
    return out


def plain_conversation(draw_roles, texts):
    return [{"role": r, "content": t} for r, t in zip(draw_roles, texts)]


@st.composite
def conversations(draw):
    """Conversations of system, user and assistant turns, contents where the turn path could go
    wrong (test_chat_tokens.py: whitespace at the header's edge, added tokens, NFC-changed text)."""
    n = draw(st.integers(1, 5))
    roles = draw(st.lists(st.sampled_from(["system", "user", "assistant"]), min_size=n, max_size=n))
    return [{"role": r, "content": draw(contents(draw(st.booleans())))} for r in roles]


def jinja_tokenizer(tok, loss, eos):
    """The rendering path: HF back-end, every conversation through Jinja."""
    reference = SampleTokenizer(tok, backend="hf", loss=loss, add_eos=eos)
    reference._native_chat = False
    return reference


def outcome(packer, records):
    try:
        return packer.tokenize(window(records))
    except ChatTemplateError as e:
        return str(e)


def assert_same(a, b):
    for field in ("tokens", "labels", "offsets", "sample_ids"):
        assert np.array_equal(getattr(a, field), getattr(b, field)), field
    assert [s.describe() for s in a.skips] == [s.describe() for s in b.skips]


@pytest.mark.parametrize("name", list(FRAMED))
def test_a_framed_template_takes_the_turn_path_and_gives_the_rendering_paths_rows(templated, name):
    tok = templated[name]
    renderer = ChatRenderer(tok, name)
    learned = renderer._python_rendering(tok.get_chat_template())
    assert isinstance(learned, FramedTemplate), renderer.reasons
    assert learned.edge_whitespace is (name != "llama3")  # Llama 3 trims each content
    packers = {(loss, eos): (jinja_tokenizer(tok, loss, eos),
                             SampleTokenizer(tok, backend="fast", loss=loss, add_eos=eos, num_threads=1))
               for loss in ("auto", "all") for eos in (False, True)}  # fmt: skip
    # plain contents of every role sequence: all of them the turn path's
    words = ["hi", "the sky is blue", "two\nlines", "naïve 日本語 🦩", "x = {'a': 1}", "ok."]
    plain = [plain_conversation(roles, [words[(i + k) % len(words)] for i in range(len(roles))])
             for k, roles in enumerate([("user", "assistant"), ("system", "user", "assistant"),
                                        ("system", "user", "assistant", "user", "assistant"), ("user",),
                                        ("user", "assistant", "assistant"), ("system", "assistant")])]
    for (loss, eos), (jinja, fast) in packers.items():
        records = [Conversation(m) for m in plain]
        assert_same(jinja.tokenize(window(records)), fast.tokenize(window(records)))
        paths = fast._renderer().paths
        assert paths["turns"] >= len(plain) and paths["jinja"] == 0, (paths, fast._renderer().reasons)
    turns_before = {k: p[1]._renderer().paths["turns"] for k, p in packers.items()}

    # derandomized: the same 120 examples on every machine, so the count below is a fact of the
    # sweep, not of the draw (a fresh clone drew 43 of them through the turn path once)
    @settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True,
              database=None)
    @given(batch=st.lists(conversations(), min_size=1, max_size=6), loss=st.sampled_from(["auto", "all"]),
           eos=st.booleans())
    def check(batch, loss, eos):
        jinja, fast = packers[loss, eos]
        records = [Conversation(m) for m in batch]
        a, b = (outcome(p, records) for p in (jinja, fast))
        if isinstance(a, str) or isinstance(b, str):  # the template cannot locate an assistant turn: the run's error
            assert a == b
        else:
            assert_same(a, b)

    check()
    taken = sum(p[1]._renderer().paths["turns"] - turns_before[k] for k, p in packers.items())
    assert taken >= 50, "the sweep's conversations went through the turn path"


def test_a_template_not_of_that_form_falls_back_counted_with_its_reason(templated, caplog):
    tok = templated["numbered"]
    batch = [[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
              {"role": "assistant", "content": "hello"}], [{"role": "user", "content": "hi"}],
             [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]]
    records = [Conversation(m) for m in batch]
    for loss in ("auto", "all"):
        fast = SampleTokenizer(tok, backend="fast", loss=loss, num_threads=1)
        assert_same(jinja_tokenizer(tok, loss, True).tokenize(window(records)), fast.tokenize(window(records)))
        renderer = fast._renderer()
        assert renderer.paths["jinja"] >= len(batch) and renderer.paths["turns"] == renderer.paths["python"] == 0
        reason = renderer.reasons[tok.get_chat_template()]
        assert "otherwise than as fixed text" in reason
        report = fast.take_backend_report()  # what the run's stats and log say
        assert report["chat_template"] == {"rendered_by": "jinja", "reasons": [reason],
                                           "samples": renderer.paths["jinja"]}
        caplog.clear()  # what the tokenizing above logged (its first learning of the template in this process)
        with caplog.at_level(logging.INFO, logger="packfeed.service.tokenize.fast.backend"):
            log_choices([report, report], 0)
        said = [r.getMessage() for r in caplog.records
                if r.name == "packfeed.service.tokenize.fast.backend" and "Jinja" in r.getMessage()]
        assert said == [f"tokenizer {fast.name!r}: its chat template is rendered through Jinja per sample: {reason}"]


def test_a_learned_rendering_that_differs_on_the_data_is_dropped_for_jinja(templated):
    """A template that is fixed text around every probe but not around some content of the data
    (here: a content holding "SECRET") is caught on the first conversations: Jinja from then on."""
    tok = copy.deepcopy(templated["chatml-loop"])
    tok.chat_template = CHATML_LOOP.replace("message['content']", "message['content'].replace('SECRET', '***')")
    renderer = ChatRenderer(tok, "odd")
    ok = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    odd = [{"role": "user", "content": "the SECRET"}]
    assert renderer.native_for(ok, None) is not None
    assert renderer.native_for(odd, None) is None and renderer.native_for(ok, None) is None
    assert "differs from Jinja" in renderer.reasons[tok.get_chat_template()]
    assert renderer.conversation(odd, None, False)[0] == tok.apply_chat_template(odd, tokenize=False)


def test_learning_is_by_the_text_rendered():
    """The probes see only what a template renders: ChatML written any way learns the same texts."""
    from jinja2 import Environment

    def render_with(source):
        template = Environment().from_string(source)
        return lambda messages, gen: template.render(messages=messages, add_generation_prompt=gen)

    learned = [learn_frames(render_with(source), name) for name, source in
               (("loop", CHATML_LOOP), ("trimmed", CHATML_TRIMMED))]
    assert all(isinstance(f, FramedTemplate) for f in learned)
    assert learned[0].__dict__ | {"name": ""} == learned[1].__dict__ | {"name": ""}
    assert learned[0].link["user", "assistant"] == "<|im_end|>\n<|im_start|>assistant\n"

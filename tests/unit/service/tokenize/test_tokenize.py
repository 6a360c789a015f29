"""SampleTokenizer: token ids equal the tokenizer's own output, loss masks train exactly the
completion / assistant tokens, EOS is appended once, and every sample is kept or skipped once.

Goldens are written with ``show``: tokens as words, trained runs in [brackets]. The first token
of each sample is not masked here (the packer does that)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packfeed.client.rows import IGNORE_INDEX
from packfeed.service.inputs.read import Piece, RawWindow, WindowSpec, read_window
from packfeed.service.inputs.records import BadSampleError, Conversation, PromptCompletion
from packfeed.service.tokenize.chat import ChatTemplateError
from packfeed.service.tokenize.samples import SampleTokenizer, TokenizedSamples

from support.inputs import plan_windows
from support.tokenizers import CHATML, WORDS, qwen_tokenizer_dir, sample, show, word_tokenizer

USER_HI = {"role": "user", "content": "hi"}
HELLO = {"role": "assistant", "content": "hello world"}


def window(records, first_id=0):
    """An in-memory RawWindow holding ``records`` as samples first_id, first_id + 1, ..."""
    n = len(records)
    spec = WindowSpec(0, 0, (Piece("mem.jsonl", "jsonl", "messages", 0, 0, n, first_id),))
    return RawWindow(spec, np.arange(first_id, first_id + n, dtype=np.int64), list(records), [], np.zeros(n, np.int64))


def shown(tok, out: TokenizedSamples):
    return [show(tok, *sample(out, i)) for i in range(len(out))]


def check_invariants(out: TokenizedSamples):
    assert out.tokens.dtype == np.int32 and out.labels.dtype == np.int32
    assert out.offsets.dtype == np.int64 and out.sample_ids.dtype == np.int64
    assert out.offsets[0] == 0 and out.offsets[-1] == len(out.tokens) == len(out.labels)
    assert len(out.offsets) == len(out.sample_ids) + 1 and (np.diff(out.offsets) > 0).all()
    trained = out.labels != IGNORE_INDEX
    assert (out.labels[trained] == out.tokens[trained]).all()


@pytest.fixture(scope="module")
def toks():
    return {style: word_tokenizer(style) for style in ("chatml", "gemma", "llama2")}


# ---- goldens ---------------------------------------------------------------------------------
GOLDENS = [
    pytest.param("chatml", Conversation([USER_HI, HELLO]),
                 "<|im_start|> user hi <|im_end|> <|im_start|> assistant [hello world <|im_end|> </s>]",
                 id="chatml-messages"),
    pytest.param("chatml", Conversation([{"role": "system", "content": "be good"}, USER_HI,
                                         {"role": "assistant", "content": "hello"}, {"role": "user", "content": "why ?"},
                                         {"role": "assistant", "content": "because"}]),
                 "<|im_start|> system be good <|im_end|> <|im_start|> user hi <|im_end|> <|im_start|> assistant "
                 "[hello <|im_end|>] <|im_start|> user why ? <|im_end|> <|im_start|> assistant [because <|im_end|> </s>]",
                 id="chatml-multi-turn"),
    pytest.param("chatml", Conversation([USER_HI, HELLO, {"role": "user", "content": "bye"}]),
                 "<|im_start|> user hi <|im_end|> <|im_start|> assistant [hello world <|im_end|>] "
                 "<|im_start|> user bye <|im_end|> </s>",
                 id="chatml-ends-with-user-eos-not-trained"),
    pytest.param("chatml", PromptCompletion([USER_HI], [HELLO]),
                 "<|im_start|> user hi <|im_end|> <|im_start|> assistant [hello world <|im_end|> </s>]",
                 id="chatml-prompt-completion-conversational"),
    pytest.param("chatml", PromptCompletion("the sky is", " blue ."), "the sky is [blue . </s>]",
                 id="chatml-prompt-completion-standard"),
    pytest.param("chatml", "hello world", "[hello world </s>]", id="chatml-text"),
    pytest.param("chatml", "hello world </s>", "[hello world </s>]", id="text-ending-with-eos-not-duplicated"),
    pytest.param("gemma", Conversation([USER_HI, HELLO]),
                 "<bos> <start_of_turn> user hi <end_of_turn> <start_of_turn> model [hello world <end_of_turn> <eos>]",
                 id="gemma-messages-one-bos"),
    pytest.param("gemma", PromptCompletion("the sky is", " blue ."), "<bos> the sky is [blue . <eos>]",
                 id="gemma-prompt-completion-standard-bos-from-tokenizer"),
    pytest.param("gemma", "hello world", "[<bos> hello world <eos>]", id="gemma-text"),
    pytest.param("llama2", Conversation([USER_HI, HELLO]), "<s> [INST] hi [/INST] [hello world </s>]",
                 id="llama2-turn-ends-with-eos-not-duplicated"),
    pytest.param("llama2", Conversation([USER_HI, {"role": "assistant", "content": "hello"},
                                         {"role": "user", "content": "why ?"}, {"role": "assistant", "content": "because"}]),
                 "<s> [INST] hi [/INST] [hello </s>] <s> [INST] why ? [/INST] [because </s>]",
                 id="llama2-multi-turn"),
]  # fmt: skip


@pytest.mark.parametrize("style, record, expected", GOLDENS)
def test_golden_masks(toks, style, record, expected):
    out = SampleTokenizer(toks[style]).tokenize(window([record]))
    check_invariants(out)
    assert out.skips == [] and shown(toks[style], out) == [expected]


@pytest.mark.parametrize(
    "loss, record, expected",
    [
        pytest.param("all", Conversation([USER_HI, HELLO]),
                     "[<|im_start|> user hi <|im_end|> <|im_start|> assistant hello world <|im_end|> </s>]", id="all-chat"),
        pytest.param("all", PromptCompletion("the sky is", " blue ."), "[the sky is blue . </s>]", id="all-standard"),
        pytest.param("completion", "hello world", "[hello world </s>]", id="completion-on-text-trains-all"),
        pytest.param("completion", Conversation([USER_HI, HELLO]),
                     "<|im_start|> user hi <|im_end|> <|im_start|> assistant [hello world <|im_end|> </s>]", id="completion-chat"),
    ],
)  # fmt: skip
def test_loss_modes(toks, loss, record, expected):
    out = SampleTokenizer(toks["chatml"], loss=loss).tokenize(window([record]))
    assert shown(toks["chatml"], out) == [expected]


def test_no_eos_when_add_eos_is_false(toks):
    out = SampleTokenizer(toks["chatml"], add_eos=False).tokenize(window(["hello world", Conversation([USER_HI, HELLO])]))
    assert shown(toks["chatml"], out) == [
        "[hello world]",
        "<|im_start|> user hi <|im_end|> <|im_start|> assistant [hello world <|im_end|>]",
    ]


def test_generation_markers_are_used_when_present(toks):
    tok = word_tokenizer("chatml")
    tok.chat_template = CHATML.replace(
        "{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}",
        "{{ '<|im_start|>' + m['role'] + '\\n' }}{% if m['role'] == 'assistant' %}{% generation %}"
        "{{ m['content'] }}{% endgeneration %}{% else %}{{ m['content'] }}{% endif %}{{ '<|im_end|>\\n' }}",
    )
    out = SampleTokenizer(tok).tokenize(window([Conversation([USER_HI, HELLO])]))
    # the markers enclose the content only: the end marker, and so the EOS, are not trained
    assert shown(tok, out) == ["<|im_start|> user hi <|im_end|> <|im_start|> assistant [hello world] <|im_end|> </s>"]
    assert out.tokens.tolist() == chat_ids(tok, [USER_HI, HELLO]) + [tok.eos_token_id]


# ---- equality with the tokenizer's own output ------------------------------------------------
CONVERSATIONS = [
    [USER_HI, HELLO],
    [{"role": "system", "content": "you are a helpful bot"}, USER_HI, HELLO, {"role": "user", "content": "why ?"},
     {"role": "assistant", "content": "because the sky is blue"}],
    [{"role": "user", "content": "tell me a story"}, {"role": "assistant", "content": "once upon a time"}],
]  # fmt: skip


def chat_ids(tok, messages, **kwargs):
    out = tok.apply_chat_template(messages, tokenize=True, **kwargs)
    return list(out["input_ids"] if hasattr(out, "keys") else out)  # BatchEncoding in transformers 5


def with_eos(ids, eos):
    return ids if ids and ids[-1] == eos else ids + [eos]


@pytest.mark.parametrize("style", ["chatml", "gemma", "llama2"])
def test_tokens_equal_the_tokenizers_own(toks, style):
    tok = toks[style]
    texts = ["hello world", "the cat sat on the mat .", "once upon a time there was a fox"]
    pcs = [PromptCompletion("what color is the sky ?", " blue"), PromptCompletion("two plus two", " equals four .")]
    convs = [Conversation(m) for m in CONVERSATIONS]
    conv_pcs = [PromptCompletion(m[:-1], m[-1:]) for m in CONVERSATIONS]
    records = texts + pcs + convs + conv_pcs
    out = SampleTokenizer(tok).tokenize(window(records, first_id=100))
    check_invariants(out)
    assert out.skips == [] and list(out.sample_ids) == list(range(100, 100 + len(records)))  # record order kept
    expected = (
        [tok(t)["input_ids"] for t in texts]
        + [tok(p.prompt + p.completion)["input_ids"] for p in pcs]
        + [chat_ids(tok, c.messages) for c in convs]
        + [chat_ids(tok, p.prompt + p.completion) for p in conv_pcs]
    )
    for i, ids in enumerate(expected):
        assert sample(out, i)[0].tolist() == with_eos(ids, tok.eos_token_id)


# ---- skips -----------------------------------------------------------------------------------
def test_skips_are_reported_and_the_rest_kept(toks):
    records = [
        Conversation([USER_HI]),  # no assistant turn
        "hello world",
        "hi \ud800 there",  # a lone surrogate (JSON "\\ud800"): the tokenizer refuses it
        Conversation([USER_HI, USER_HI]),  # llama2's template raises: roles must alternate
    ]
    out = SampleTokenizer(toks["llama2"]).tokenize(window(records, first_id=7))
    assert list(out.sample_ids) == [8]
    assert [(s.sample_id, s.reason) for s in out.skips] == [
        (7, "no_trained_tokens"),
        (9, "tokenizer_error"),
        (10, "template_error"),
    ]
    assert "alternate" in out.skips[2].detail and out.skips[0].source == "mem.jsonl" and out.skips[2].row == 3


def test_sample_trained_only_at_its_first_token_is_skipped(toks):
    # the packer masks every first label, so a 1-token sample would train nothing
    out = SampleTokenizer(toks["chatml"], add_eos=False).tokenize(window(["hello", "hello world"]))
    assert list(out.sample_ids) == [1] and out.skips[0].reason == "no_trained_tokens"


def test_strict_tokenization_error_names_file_and_line(toks, tmp_path):
    path = tmp_path / "chat.jsonl"
    path.write_text("\n".join(json.dumps({"messages": m}) for m in [[USER_HI, HELLO], [USER_HI]]) + "\n")
    raw = read_window(plan_windows([str(path)], window_samples=8)[0], strict=True)
    with pytest.raises(BadSampleError, match=r"chat\.jsonl: row 1 \(line 2\), sample 1: no_trained_tokens"):
        SampleTokenizer(toks["chatml"], strict=True).tokenize(raw)
    assert len(SampleTokenizer(toks["chatml"]).tokenize(raw).skips) == 1


def test_template_that_is_not_prefix_preserving_raises(toks):
    tok = word_tokenizer("chatml")
    tok.chat_template = "{{ messages | length }}" + CHATML  # the message count changes the first character
    with pytest.raises(ChatTemplateError, match=r"mem\.jsonl: row 0.*not prefix-preserving.*loss='all'"):
        SampleTokenizer(tok).tokenize(window([Conversation([USER_HI, HELLO])]))
    assert len(SampleTokenizer(tok, loss="all").tokenize(window([Conversation([USER_HI, HELLO])]))) == 1


def test_chat_sample_without_a_chat_template_is_a_clear_error():
    tok = word_tokenizer("chatml")
    tok.chat_template = None
    with pytest.raises(ChatTemplateError, match="no chat template"):
        SampleTokenizer(tok).tokenize(window([Conversation([USER_HI, HELLO])]))


def test_empty_window(toks):
    out = SampleTokenizer(toks["chatml"]).tokenize(window([]))
    assert len(out) == 0 and out.offsets.tolist() == [0] and len(out.tokens) == 0


def test_properties_and_arguments(toks):
    st_ = SampleTokenizer(toks["chatml"])
    tok = toks["chatml"]
    assert (st_.pad_id, st_.eos_id, st_.vocab_size) == (tok.pad_token_id, tok.eos_token_id, len(tok))
    assert SampleTokenizer(toks["llama2"]).pad_id == toks["llama2"].eos_token_id  # no pad token: eos
    with pytest.raises(ValueError, match="loss must be one of"):
        SampleTokenizer(tok, loss="assistant")
    no_eos = word_tokenizer("chatml")
    no_eos.eos_token = None
    with pytest.raises(ValueError, match="no eos token"):
        SampleTokenizer(no_eos)


# ---- property: read + tokenize keeps or skips every row exactly once -------------------------
CHAT_ROWS = {
    "good": ({"messages": [USER_HI, HELLO]}, None),
    "no_assistant": ({"messages": [USER_HI]}, "no_trained_tokens"),
    "robot": ({"messages": [USER_HI, {"role": "robot", "content": "x"}]}, "unknown_role"),
    "blank": (b"", "blank_line"),
    "broken": (b'{"messages": [', "malformed_json"),
    "surrogate": ({"messages": [{"role": "user", "content": "\ud800"}, HELLO]}, "tokenizer_error"),
}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(files=st.lists(st.lists(st.sampled_from(sorted(CHAT_ROWS)), min_size=1, max_size=8), min_size=1, max_size=3),
       window_samples=st.integers(1, 9))  # fmt: skip
def test_read_and_tokenize_account_for_every_row(toks, tmp_path_factory, files, window_samples):
    d = tmp_path_factory.mktemp("rows")
    inputs, expected = [], {}
    for k, kinds in enumerate(files):
        lines = []
        for kind in kinds:
            row, reason = CHAT_ROWS[kind]
            lines.append(row if isinstance(row, bytes) else json.dumps(row).encode())
            expected[len(expected)] = reason
        (d / f"{k}.jsonl").write_bytes(b"".join(line + b"\n" for line in lines))
        inputs.append(str(d / f"{k}.jsonl"))
    tokenizer = SampleTokenizer(toks["chatml"])
    seen = {}
    for spec in plan_windows(inputs, window_samples=window_samples, format="messages"):
        raw = read_window(spec)
        out = tokenizer.tokenize(raw)
        check_invariants(out)
        for sid in out.sample_ids.tolist():
            assert sid not in seen
            seen[sid] = None
        for skip in raw.skips + out.skips:
            assert skip.sample_id not in seen
            seen[skip.sample_id] = skip.reason
    assert seen == expected


# ---- property: random conversations ----------------------------------------------------------
END = {"chatml": "<|im_end|>", "gemma": "<end_of_turn>"}
plain_words = [w for w in WORDS if w.isalpha()]
contents = st.lists(st.sampled_from(plain_words), min_size=1, max_size=5).map(" ".join)


@st.composite
def conversations(draw):
    messages = [{"role": "system", "content": draw(contents)}] if draw(st.booleans()) else []
    for turn in range(draw(st.integers(1, 4))):
        messages.append({"role": "user", "content": draw(contents)})
        messages.append({"role": "assistant", "content": draw(contents)})
    if draw(st.booleans()):
        messages.append({"role": "user", "content": draw(contents)})
    return messages


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(convs=st.lists(conversations(), min_size=1, max_size=6), style=st.sampled_from(["chatml", "gemma"]))
def test_random_conversations_train_exactly_the_assistant_turns(toks, convs, style):
    tok = toks[style]
    out = SampleTokenizer(tok).tokenize(window([Conversation(m) for m in convs]))
    check_invariants(out)
    assert out.skips == [] and len(out) == len(convs)
    for i, messages in enumerate(convs):
        tokens, labels = sample(out, i)
        assert tokens.tolist() == chat_ids(tok, messages) + [tok.eos_token_id]
        expected = [w for m in messages if m["role"] == "assistant" for w in m["content"].split() + [END[style]]]
        if messages[-1]["role"] == "assistant":
            expected.append(tok.eos_token)
        assert tok.convert_ids_to_tokens(labels[labels != IGNORE_INDEX].tolist()) == expected


# ---- span edges: the fast path (char_to_token at the edges) equals reading every offset -------
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), style=st.sampled_from(["chatml", "gemma"]))
def test_span_edges_match_offsets(toks, data, style):
    from packfeed.service.tokenize.encoders import span_tokens, span_tokens_from_offsets

    words = data.draw(st.lists(st.sampled_from(plain_words + ["<|im_end|>", "<end_of_turn>"]), min_size=1, max_size=12))
    gaps = data.draw(st.lists(st.sampled_from([" ", "\n", "          ", ""]), min_size=len(words), max_size=len(words)))
    text = "".join(g + w for g, w in zip(gaps, words))
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), min_size=2, max_size=6, unique=True)))
    spans = [(a, b) for a, b in zip(cuts[::2], cuts[1::2]) if b > a]
    enc = toks[style].backend_tokenizer.encode(text, add_special_tokens=False)
    assert span_tokens(enc, spans) == span_tokens_from_offsets(enc, spans)


def test_completion_starting_with_uncovered_characters(toks):
    # the WordLevel pre-tokenizer drops spaces: the first completion token is 11 characters in
    out = SampleTokenizer(toks["chatml"]).tokenize(window([PromptCompletion("the sky is", "           blue")]))
    assert shown(toks["chatml"], out) == ["the sky is [blue </s>]"]


@pytest.mark.parametrize(
    "lengths, ids, trained, expected_ids, expected_trained",
    [
        pytest.param([2, 1], [5, 6, 7], [1, 1, 0], [5, 6, 0, 7, 0], [1, 1, 1, 0, 0], id="eos-trained-like-the-token-before"),
        pytest.param([2, 0, 1], [5, 0, 7], [1, 1, 1], [5, 0, 0, 7, 0], [1, 1, 0, 1, 1], id="ends-with-eos-and-empty"),
    ],
)  # fmt: skip
def test_append_eos(lengths, ids, trained, expected_ids, expected_trained):
    from packfeed.service.tokenize.masks import append_eos

    new_lengths, out_ids, out_trained = append_eos(
        np.asarray(lengths, np.int64), np.asarray(ids, np.int32), np.asarray(trained, bool), 0
    )
    assert out_ids.tolist() == expected_ids and out_trained.astype(int).tolist() == expected_trained
    assert out_ids.dtype == np.int32 and new_lengths.sum() == len(out_ids)


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_ranges_to_mask_equals_a_per_token_union(data):
    from packfeed.service.tokenize.masks import ranges_to_mask

    lengths = data.draw(st.lists(st.integers(0, 12), min_size=1, max_size=6))
    ranges = [data.draw(st.lists(st.tuples(st.integers(0, n), st.integers(0, n)), max_size=3)) for n in lengths]
    expected = [any(a <= t < b for a, b in rs) for n, rs in zip(lengths, ranges) for t in range(n)]
    assert ranges_to_mask(np.asarray(lengths, np.int64), ranges).tolist() == expected


# ---- the renderer equals apply_chat_template -------------------------------------------------
TOOLS = [{"type": "function", "function": {"name": "add", "description": "a + b",
                                           "parameters": {"type": "object", "properties": {"a": {"type": "number"}}}}}]
RENDER_CASES = [  # (messages as records.py returns them, tools)
    ([USER_HI, HELLO], None),
    ([{"role": "system", "content": ""}, USER_HI, HELLO, {"role": "user", "content": "why ?"}], None),
    ([USER_HI, {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
        "name": "add", "arguments": {"a": 1}}}]}, {"role": "tool", "content": "1"}, HELLO], TOOLS),
    ([USER_HI, {"role": "assistant", "content": "ok", "reasoning_content": "think first"}], None),
    ([{"role": "assistant", "content": "I open"}, USER_HI], TOOLS),
]  # fmt: skip
LOOPS = (  # a template with variables it sets, namespaces and loop state
    "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{{ loop.index ~ m.role ~ ':' }}"
    "{{ m.content | trim }}{% if m.reasoning_content is defined %}({{ m.reasoning_content }}){% endif %}"
    "{% if m.tool_calls %}{{ m.tool_calls | tojson }}{% endif %}\n{% endfor %}{{ ns.n }}{{ eos_token }}"
    "{% if tools %}{{ tools | length }}{% endif %}{% if add_generation_prompt %}assistant:{% endif %}"
)


@pytest.mark.parametrize("template", ["chatml", "gemma", "qwen2.5", "loops", "by-name"])
def test_the_renderer_gives_apply_chat_templates_text(toks, template, tmp_path):
    """ChatRenderer renders with the compiled template's own render function and skips the copy
    of plain messages: the text must stay apply_chat_template's, with and without a generation
    prompt, tools, tool calls and reasoning, and on a second call (the cached template)."""
    from transformers import AutoTokenizer

    from packfeed.service.tokenize.chat import ChatRenderer

    if template == "qwen2.5":
        tok = AutoTokenizer.from_pretrained(qwen_tokenizer_dir(str(tmp_path)))
    else:
        tok = word_tokenizer("gemma" if template == "gemma" else "chatml")
        if template == "loops":
            tok.chat_template = LOOPS
        elif template == "by-name":  # a dict of templates: tools choose "tool_use"
            tok.chat_template = {"default": CHATML, "tool_use": LOOPS}
    renderer = ChatRenderer(tok, template)
    for messages, tools in RENDER_CASES * 2:
        for generation_prompt in (False, True):
            expected = tok.apply_chat_template(messages, tools=tools, tokenize=False,
                                               add_generation_prompt=generation_prompt)  # fmt: skip
            prepared, _, render, _ = renderer._prepared(messages, tools)
            assert render(prepared, generation_prompt) == expected
        assert renderer.conversation(messages, tools, True)[0] == tok.apply_chat_template(messages, tools=tools,
                                                                                           tokenize=False)


def test_a_template_that_raises_raises_the_same_error_through_the_renderer(toks):
    from packfeed.service.tokenize.chat import ChatRenderer

    tok = toks["llama2"]  # raises unless roles alternate user/assistant
    messages = [USER_HI, USER_HI]
    with pytest.raises(Exception) as expected:
        tok.apply_chat_template(messages, tokenize=False)
    with pytest.raises(type(expected.value), match="alternate") as got:
        ChatRenderer(tok, "llama2").render(messages, None)
    assert str(got.value) == str(expected.value)

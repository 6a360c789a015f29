"""SampleTokenizer on a real 151k-vocabulary tokenizer and its chat template (Qwen2.5, built
offline from the quicktok-v1 wheel): chat tokens and masks (tools, multi-part content, scripts
and emoji), text and prompt/completion. The helpers are test_tokenize.py's."""

from __future__ import annotations

import json

import pytest

from packfeed.client.rows import IGNORE_INDEX
from packfeed.service.inputs.read import read_window
from packfeed.service.inputs.records import PromptCompletion
from packfeed.service.tokenize.samples import SampleTokenizer

from support.inputs import plan_windows
from support.tokenizers import qwen_tokenizer_dir, sample
from test_tokenize import chat_ids, check_invariants, window


# ---- a real 151k-vocabulary tokenizer and template (Qwen2.5) ---------------------------------
@pytest.fixture(scope="session")
def qwen(tmp_path_factory):
    # built from the quicktok-v1 wheel (a dev dependency): if it is missing this errors, loudly
    path = qwen_tokenizer_dir(str(tmp_path_factory.mktemp("qwen")))
    return SampleTokenizer(path)  # loaded through AutoTokenizer.from_pretrained(dir)


QWEN_CONVS = [
    [{"role": "user", "content": "What color is the sky?"}, {"role": "assistant", "content": "Blue, mostly."}],
    [{"role": "system", "content": "Be brief."},
     {"role": "user", "content": [{"type": "text", "text": "Two plus "}, {"type": "text", "text": "two?"}]},
     {"role": "assistant", "content": "4"}, {"role": "user", "content": "Times 3?"},
     {"role": "assistant", "content": "12 — 日本語 too 🚀"}],
    [{"role": "user", "content": "Weather in Paris?"},
     {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "weather", "arguments": {"city": "Paris"}}}]},
     {"role": "tool", "content": "18C, sunny"}, {"role": "assistant", "content": "It is 18C and sunny."}],
]  # fmt: skip
QWEN_TOOLS = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]


def test_qwen_chat_tokens_and_masks(qwen, tmp_path):
    tok = qwen.tokenizer
    rows = [{"messages": m} for m in QWEN_CONVS] + [{"messages": QWEN_CONVS[2], "tools": QWEN_TOOLS}]
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    raw = read_window(plan_windows([str(path)], window_samples=16)[0])
    out = qwen.tokenize(raw)
    check_invariants(out)
    assert out.skips == [] and len(out) == len(rows)
    assert out.tokens.max() < qwen.vocab_size == len(tok) and qwen.eos_id == tok.convert_tokens_to_ids("<|endoftext|>")
    for i, record in enumerate(raw.records):
        tokens, labels = sample(out, i)
        assert tokens.tolist() == chat_ids(tok, record.messages, tools=record.tools) + [qwen.eos_id]
    # trained text = each assistant turn after its "<|im_start|>assistant\n" header, end marker included
    trained = [tok.decode(sample(out, i)[1][sample(out, i)[1] != IGNORE_INDEX]) for i in range(2)]
    assert trained == [
        "Blue, mostly.<|im_end|>\n<|endoftext|>",
        "4<|im_end|>\n12 — 日本語 too 🚀<|im_end|>\n<|endoftext|>",
    ]
    tool_sample = tok.decode(sample(out, 2)[1][sample(out, 2)[1] != IGNORE_INDEX])
    assert tool_sample.startswith("<tool_call>") and "18C, sunny" not in tool_sample  # tool output not trained


def test_qwen_text_and_prompt_completion(qwen):
    tok = qwen.tokenizer
    records = [
        "Packing keeps GPUs busy: 98% full rows.",
        PromptCompletion("The capital of France is", " Paris."),
        PromptCompletion(
            [{"role": "user", "content": "Capital of France?"}], [{"role": "assistant", "content": "Paris."}]
        ),
    ]
    out = qwen.tokenize(window(records))
    eos = qwen.eos_id
    assert sample(out, 0)[0].tolist() == tok(records[0])["input_ids"] + [eos]
    assert sample(out, 1)[0].tolist() == tok(records[1].prompt + records[1].completion)["input_ids"] + [eos]
    assert sample(out, 2)[0].tolist() == chat_ids(tok, records[2].prompt + records[2].completion) + [eos]
    decoded = [tok.decode(sample(out, i)[1][sample(out, i)[1] != IGNORE_INDEX]) for i in range(3)]
    assert decoded == [records[0] + "<|endoftext|>", " Paris.<|endoftext|>", "Paris.<|im_end|>\n<|endoftext|>"]

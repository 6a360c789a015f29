"""Preference pairs tokenized as TRL's DPOTrainer tokenizes them (trl's own functions as the
reference: ``maybe_extract_prompt``, ``_tokenize``, ``common_prefix_length``, the EOS rule of
``DPOTrainer._prepare_dataset``), for the standard, conversational and implicit-prompt forms,
on tokenizers whose templates and special tokens differ."""

from __future__ import annotations

import numpy as np
import pytest

trl_data = pytest.importorskip("trl.data_utils")

from packfeed.service.inputs.records import RECORD_PARSERS, MISSING, extract_prompt  # noqa: E402
from packfeed.service.tokenize.samples import SampleTokenizer  # noqa: E402

from support.tokenizers import word_tokenizer  # noqa: E402
from support.pairs import memory_window as window  # noqa: E402

U = [{"role": "user", "content": "what color is the sky ?"}]
ROWS = [
    {"prompt": "the sky is", "chosen": " blue .", "rejected": " not blue ."},
    {"prompt": "tell me a story", "chosen": " once upon a time", "rejected": " no"},
    {"prompt": U, "chosen": [{"role": "assistant", "content": "blue"}], "rejected": [{"role": "assistant", "content": "no"}]},
    {"prompt": [{"role": "system", "content": "be brief"}] + U, "chosen": [{"role": "assistant", "content": "blue ."}],
     "rejected": [{"role": "assistant", "content": "the sky is not blue"}]},
    {"chosen": U + [{"role": "assistant", "content": "blue"}], "rejected": U + [{"role": "assistant", "content": "no"}]},
    {"chosen": "what color is the sky ? blue", "rejected": "what color is the sky ? no"},
    {"chosen": "hello world", "rejected": "hello"},  # one is a beginning of the other
]


def trl_segments(tok, row: dict, add_eos: bool) -> tuple[list[int], list[int], int]:
    """(prompt + chosen ids, prompt + rejected ids, prompt length) as DPOTrainer builds them."""
    example = trl_data.maybe_extract_prompt(dict(row))
    conversational = trl_data.is_conversational(example)
    if not conversational and add_eos:  # DPOTrainer adds the EOS text to standard answers
        example = {k: v if k == "prompt" or v.endswith(tok.eos_token) else v + tok.eos_token for k, v in example.items()}
    kwargs = {"add_generation_prompt": True} if conversational else {}
    prompt = trl_data._tokenize(tok, example["prompt"], **kwargs)["input_ids"]
    chosen = trl_data._tokenize(tok, example["prompt"] + example["chosen"])["input_ids"]
    rejected = trl_data._tokenize(tok, example["prompt"] + example["rejected"])["input_ids"]
    p = min(trl_data.common_prefix_length(prompt, chosen), trl_data.common_prefix_length(prompt, rejected))
    return list(chosen), list(rejected), p


@pytest.mark.parametrize("style", ["chatml", "gemma", "llama2"])
@pytest.mark.parametrize("k", range(len(ROWS)))
def test_pairs_equal_trl(style, k):
    tok = word_tokenizer(style)
    row = ROWS[k]
    conversational = trl_data.is_conversational(trl_data.maybe_extract_prompt(dict(row)))
    # TRL appends EOS to standard answers only: compare conversational pairs with add_eos off
    add_eos = not conversational
    record = RECORD_PARSERS["auto"](lambda key: row.get(key, MISSING))
    out = SampleTokenizer(tok, add_eos=add_eos, backend="hf").tokenize(window([record]))
    chosen, rejected, p = trl_segments(tok, row, add_eos)
    cut = int(out.pair_chosen_lens[0])
    assert out.tokens[:cut].tolist() == chosen and out.tokens[cut:].tolist() == rejected
    assert out.pair_prompt_lens.tolist() == [p]
    trained = out.labels != -100
    assert trained.tolist() == [i >= p for i in range(len(chosen))] + [i >= p for i in range(len(rejected))]


@pytest.mark.parametrize("k", range(len(ROWS)))
def test_extract_prompt_is_trls(k):
    row = ROWS[k]
    if "prompt" in row:
        row = {"chosen": row["prompt"] + row["chosen"], "rejected": row["prompt"] + row["rejected"]}
    want = trl_data.extract_prompt(row)
    assert extract_prompt(row["chosen"], row["rejected"]) == (want["prompt"], want["chosen"], want["rejected"])


def test_all_rows_are_pairs():
    records = [RECORD_PARSERS["auto"](lambda key, r=r: r.get(key, MISSING)) for r in ROWS]
    assert {type(r).__name__ for r in records} == {"Preference"}
    assert np.all([isinstance(r.prompt, type(r.chosen)) for r in records])

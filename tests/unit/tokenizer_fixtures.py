"""Tiny tokenizers built in-process (no download), for tests that need a real HF tokenizer.

``word_tokenizer(style)`` returns a ``PreTrainedTokenizerFast`` over a word-level vocabulary
(whitespace and punctuation split, so one word = one token and goldens read by eye), with one
of three chat templates, none with ``{% generation %}`` markers:

- ``chatml``: ``<|im_start|>user\\nhi<|im_end|>\\n<|im_start|>assistant\\n...``; eos ``</s>``.
- ``gemma``: ``<bos><start_of_turn>user\\nhi<end_of_turn>\\n<start_of_turn>model\\n...``; the
  tokenizer itself adds ``<bos>`` (like Gemma), the template adds it too for chats.
- ``llama2``: ``<s>[INST] hi [/INST] hello </s>``: assistant turns end with the eos token; a
  system message goes inside the first [INST] (``<<SYS>> ... <</SYS>>``); the template raises
  unless roles alternate user/assistant.

``qwen_tokenizer_dir(out_dir)`` builds the real Qwen2.5 tokenizer (151k vocab) offline with
/work/shared/tools/make_qwen_tokenizer.py and gives it Qwen2.5's chat template (the copy that
ships with the installed ``trl``; a ChatML template of the same shape if trl is absent).

``show(tokenizer, tokens, labels)`` renders a sample as words with the trained run in
brackets: ``"<|im_start|> user hi <|im_end|> <|im_start|> assistant [hello <|im_end|> </s>]"``.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import numpy as np

QWEN_TOOL = os.environ.get("PACKFEED_QWEN_TOOL", "/work/shared/tools/make_qwen_tokenizer.py")

SPECIALS = ["<pad>", "<unk>", "<s>", "</s>", "<bos>", "<eos>", "<|im_start|>", "<|im_end|>",
            "<start_of_turn>", "<end_of_turn>", "[INST]", "[/INST]", "<<SYS>>", "<</SYS>>"]  # fmt: skip
WORDS = (
    "system user assistant model tool you are a be brief helpful bot hi hello world the sky is blue what "
    "color why because it and or not yes no ok thanks bye good morning night cat dog sat on mat "
    "two plus equals four five six seven eight nine ten one three zero answer question tell me "
    "story once upon time there was fox jumps over lazy"
).split() + list(".,!?:;'\"()-") + [str(d) for d in range(10)]

CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
GEMMA = (
    "{{ bos_token }}{% for m in messages %}{% set role = 'model' if m['role'] == 'assistant' else m['role'] %}"
    "{{ '<start_of_turn>' + role + '\\n' + m['content'] | trim + '<end_of_turn>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"
)
LLAMA2 = (
    "{% if messages[0]['role'] == 'system' %}{% set system = messages[0]['content'] %}"
    "{% set loop_messages = messages[1:] %}{% else %}{% set system = '' %}{% set loop_messages = messages %}{% endif %}"
    "{% for m in loop_messages %}"
    "{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if loop.first and system %}{% set content = '<<SYS>> ' + system + ' <</SYS>> ' + m['content'] %}"
    "{% else %}{% set content = m['content'] %}{% endif %}"
    "{% if m['role'] == 'user' %}{{ bos_token + '[INST] ' + content + ' [/INST]' }}"
    "{% else %}{{ ' ' + content + ' ' + eos_token }}{% endif %}{% endfor %}"
)
STYLES = {
    # style: (chat template, bos, eos, pad, tokenizer adds bos)
    "chatml": (CHATML, None, "</s>", "<pad>", False),
    "gemma": (GEMMA, "<bos>", "<eos>", "<pad>", True),
    "llama2": (LLAMA2, "<s>", "</s>", None, False),
}


def word_tokenizer(style: str = "chatml"):
    """A fresh PreTrainedTokenizerFast with a word-level vocabulary and the style's template."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    template, bos, eos, pad, adds_bos = STYLES[style]
    vocab = {tok: i for i, tok in enumerate(SPECIALS + WORDS)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    if adds_bos:
        backend.post_processor = processors.TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, vocab[bos])])
    kwargs = {k: v for k, v in (("bos_token", bos), ("eos_token", eos), ("pad_token", pad)) if v}
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", **kwargs)
    tok.add_special_tokens({"additional_special_tokens": [s for s in SPECIALS if s not in kwargs.values()]})
    tok.chat_template = template
    return tok


def qwen_tokenizer_dir(out_dir: str) -> str:
    """Build the Qwen2.5 tokenizer into ``out_dir`` (~3 s) with a chat template; return the dir."""
    subprocess.run([sys.executable, QWEN_TOOL, out_dir], check=True, capture_output=True)
    with open(os.path.join(out_dir, "chat_template.jinja"), "w") as f:  # read by from_pretrained
        f.write(qwen_chat_template())
    return out_dir


def qwen_chat_template() -> str:
    spec = importlib.util.find_spec("trl")
    if spec is not None and spec.submodule_search_locations:
        path = os.path.join(list(spec.submodule_search_locations)[0], "chat_templates", "qwen2_5.jinja")
        if os.path.exists(path):
            with open(path) as f:
                return f.read()
    system = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
    return (
        "{% if messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\n" + system + "<|im_end|>\\n' }}{% endif %}"
        + CHATML
    )


def show(tokenizer, tokens: np.ndarray, labels: np.ndarray) -> str:
    """Tokens as words, each run of trained tokens in brackets; checks labels == tokens there."""
    words = tokenizer.convert_ids_to_tokens([int(t) for t in tokens])
    trained = np.asarray(labels) != -100
    assert (np.asarray(labels)[trained] == np.asarray(tokens)[trained]).all(), "trained label != token"
    out = []
    for k, (w, t) in enumerate(zip(words, trained)):
        prev = bool(trained[k - 1]) if k else False
        nxt = bool(trained[k + 1]) if k + 1 < len(trained) else False
        out.append(("[" if t and not prev else "") + w + ("]" if t and not nxt else ""))
    return " ".join(out)


def sample(tokenized, i: int) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, labels) of sample i of a TokenizedSamples."""
    lo, hi = tokenized.offsets[i], tokenized.offsets[i + 1]
    return tokenized.tokens[lo:hi], tokenized.labels[lo:hi]

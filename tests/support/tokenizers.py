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

``qwen_tokenizer_dir(out_dir)`` builds the real Qwen2.5 tokenizer (151k vocab) offline from
the rank table inside the ``quicktok-v1`` wheel (a dev dependency: missing, it fails loudly)
and gives it Qwen2.5's chat template (the copy that ships with the installed ``trl``; a ChatML
template of the same shape if trl is absent). ``byte_level_bpe(...)`` builds byte-level BPEs
from explicit ranks, ``small_bpe`` and ``merge_order_trap`` two of them, for tokenizers the
fast back-end must reproduce or refuse; ``gpt2_regex_tokenizer`` one it refuses at import.

``show(tokenizer, tokens, labels)`` renders a sample as words with the trained run in
brackets: ``"<|im_start|> user hi <|im_end|> <|im_start|> assistant [hello <|im_end|> </s>]"``.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile

import numpy as np

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


# ---- byte-level BPE from a rank table (Qwen2.5 from the quicktok-v1 wheel) ---------------------
def byte_symbols() -> dict[int, str]:
    """The byte -> character table of byte-level BPE vocabularies: printable Latin-1 bytes
    stand for themselves, the 68 others for chr(256), chr(257), ... in byte order."""
    visible = set(range(0x21, 0x7F)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    hidden = (b for b in range(256) if b not in visible)
    table = {b: chr(b) for b in visible}
    table.update({b: chr(256 + k) for k, b in enumerate(hidden)})
    return table


def merges_from_ranks(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """The merge list that makes merge-order BPE equal rank-order BPE on ``ranks``.

    A token of rank r comes from merging, in rank order, only pieces of lower rank; the last
    two pieces left are its merge, listed at r. For ranks {a:0, b:1, c:2, ab:3, abc:4} ->
    [(a, b), (ab, c)].
    """
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(token) == 1:
            continue
        pieces = [token[i : i + 1] for i in range(len(token))]
        while len(pieces) > 2:
            scored = [(ranks.get(x + y, rank), i) for i, (x, y) in enumerate(zip(pieces, pieces[1:]))]
            best, i = min(scored)
            if best >= rank:
                break
            pieces[i : i + 2] = [pieces[i] + pieces[i + 1]]
        if len(pieces) != 2:
            raise ValueError(f"token {token!r} (rank {rank}) is not one merge of lower-ranked tokens: {pieces}")
        merges.append((pieces[0], pieces[1]))
    return merges


def byte_level_bpe(ranks: dict[bytes, int], pattern: str, *, specials: dict[str, int] | None = None, nfc: bool = False,
                   merges: list[tuple[bytes, bytes]] | None = None, post_processor=None):  # fmt: skip
    """A ``tokenizers.Tokenizer``: byte-level BPE over ``ranks`` (byte string -> id, the 256
    single bytes included), split first by the regex ``pattern``; ``merges`` default to the
    ones derived from the ranks."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    sym = byte_symbols()
    spell = lambda b: "".join(sym[x] for x in b)  # noqa: E731
    pairs = merges_from_ranks(ranks) if merges is None else merges
    tok = Tokenizer(models.BPE({spell(t): i for t, i in ranks.items()}, [(spell(a), spell(b)) for a, b in pairs]))
    if nfc:
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])  # fmt: skip
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = post_processor or processors.ByteLevel(trim_offsets=False)
    for content, i in sorted((specials or {}).items(), key=lambda kv: kv[1]):
        assert tok.get_vocab_size(with_added_tokens=True) == i, f"{content} must have the next id, {i}"
        tok.add_special_tokens([AddedToken(content, special=True, normalized=False)])
    return tok


def small_bpe(**kwargs):
    """A 2,000-token byte-level BPE: the lowest ranks of Qwen's vocabulary, Qwen's pattern, and
    added tokens <s>, </s>, <|im_end|> (ids 2000-2002)."""
    import quicktok

    qwen = quicktok.get_encoding("qwen3")
    ranks = {qwen.decode_single_token_bytes(i): i for i in range(2000)}
    return byte_level_bpe(ranks, kwargs.pop("pattern", qwen_pattern()),
                          specials={"<s>": 2000, "</s>": 2001, "<|im_end|>": 2002}, **kwargs)  # fmt: skip


def gpt2_regex_tokenizer():
    """The bundled demo tokenizer with the GPT-2 default pre-tokenizer (a bare ``ByteLevel``
    with its built-in regex), as it was bundled before issue 25: quicktok has no scanner for
    that grammar and refuses the import (``GPT2_BYTELEVEL_DEFAULT``). Save it with
    ``save_pretrained`` where a directory is needed."""
    from tokenizers import pre_tokenizers
    from transformers import AutoTokenizer

    from packfeed.service.assets import demo_tokenizer_path

    tok = AutoTokenizer.from_pretrained(demo_tokenizer_path())
    tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    return tok


def merge_order_trap():
    """Ranks put "qz" before "zx", the merge list the opposite: HF and quicktok split "qzx"
    differently, and no stress text holds it. Only data holding "qzx" tells them apart."""
    ranks = {bytes([b]): b for b in range(256)} | {b"qz": 256, b"zx": 257}
    backend = byte_level_bpe(ranks, qwen_pattern(), specials={"</s>": 258}, merges=[(b"z", b"x"), (b"q", b"z")])
    return transformers_tokenizer(backend)


def transformers_tokenizer(backend, **kwargs):
    """``backend`` (a tokenizers.Tokenizer) as a transformers tokenizer with eos ``</s>``."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="</s>", **kwargs)


def qwen_pattern() -> str:
    """Qwen2's pre-tokenizer regex, as quicktok recognises it."""
    from quicktok import _import_core

    return _import_core.QWEN_PAT


_QWEN_BUILT: list[str] = []  # the first build of this process, copied for later callers


def qwen_tokenizer_dir(out_dir: str) -> str:
    """Build the Qwen2.5 tokenizer into ``out_dir`` (~5 s, once per process) with its chat
    template; return the dir (for ``AutoTokenizer.from_pretrained``)."""
    if _QWEN_BUILT:
        shutil.copytree(_QWEN_BUILT[0], out_dir, dirs_exist_ok=True)
        return out_dir
    import quicktok  # quicktok-v1, a dev dependency: its absence is an error, not a skip
    from transformers import PreTrainedTokenizerFast

    qwen = quicktok.get_encoding("qwen3")
    ranks = {qwen.decode_single_token_bytes(i): i for i in range(qwen.n_vocab) if not qwen.is_special_token(i)}
    specials = {s: qwen.encode_single_token(s) for s in qwen.special_tokens_set}
    backend = byte_level_bpe(ranks, qwen_pattern(), specials=specials, nfc=True)
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    tok.chat_template = qwen_chat_template()
    tok.save_pretrained(out_dir)
    cache = tempfile.mkdtemp(prefix="packfeed-qwen-")
    shutil.copytree(out_dir, cache, dirs_exist_ok=True)
    _QWEN_BUILT.append(cache)
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

"""Regenerate the bundled demo corpus and tokenizer (deterministic, offline, ~10 s).

    python -m packfeed.service.assets.build

The corpus is synthetic but learnable (arithmetic, word games, facts about a fixed set of
invented places, template stories), so a tiny model's loss visibly falls within a few hundred
steps. It covers the three sample formats: ``chat.jsonl`` (messages), ``instruct.jsonl``
(prompt + completion) and ``stories.jsonl`` (text, with a heavy tail of long documents so
the overlong policies have work to do). The tokenizer is a byte-level BPE trained on that
corpus to at most 4096 tokens (882: the corpus is small and repetitive, so its merges run out
first), with a ChatML chat template that has no generation markers.

The tokenizer splits text with Qwen2's pre-tokenizer regex (``PRETOKENIZER_PATTERN``) rather
than the GPT-2 default of a bare ``ByteLevel`` pre-tokenizer, because that is a grammar the
fast back-end (quicktok) has a scanner for: the quick start then packs on the fast path, and
``tests/unit/service/tokenize/test_tokenize_backend.py`` proves the bundled tokenizer passes its checks.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

ASSETS = Path(__file__).resolve().parent
SEED = 20261121
VOCAB_SIZE = 4096
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Qwen2's pre-tokenizer: contractions, letter runs with one leading non-letter, single digits,
# punctuation runs, newlines, spaces (quicktok's "qwen" scanner; the GPT-2 default it refuses).
PRETOKENIZER_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"""
    r"""\s+(?!\S)|\s+"""
)
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

NOUNS = (
    "river lantern garden castle harbor meadow forest engine window mountain village "
    "library market bridge tower island valley orchard kettle compass ladder mirror "
    "basket candle wagon anchor feather pebble ribbon thimble"
).split()
ADJECTIVES = (
    "quiet bright ancient small golden narrow gentle crowded hidden silver patient "
    "curious heavy distant warm"
).split()
NAMES = "Ada Bram Cora Dov Esme Finn Gala Hugo Iris Juno Kai Lena Milo Nia Otto Pia".split()
VERBS = "found carried painted repaired visited counted followed opened lost shared".split()
PLACES = {  # invented countries with fixed facts: the model can memorise them
    "Velmora": ("Tassin", "copper", "herons"),
    "Ostrany": ("Brell", "salt", "foxes"),
    "Quillan": ("Marrow", "glass", "owls"),
    "Dunfeld": ("Ester", "wool", "otters"),
    "Kareth": ("Sollun", "amber", "cranes"),
    "Ibrisa": ("Norrow", "tea", "lynxes"),
}


def _arithmetic(rng: random.Random) -> tuple[str, str]:
    a, b = rng.randint(2, 99), rng.randint(2, 99)
    op = rng.choice(["plus", "minus", "times"])
    value = {"plus": a + b, "minus": a - b, "times": a * b}[op]
    return f"What is {a} {op} {b}?", f"{a} {op} {b} is {value}."


def _sort_words(rng: random.Random) -> tuple[str, str]:
    words = rng.sample(NOUNS, rng.randint(3, 7))
    return f"Sort these words alphabetically: {', '.join(words)}.", ", ".join(sorted(words)) + "."


def _reverse(rng: random.Random) -> tuple[str, str]:
    word = rng.choice(NOUNS)
    return f"Spell the word '{word}' backwards.", f"'{word}' backwards is '{word[::-1]}'."


def _count_letters(rng: random.Random) -> tuple[str, str]:
    word = rng.choice(NOUNS)
    letter = rng.choice(sorted(set(word)))
    n = word.count(letter)
    return f"How many times does '{letter}' appear in '{word}'?", f"'{letter}' appears {n} time{'s' if n != 1 else ''} in '{word}'."


def _place_fact(rng: random.Random) -> tuple[str, str]:
    country, (capital, export, animal) = rng.choice(sorted(PLACES.items()))
    kind = rng.choice(["capital", "export", "animal"])
    if kind == "capital":
        return f"What is the capital of {country}?", f"The capital of {country} is {capital}."
    if kind == "export":
        return f"What does {country} export?", f"{country} is known for exporting {export}."
    return f"Which animal is the symbol of {country}?", f"The symbol of {country} is a pair of {animal}."


TASKS = (_arithmetic, _sort_words, _reverse, _count_letters, _place_fact)


def _sentence(rng: random.Random) -> str:
    name, verb = rng.choice(NAMES), rng.choice(VERBS)
    return (
        f"{name} {verb} the {rng.choice(ADJECTIVES)} {rng.choice(NOUNS)} near the "
        f"{rng.choice(ADJECTIVES)} {rng.choice(NOUNS)}."
    )


def _story(rng: random.Random) -> str:
    # Lengths are heavy-tailed: most stories are a paragraph, a few run to thousands of tokens.
    num_sentences = min(int(rng.paretovariate(1.2) * 4), 400)
    country, (capital, export, animal) = rng.choice(sorted(PLACES.items()))
    opening = f"In {capital}, the capital of {country}, people trade {export} and watch {animal}."
    return " ".join([opening] + [_sentence(rng) for _ in range(num_sentences)])


def make_corpus(rng: random.Random) -> dict[str, list[dict]]:
    chat, instruct, stories = [], [], []
    for _ in range(3000):
        turns = []
        if rng.random() < 0.3:
            turns.append({"role": "system", "content": "You are a precise and brief assistant."})
        for _ in range(rng.choice([1, 1, 1, 2, 3])):
            question, answer = rng.choice(TASKS)(rng)
            turns += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
        chat.append({"messages": turns})
    for _ in range(3000):
        question, answer = rng.choice(TASKS)(rng)
        instruct.append({"prompt": f"Question: {question}\nAnswer:", "completion": f" {answer}"})
    for _ in range(1500):
        stories.append({"text": _story(rng)})
    return {"chat.jsonl": chat, "instruct.jsonl": instruct, "stories.jsonl": stories}


def train_tokenizer(texts: list[str], out_dir: Path) -> int:
    """Train and save the tokenizer; returns its vocabulary size (added tokens included)."""
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZER_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])  # fmt: skip
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        model_max_length=32768,
    )
    fast.chat_template = CHATML_TEMPLATE
    fast.save_pretrained(str(out_dir))
    return tok.get_vocab_size(with_added_tokens=True)


def main(assets: Path = ASSETS) -> None:
    """Write the corpus and the tokenizer under ``assets`` (the package's own directory by default)."""
    rng = random.Random(SEED)
    corpus = make_corpus(rng)
    (assets / "corpus").mkdir(parents=True, exist_ok=True)
    texts = []
    for name, records in corpus.items():
        with open(assets / "corpus" / name, "w", encoding="utf-8") as f:
            for record in records:
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
        for record in records:
            texts.append(json.dumps(record, ensure_ascii=False))
    vocab_size = train_tokenizer(texts, assets / "tokenizer")
    print(f"wrote {sum(map(len, corpus.values()))} samples and a {vocab_size}-token tokenizer under {assets}")


if __name__ == "__main__":
    main()

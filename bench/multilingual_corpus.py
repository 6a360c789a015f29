"""A multilingual bench corpus (issue 41, item 4): the kinds of text the fast back-end had not seen.

Deterministic (``seed``), offline, no download, not drawn from any tokenizer's vocabulary: words
are recombined from syllables and characters of several scripts, so no vocabulary fits them
better than another. Per sample, a mix of:

- Latin with accents (French, German, Vietnamese-like stacks of marks), Cyrillic, Greek, Arabic
  (with and without harakat), Hebrew, Devanagari, CJK ideographs, kana, Hangul, digits, code;
- emoji: single ones, skin tones, ZWJ families, flags, keycaps;
- special-token lookalikes inside the text: markers of several chat formats, real ones of
  some tokenizers (``<|im_start|>``, ``<|endoftext|>``, ``[INST]``, ``<s>``...) and near
  misses (``<|im_star|>``, ``< |im_end| >``);
- in ``NFD_SHARE`` (30%) of the samples, snippets in decomposed form (NFD: combining accents,
  Hangul jamo), which an NFC normalizer changes.

Formats, by share of characters: text ``{"text"}`` (~40%), chats ``{"messages"}`` with a system
turn and one or two user/assistant exchanges (~40%), prompt/completion (~20%); written as three
JSONL files. ``write_multilingual(work, tokens)`` sizes them for about ``tokens`` Qwen2.5 tokens
(~2.9 characters a token on this mix).

    .venv/bin/python bench/multilingual_corpus.py /tmp/ml 2000000   # writes the three files
"""

from __future__ import annotations

import json
import random
import re
import sys
import sysconfig
import unicodedata
from pathlib import Path

NFD_SHARE = 0.3
CHARS_PER_TOKEN = 2.9  # this mix with Qwen2.5's vocabulary (measured 2.8-2.9); only sizes the corpus

LATIN = ("ba be bi bo bu da de di do du fa fe la le li lo lu ma me mi mo na ne ni no ra re ri ro sa se si so "
         "ta te ti to tra tre stra sch ch qu gn ll rr ss th ph").split()
ACCENTED = "àâäéèêëîïôöùûüçñßøåæœãõáíóúýěščřžůąęłńśźżőűğışə"
VIETNAMESE = "ạảấầẩẫậắằẳẵặẹẻẽếềểễệỉịọỏốồổỗộớờởỡợụủứừửữựỳỵỷỹ"
CYRILLIC = "абвгдеёжзийклмнопрстуфхцчшщъыьэюяієїґў"
GREEK = "αβγδεζηθικλμνξοπρστυφχψωάέήίόύώϊϋΐΰ"
ARABIC = "ابتثجحخدذرزسشصضطظعغفقكلمنهويءآأؤإئةى"
HARAKAT = "\u064b\u064c\u064d\u064e\u064f\u0650\u0651\u0652"
HEBREW = "אבגדהוזחטיכלמנסעפצקרשתךםןףץ"
DEVANAGARI = "कखगघचछजझटठडढणतथदधनपफबभमयरलवशषसह"
MATRAS = "ािीुूेैोौं्"
KANA = "あいうえおかきくけこさしすせそたちつてとなにぬねのはひふへほまみむめもやゆよらりるれろわをんアイウエオカキクケコサシスセソ"
DIGITS = "0123456789٠١٢٣٤٥٦٧٨٩०१२३४५"
PUNCT = [". ", ", ", "! ", "? ", "; ", ": ", "。", "、", "！", "؟ ", "، ", " — ", "… "]
EMOJI = ["😀", "🚀", "🔥", "🎉", "❤️", "👍🏽", "👩🏾‍💻", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇫🇷", "🇯🇵", "1️⃣", "🧑🏻‍🤝‍🧑🏿",
         "✨", "🤖", "🌍", "☕", "🐍", "👁️‍🗨️", "🙂"]
LOOKALIKES = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_sep|>", "<|eot_id|>", "<|begin_of_text|>",
              "<s>", "</s>", "[INST]", "[/INST]", "<<SYS>>", "<start_of_turn>", "<|im_star|>", "< |im_end| >",
              "<|user|>", "<|assistant|>", "<|fim_prefix|>", "<pad>", "<|endofprompt|>", "</|im_end|>"]
CODE = ["def f(x):\n    return x * 2\n", "for (int i = 0; i < n; ++i) {\n  s += a[i];\n}\n",
        "SELECT name, COUNT(*) FROM t GROUP BY name;\n", "let v = vec![1, 2, 3];\n", "{\"key\": [1, 2.5, null]}\n"]


_ENGLISH: list[str] = []


def english_words(limit: int = 20000) -> list[str]:
    """Distinct words of the Python standard library's text files and docstrings (the first
    ``limit``, in a fixed order): real English to recombine, found offline on any machine."""
    if not _ENGLISH:
        seen: dict[str, None] = {}
        root = Path(sysconfig.get_paths()["stdlib"])
        for path in sorted(root.rglob("*.py")):
            if "site-packages" in path.parts or "test" in path.parts:
                continue
            for w in re.findall(r"[A-Za-z][a-z]{1,14}", path.read_text(encoding="utf-8", errors="ignore")):
                seen.setdefault(w, None)
            if len(seen) >= limit:
                break
        _ENGLISH.extend(list(seen)[:limit])
    return _ENGLISH


def _pick(rng: random.Random, chars: str, lo: int, hi: int) -> str:
    return "".join(rng.choice(chars) for _ in range(rng.randint(lo, hi)))


def _word(rng: random.Random, script: str) -> str:
    """One made-up word of ``script``: syllables or characters recombined, never a list of known words."""
    if script == "english":
        return rng.choice(english_words())
    if script == "latin":
        w = "".join(rng.choice(LATIN) for _ in range(rng.randint(1, 4)))
        if rng.random() < 0.4:
            k = rng.randrange(len(w))
            w = w[:k] + rng.choice(ACCENTED) + w[k + 1:]
        return w.capitalize() if rng.random() < 0.15 else w
    if script == "vietnamese":
        return "".join(rng.choice(LATIN)[:2] + rng.choice(VIETNAMESE) for _ in range(rng.randint(1, 2)))
    if script == "arabic":
        w = _pick(rng, ARABIC, 2, 7)
        return "".join(c + (rng.choice(HARAKAT) if rng.random() < 0.3 else "") for c in w)
    if script == "devanagari":
        return "".join(rng.choice(DEVANAGARI) + (rng.choice(MATRAS) if rng.random() < 0.6 else "")
                       for _ in range(rng.randint(1, 4)))
    if script == "cjk":
        return "".join(chr(rng.randint(0x4E00, 0x62FF)) for _ in range(rng.randint(1, 4)))
    if script == "hangul":
        return "".join(chr(rng.randint(0xAC00, 0xD7A3)) for _ in range(rng.randint(1, 3)))
    alphabet = {"cyrillic": CYRILLIC, "greek": GREEK, "hebrew": HEBREW, "kana": KANA}[script]
    return _pick(rng, alphabet, 2, 8)


# a sentence's main script: mostly words of real English (this machine's Python docs), the rest
# made-up words of other scripts; asides of any script (``ASIDES``) inside every kind of sentence
SCRIPTS = ["english"] * 14 + ["latin", "latin", "vietnamese", "cyrillic", "greek", "arabic", "hebrew", "devanagari",
                             "cjk", "cjk", "kana", "hangul"]
ASIDES = SCRIPTS[13:]
SPACELESS = {"cjk", "kana"}


def sentence(rng: random.Random, nfd: bool) -> str:
    """A sentence mostly in one script, with asides: another script, digits, emoji, a lookalike, code."""
    script = rng.choice(SCRIPTS)
    sep = "" if script in SPACELESS else " "
    parts = []
    for _ in range(rng.randint(4, 14)):
        r = rng.random()
        if r < 0.06:
            parts.append(rng.choice(EMOJI))
        elif r < 0.10:
            parts.append(_pick(rng, DIGITS, 1, 5))
        elif r < 0.15:
            parts.append(_word(rng, rng.choice(ASIDES)))
        elif r < 0.17:
            parts.append(rng.choice(LOOKALIKES))
        else:
            parts.append(_word(rng, script))
    text = sep.join(parts) + rng.choice(PUNCT)
    if rng.random() < 0.03:
        text += "\n" + rng.choice(CODE)
    if nfd and rng.random() < 0.5:  # a decomposed snippet: what an NFC normalizer changes
        text = unicodedata.normalize("NFD", text)
    return text


def paragraph(rng: random.Random, chars: int, nfd: bool) -> str:
    out, n = [], 0
    while n < chars:
        s = sentence(rng, nfd)
        if rng.random() < 0.1:
            s += "\n\n"
        out.append(s)
        n += len(s)
    return "".join(out).strip()


SYSTEMS = ["You are a helpful multilingual assistant.", "Réponds brièvement, en français.", "Отвечай по-русски.",
           "あなたは親切なアシスタントです。", "أنت مساعد مفيد.", "Answer in the user's language; keep <|im_end|> literal."]


def records(seed: int, chars: int, kind: str):
    """JSON records of one format (``text``, ``chat``, ``prompt_completion``), ``chars`` characters in all."""
    rng = random.Random(f"{seed}-{kind}")
    total = 0
    while total < chars:
        nfd = rng.random() < NFD_SHARE
        size = int(rng.lognormvariate(6.6, 0.8))  # ~700 characters, a long tail
        if kind == "text":
            rec = {"text": paragraph(rng, size, nfd)}
        elif kind == "chat":
            system = rng.choice(SYSTEMS)
            messages = [{"role": "system", "content": unicodedata.normalize("NFD", system) if nfd else system}]
            for _ in range(rng.randint(1, 2)):
                messages += [{"role": "user", "content": paragraph(rng, size // 4, nfd)},
                             {"role": "assistant", "content": paragraph(rng, size, nfd)}]
            rec = {"messages": messages}
        else:
            rec = {"prompt": paragraph(rng, size // 3, nfd) + "\n", "completion": paragraph(rng, size, nfd)}
        total += sum(len(v) if isinstance(v, str) else sum(len(m["content"]) for m in v) for v in rec.values())
        yield rec


SHARES = {"text": 0.4, "chat": 0.4, "prompt_completion": 0.2}


def write_multilingual(work: Path, tokens: int, seed: int = 0) -> dict[str, Path]:
    """The three JSONL files (text, chat, prompt_completion) of about ``tokens`` tokens in all."""
    work.mkdir(parents=True, exist_ok=True)
    out = {}
    for kind, share in SHARES.items():
        path = work / f"ml_{kind}.jsonl"
        with open(path, "w", encoding="utf-8") as f:
            for rec in records(seed, int(tokens * share * CHARS_PER_TOKEN), kind):
                f.write(json.dumps(rec, ensure_ascii=False) + "\n")
        out[kind] = path
    return out


if __name__ == "__main__":
    for kind, path in write_multilingual(Path(sys.argv[1]), int(sys.argv[2])).items():
        print(kind, path, path.stat().st_size)

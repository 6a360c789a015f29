"""A chat-heavy bench corpus (issue 54, item 5): what a user with chat data packs.

Deterministic (``seed``), offline, no download. Three JSONL files, by share of samples:

- ``chat`` (~61%): short conversations with a system turn, one or two user/assistant exchanges
  of English sentences recombined from this machine's Python docs (``multilingual_corpus``'s
  word list), ~90 Qwen2.5 tokens each;
- ``text`` (~25%): Python source chunks of this machine's standard library (up to 1,500
  characters, cut at line boundaries);
- ``prompt_completion`` (~14%): a question and its answer, plain strings.

``chat_tokenizer(qwen_dir, out)``: Qwen2.5's tokenizer with ``QWEN_REWRITTEN`` as its chat template:
Qwen2.5's rendering (ChatML with its default system turn) in other Jinja (other variable
names, whitespace control and quotes), so that no template hash knows it (tokenize/chat.py)
and only what it renders can.

    .venv/bin/python bench/chat_corpus.py /tmp/chat 2000000   # writes the three files
"""

from __future__ import annotations

import itertools
import json
import random
import shutil
import sys
from pathlib import Path

from multilingual_corpus import english_words

TOKENS_PER_CHAT = 90  # with Qwen2.5's template and vocabulary (its default system turn aside); sizes the corpus
SHARES = {"chat": 0.61, "text": 0.25, "prompt_completion": 0.14}

QWEN_REWRITTEN = (
    "{%- set ns = namespace(opened=false) -%}\n"
    "{%- for turn in messages -%}\n"
    "  {%- if loop.first and turn.role != \"system\" -%}\n"
    "    {{- \"<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. \"\n"
    "        ~ \"You are a helpful assistant.<|im_end|>\\n\" -}}\n"
    "  {%- endif -%}\n"
    "  {{- \"<|im_start|>\" ~ turn.role ~ \"\\n\" ~ turn.content ~ \"<|im_end|>\" ~ \"\\n\" -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}{{- \"<|im_start|>assistant\\n\" -}}{%- endif -%}\n"
)
SYSTEMS = ["You are a helpful assistant.", "You are a concise assistant. Answer in one or two sentences.",
           "You help with Python questions.", "Be brief and friendly."]


def chat_tokenizer(qwen_dir: str, out: Path) -> str:
    """A copy of the tokenizer at ``qwen_dir`` whose chat template is ``QWEN_REWRITTEN``."""
    out.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(Path(qwen_dir) / name, out / name)
    config = json.loads((out / "tokenizer_config.json").read_text())
    config["chat_template"] = QWEN_REWRITTEN
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    (out / "chat_template.jinja").unlink(missing_ok=True)
    return str(out)


def _sentence(rng: random.Random, lo: int, hi: int) -> str:
    words = english_words()
    return " ".join(rng.choice(words) for _ in range(rng.randint(lo, hi))).capitalize() + rng.choice(".?!")


def _sources(rng: random.Random):
    """Python source chunks of up to 1,500 characters, at line boundaries, in a seeded order."""
    import sysconfig

    root = Path(sysconfig.get_paths()["stdlib"])
    paths = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts)
    rng.shuffle(paths)
    for path in itertools.cycle(paths):
        cur, n = [], 0
        for line in path.read_text(encoding="utf-8", errors="ignore").splitlines(keepends=True):
            if n + len(line) > 1500 and cur:
                yield "".join(cur)
                cur, n = [], 0
            cur.append(line[:1500])
            n += len(cur[-1])


def write_chat_corpus(work: Path, tokens: int, seed: int = 0) -> dict[str, Path]:
    """The three JSONL files (chat, text, prompt_completion) of about ``tokens`` tokens in all."""
    work.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    chats = max(1, int(tokens * 0.45 / TOKENS_PER_CHAT))  # chats hold ~45% of the tokens at 61% of the samples
    counts = {k: max(1, int(chats * share / SHARES["chat"])) for k, share in SHARES.items()}
    out = {k: work / f"chat_{k}.jsonl" for k in SHARES}
    with open(out["chat"], "w", encoding="utf-8") as f:
        for _ in range(counts["chat"]):
            messages = [{"role": "system", "content": rng.choice(SYSTEMS)}]
            for _ in range(rng.choice((1, 1, 2))):
                messages += [{"role": "user", "content": _sentence(rng, 4, 14)},
                             {"role": "assistant", "content": " ".join(_sentence(rng, 5, 16)
                                                                        for _ in range(rng.randint(1, 3)))}]
            f.write(json.dumps({"messages": messages}) + "\n")
    with open(out["text"], "w", encoding="utf-8") as f:
        sources = _sources(rng)
        for _ in range(counts["text"]):
            f.write(json.dumps({"text": next(sources)}) + "\n")
    with open(out["prompt_completion"], "w", encoding="utf-8") as f:
        for _ in range(counts["prompt_completion"]):
            answer = " ".join(_sentence(rng, 6, 18) for _ in range(rng.randint(2, 6)))
            prompt = "Question: " + _sentence(rng, 6, 16) + "\nAnswer: "
            f.write(json.dumps({"prompt": prompt, "completion": answer}) + "\n")
    return out


if __name__ == "__main__":
    for kind, path in write_chat_corpus(Path(sys.argv[1]), int(sys.argv[2])).items():
        print(kind, path, path.stat().st_size)

"""Regenerate the bundled preference example, examples/preference.jsonl (deterministic, offline).

    python -m packfeed.service.assets.build_pairs

Preference pairs over the tasks of the demo corpus (build.py: arithmetic, word games, facts
about invented places), in the three forms a preference row may take, mixed in one file:
standard (``prompt``/``chosen``/``rejected`` strings, the prompt as in instruct.jsonl),
conversational (three message lists) and implicit prompt (only ``chosen`` and ``rejected``,
whole conversations sharing their first turns). The chosen answer is the task's correct one,
the rejected one the answer to another question of the same task: a preference a tiny model
learns within a few steps, which is what ``examples/train_dpo.toml`` shows.

The file sits in examples/, not in the corpus directory: the quick start packs
``service/assets/corpus/*.jsonl`` for supervised fine-tuning, and pairs there would change it.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from packfeed.service.assets.build import TASKS

OUT = Path(__file__).resolve().parents[2] / "examples" / "preference.jsonl"
SEED = 20261126
NUM_PAIRS = 600
SYSTEM = {"role": "system", "content": "You are a precise and brief assistant."}


def _question(rng: random.Random) -> tuple[str, str, str]:
    """A question, its answer and a wrong answer (another question's answer of the same task)."""
    task = rng.choice(TASKS)
    question, answer = task(rng)
    wrong = answer
    while wrong == answer:
        wrong = task(rng)[1]
    return question, answer, wrong


def make_pairs(rng: random.Random, n: int = NUM_PAIRS) -> list[dict]:
    """n rows: about half standard, a third conversational, the rest implicit prompt."""
    rows = []
    for _ in range(n):
        question, answer, wrong = _question(rng)
        form = rng.random()
        if form < 0.5:
            rows.append({"prompt": f"Question: {question}\nAnswer:", "chosen": f" {answer}", "rejected": f" {wrong}"})
            continue
        prompt = ([SYSTEM] if rng.random() < 0.3 else []) + [{"role": "user", "content": question}]
        chosen, rejected = [{"role": "assistant", "content": answer}], [{"role": "assistant", "content": wrong}]
        if form < 0.85:
            rows.append({"prompt": prompt, "chosen": chosen, "rejected": rejected})
        else:
            rows.append({"chosen": prompt + chosen, "rejected": prompt + rejected})
    return rows


def main(out: Path = OUT) -> None:
    rows = make_pairs(random.Random(SEED))
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"wrote {len(rows)} preference pairs to {out}")


if __name__ == "__main__":
    main()

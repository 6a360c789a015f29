"""The benchmarks' one way to print a result: a titled Markdown table (pasteable into the README);
and the reference they are measured against, raw quicktok on the same texts."""

import time
from typing import Any, Callable


def table(title: str, header: list[str], rows: list[list[str]]) -> None:
    print(f"\n{title}\n")
    print(" | ".join(header))
    print(" | ".join("---" for _ in header))
    for row in rows:
        print(" | ".join(row))


# How a chat sample is tokenized (tokenize/chat.py's ChatRenderer.paths), fastest first.
CHAT_PATHS = {"turns": "from its turns", "python": "rendered in Python", "jinja": "through Jinja"}


def chat_path_rows(tokenizers: dict) -> list[list[str]]:
    """Per loss mode of a run's ``SampleTokenizer``s: its chat samples by path, the share that
    took a slower path than their turns, and why (``ChatRenderer.reasons``; the rendered-in-Python
    samples of the fast back-end's proof need none)."""
    rows = []
    for mode, tok in tokenizers.items():
        if tok._chat is None:
            continue
        renderer = tok._renderer()
        paths, total = renderer.paths, sum(renderer.paths.values())
        slower = total - paths["turns"]
        rows.append([mode, ", ".join(f"{CHAT_PATHS.get(k, k)}: {paths[k]:,}" for k in CHAT_PATHS if paths[k]) or "-",
                     f"{slower / total:.1%}" if total else "-",
                     "; ".join(sorted(set(renderer.reasons.values()))) or "-"])
    return rows


CHAT_PATH_HEADER = ["loss mode", "chat samples by path", "slower than from its turns", "why (Jinja)"]


def raw_quicktok(quick: Any, texts: list[str], passes: int = 3,
                 clock: Callable[[], float] = time.perf_counter) -> tuple[int, float]:
    """(tokens, seconds by ``clock``) of quicktok's ``encode_batch`` on one thread, batches of
    1,024 texts: the fastest of ``passes`` passes after a warm-up batch (the machine is shared;
    ``time.process_time`` counts this process's CPU alone)."""
    quick.encode_batch(texts[:64], 1, False)
    best = None
    for _ in range(passes):
        tokens, seconds = 0, 0.0
        for i in range(0, len(texts), 1024):
            t0 = clock()
            tokens += len(quick.encode_batch(texts[i:i + 1024], 1, False)[0])
            seconds += clock() - t0
        best = min(best or seconds, seconds)
    return tokens, best

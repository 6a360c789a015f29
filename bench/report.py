"""The benchmarks' one way to print a result: a titled Markdown table (pasteable into the README)."""


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

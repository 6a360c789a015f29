"""Bundled demo assets: a small corpus and a small byte-level BPE tokenizer."""

from pathlib import Path

_HERE = Path(__file__).resolve().parent


def demo_tokenizer_path() -> str:
    """Directory of the bundled byte-level BPE tokenizer (882 tokens, Qwen2's pre-tokenizer regex,
    ChatML template): one the fast back-end accepts (build.py)."""
    return str(_HERE / "tokenizer")


def demo_corpus_paths() -> list[str]:
    """The bundled corpus: chat (messages), instruct (prompt/completion), stories (text)."""
    return [str(p) for p in sorted((_HERE / "corpus").glob("*.jsonl"))]

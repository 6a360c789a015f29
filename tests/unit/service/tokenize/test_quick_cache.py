"""quicktok's imported files are cached by tokenizer: the import runs once per backend, steps 1
and 3 every time, and a damaged entry or a cache that cannot be written costs an import, never
a wrong encoder or an error."""

from __future__ import annotations

import pytest
from support.tokenizers import small_bpe

from packfeed.service.tokenize import quick_cache
from packfeed.service.tokenize.backend import load_fast

TEXTS = ["The cat sat on the mat.", "def f(x):\n\treturn x ** 2  # 🦩", "<s>tokens</s> around<|im_end|>"]


@pytest.fixture
def imports(monkeypatch, tmp_path):
    """quicktok imports counted, the cache in tmp_path."""
    import quicktok

    monkeypatch.setenv("PACKFEED_CACHE_DIR", str(tmp_path / "cache"))
    calls = []
    real = quicktok.import_tokenizer

    def counted(*args, **kwargs):
        calls.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(quicktok, "import_tokenizer", counted)
    return calls


def ids(encoder) -> list:
    return encoder.encode(TEXTS, special=True, edges=False).ids.tolist()


def test_the_second_load_takes_the_cached_files_and_still_runs_the_stress_texts(imports):
    backend = small_bpe()
    first, checks1, files1 = load_fast(backend)
    second, checks2, files2 = load_fast(backend)
    assert len(imports) == 1
    assert (checks1["import"], checks2["import"]) == ("imported", "cached")
    assert files1 == files2 and ids(first) == ids(second)
    assert checks2["stress_edges"] == checks1["stress_edges"] > 0  # step 3 ran again, in full

    other = small_bpe(nfc=True)  # another backend JSON: another entry
    load_fast(other)
    assert len(imports) == 2 and quick_cache.entry(other.to_str(), "v") != quick_cache.entry(backend.to_str(), "v")


@pytest.mark.parametrize("damage", ["truncated", "emptied", "garbage"])
def test_a_damaged_entry_is_imported_again_and_replaced(imports, damage):
    backend = small_bpe()
    _, _, files = load_fast(backend)
    import quicktok

    entry = quick_cache.entry(backend.to_str(), quicktok.__version__)
    vocab = entry / "packfeed.vocab"
    vocab.write_bytes({"truncated": vocab.read_bytes()[:100], "emptied": b"",
                       "garbage": bytes(range(256)) * 40}[damage])  # fmt: skip
    encoder, checks, again = load_fast(backend)
    assert checks["import"] == "imported" and len(imports) == 2
    assert again == files and ids(encoder) == ids(load_fast(backend)[0])
    assert quick_cache.load(backend.to_str(), quicktok.__version__) == files, "the entry was written again"


def test_a_cache_that_cannot_be_written_costs_an_import_each_time(imports, tmp_path, monkeypatch):
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("a file where the cache directory would go")
    monkeypatch.setenv("PACKFEED_CACHE_DIR", str(blocked))
    backend = small_bpe()
    results = [load_fast(backend) for _ in range(2)]
    assert [r[1]["import"] for r in results] == ["imported", "imported"] and len(imports) == 2
    assert ids(results[0][0]) == ids(results[1][0])


def test_the_cache_lives_where_the_environment_says(monkeypatch, tmp_path):
    monkeypatch.delenv("PACKFEED_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert quick_cache.cache_root() == tmp_path / "xdg" / "packfeed" / "quicktok"
    monkeypatch.setenv("PACKFEED_CACHE_DIR", str(tmp_path / "own"))
    assert quick_cache.cache_root() == tmp_path / "own" / "quicktok"
    # the key covers quicktok's version and every byte of the backend's JSON
    assert quick_cache.entry("{}", "1") != quick_cache.entry("{}", "2") != quick_cache.entry("{ }", "2")

"""quicktok's imported files are cached by tokenizer: the import runs once per backend, and the
stress check (step 3) once per backend, files, texts and packfeed check code; a damaged entry or
a cache that cannot be written costs an import or a check, never a wrong encoder or an error."""

from __future__ import annotations

import pytest
from support.tokenizers import small_bpe

from packfeed.service.tokenize.fast import quick_cache
from packfeed.service.tokenize.fast.backend import load_fast

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


@pytest.fixture
def comparisons(monkeypatch):
    """The stress comparisons (step 3) that ran, counted."""
    from packfeed.service.tokenize.fast import backend as backend_module

    calls = []
    real = backend_module.compare_encoders

    def counted(reference, fast, texts):
        calls.append(list(texts))
        return real(reference, fast, texts)

    monkeypatch.setattr(backend_module, "compare_encoders", counted)
    return calls


def test_the_second_load_takes_the_cached_files_and_the_passed_stress_check(imports, comparisons):
    backend = small_bpe()
    first, checks1, files1 = load_fast(backend)
    second, checks2, files2 = load_fast(backend)
    assert len(imports) == 1 and len(comparisons) == 1
    assert (checks1["import"], checks2["import"]) == ("imported", "cached")
    assert (checks1["stress"], checks2["stress"]) == ("run", "passed before")
    assert files1 == files2 and ids(first) == ids(second)
    assert checks2["stress_edges"] == checks1["stress_edges"] > 0  # what the check counted, kept with it

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


def test_other_stress_texts_run_the_check_again(imports, comparisons):
    backend = small_bpe()
    load_fast(backend, texts=["<|im_start|>user\nhi<|im_end|>"])
    load_fast(backend, texts=["<|im_start|>user\nhi<|im_end|>"])
    _, checks, _ = load_fast(backend, texts=["another chat template's rendering"])
    assert len(comparisons) == 2 and checks["stress"] == "run" and len(imports) == 1


def test_a_refused_check_is_not_kept(imports, comparisons, monkeypatch):
    from packfeed.service.tokenize.fast import backend as backend_module
    from packfeed.service.tokenize.fast.checks import FastPathRefused

    counted = backend_module.compare_encoders

    def refuse_once(reference, fast, texts):
        monkeypatch.setattr(backend_module, "compare_encoders", counted)
        raise FastPathRefused("the stress texts differ (injected)")

    monkeypatch.setattr(backend_module, "compare_encoders", refuse_once)
    backend = small_bpe()
    with pytest.raises(FastPathRefused, match="injected"):
        load_fast(backend, cache=False)  # imported fresh: the refusal is final, as a real one would be
    _, checks, _ = load_fast(backend)
    assert checks["stress"] == "run" and len(comparisons) == 1


@pytest.mark.parametrize("damage", ["garbage", "not a dict", "emptied"])
def test_a_damaged_verdict_runs_the_check_again(imports, comparisons, damage):
    import quicktok

    from packfeed.service.tokenize.fast.checks import backend_spec, stress_texts

    backend = small_bpe()
    _, _, files = load_fast(backend)
    entry = quick_cache.verdict_entry(backend.to_str(), quicktok.__version__, files,
                                      stress_texts(backend_spec(backend)), threads=1)
    (entry / "checked.json").write_bytes({"garbage": b"\xff{", "not a dict": b"[1, 2]", "emptied": b""}[damage])
    _, checks, _ = load_fast(backend)
    assert checks["stress"] == "run" and len(comparisons) == 2
    _, checks, _ = load_fast(backend)  # the damaged entry was replaced
    assert checks["stress"] == "passed before" and len(comparisons) == 2


def test_the_verdict_key_covers_every_input_and_the_check_code(monkeypatch):
    files = {"packfeed.vocab": b"abc", "packfeed.merges": b"def"}
    base = quick_cache.verdict_entry("{}", "1", files, ["a", "b"])
    others = [
        quick_cache.verdict_entry("{ }", "1", files, ["a", "b"]),
        quick_cache.verdict_entry("{}", "2", files, ["a", "b"]),
        quick_cache.verdict_entry("{}", "1", {**files, "packfeed.vocab": b"abd"}, ["a", "b"]),
        quick_cache.verdict_entry("{}", "1", files, ["a", "c"]),
        quick_cache.verdict_entry("{}", "1", files, ["ab"]),
        quick_cache.verdict_entry("{}", "1", files, ["a", "b"], threads=2),
    ]
    monkeypatch.setattr(quick_cache, "_CHECK_SOURCES", (*quick_cache._CHECK_SOURCES, "quick_cache.py"))
    others.append(quick_cache.verdict_entry("{}", "1", files, ["a", "b"]))  # other check code
    assert base is not None and len({base, *others}) == len(others) + 1

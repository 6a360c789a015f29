"""`packfeed pack` with each tokenizer back-end, on a real local Ray (2 packing actors).

The fast back-end writes the HF back-end's rows byte for byte (every column) on the bundled
corpus's first lines (each of its formats, 3 windows) with the real Qwen2.5 tokenizer; stats.json says which back-end packed each window and
what each actor verified; the stream's config hash does not depend on the back-end. A
tokenizer the fast path cannot reproduce is packed by HF under ``auto`` and stops the run
under ``fast``, with the reason, whether it is refused at load or by the first window's data.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from support.tokenizers import gpt2_regex_tokenizer, merge_order_trap, qwen_tokenizer_dir
from support.train import corpus_head

from packfeed.service.assets import demo_corpus_paths, demo_tokenizer_path
from packfeed.service.cli import main
from packfeed.service.packed.writer import read_packed_dir

pytestmark = pytest.mark.integration

COLUMNS = ("input_ids", "labels", "position_ids", "seq_lens", "sample_ids", "row_index")
LINES = 800  # of each bundled file, for the three back-ends' packs with the real Qwen2.5 tokenizer


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory) -> str:
    return qwen_tokenizer_dir(str(tmp_path_factory.mktemp("qwen")))


def pack(inputs, tokenizer: str, out: Path, backend: str, *extra: str) -> int:
    return main(["pack", *inputs, "--tokenizer", tokenizer, "--seq-len", "1024", "--window-samples", "1024",
                 "--num-workers", "2", "--tokenizer-backend", backend, "--output", str(out), *extra])  # fmt: skip


def test_every_back_end_packs_the_same_rows(ray_cluster, qwen_dir, tmp_path):
    # the first 800 lines of each bundled file (of its three formats): 3 windows, both actors
    inputs = corpus_head(tmp_path / "corpus", LINES)
    outputs = {}
    for backend in ("hf", "fast", "auto"):
        assert pack(inputs, qwen_dir, tmp_path / backend, backend, "--validate") == 0
        outputs[backend] = (
            read_packed_dir(tmp_path / backend),
            json.loads((tmp_path / backend / ".packfeed" / "stats.json").read_text()),
            json.loads((tmp_path / backend / ".packfeed" / "config.json").read_text()),
        )
    rows_hf, stats_hf, config_hf = outputs["hf"]
    assert stats_hf["samples_packed"] == 3 * LINES and stats_hf["trained_tokens"] < stats_hf["tokens"]
    assert stats_hf["windows"] == 3
    for backend in ("fast", "auto"):
        rows, stats, config = outputs[backend]
        for column in COLUMNS:
            assert np.array_equal(getattr(rows, column), getattr(rows_hf, column)), (backend, column)
        assert config["config_hash"] == config_hf["config_hash"]
        assert config["data"]["tokenizer_backend"] == backend
        assert stats["tokenizer_backend"]["windows"] == {"fast": stats["windows"]}
        checks = stats["tokenizer_backend"]["checks"]
        assert 1 <= len(checks) <= 2  # one per packing actor that packed a window
        for check in checks:
            assert check["requested"] == backend and check["backend"] == "fast" and check["reason"] == "verified"
            assert check["checks"]["threads"] == 1  # the actor's CPU share (--cpus-per-worker 1)
            assert check["checks"]["sample_records"] > 0 and check["checks"]["stress_edges"] > 0
        same = {k: v for k, v in stats.items() if k not in ("seconds", "tokens_per_second", "first_row_seconds",
                                                              "steady_tokens_per_second", "core_tokens_per_second",
                                                              "cpu_tokens_per_second", "ray_init_seconds",
                                                              "ray_to_first_row_seconds", "startup_seconds",
                                                              "tokenizer_backend")}  # fmt: skip
        assert same == {k: stats_hf[k] for k in same}
    assert stats_hf["tokenizer_backend"]["windows"] == {"hf": stats_hf["windows"]}


def test_the_bundled_tokenizer_packs_on_the_fast_path(ray_cluster, tmp_path):
    """The quick start's tokenizer is one quicktok accepts (issue 25): auto proves and uses it."""
    assert pack(demo_corpus_paths(), demo_tokenizer_path(), tmp_path / "auto", "auto") == 0
    stats = json.loads((tmp_path / "auto" / ".packfeed" / "stats.json").read_text())
    assert stats["samples_packed"] == 7500 and stats["tokenizer_backend"]["windows"] == {"fast": stats["windows"]}
    assert all(c["reason"] == "verified" for c in stats["tokenizer_backend"]["checks"])


def test_a_tokenizer_refused_at_load_is_packed_by_hf_under_auto_and_stops_fast(ray_cluster, tmp_path, capsys):
    corpus = demo_corpus_paths()[:1]
    refused = str(tmp_path / "gpt2-regex")  # the demo tokenizer as bundled before issue 25
    gpt2_regex_tokenizer().save_pretrained(refused)
    assert pack(corpus, refused, tmp_path / "auto", "auto") == 0
    stats = json.loads((tmp_path / "auto" / ".packfeed" / "stats.json").read_text())
    assert stats["tokenizer_backend"]["windows"] == {"hf": stats["windows"]}
    assert all("unrecognized pretokenizer pattern" in c["reason"] for c in stats["tokenizer_backend"]["checks"])
    err = capsys.readouterr().err  # one line for the run, however many actors refused
    assert err.count("the HF tokenizers back-end packs, the fast one was refused: quicktok refused the import") == 1
    assert pack(corpus, refused, tmp_path / "fast", "fast") == 2
    err = capsys.readouterr().err
    assert "the fast back-end cannot reproduce it: quicktok refused the import: unrecognized pretokenizer" in err
    assert not (tmp_path / "fast" / ".packfeed" / "stats.json").exists()


def test_a_difference_in_the_data_is_caught_by_each_actor(ray_cluster, tmp_path, capsys):
    tokenizer = tmp_path / "trap"
    merge_order_trap().save_pretrained(tokenizer)
    corpus = tmp_path / "texts.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"line {i}: the qzx word"}) + "\n" for i in range(3000)))
    assert pack([str(corpus)], str(tokenizer), tmp_path / "auto", "auto") == 0
    stats = json.loads((tmp_path / "auto" / ".packfeed" / "stats.json").read_text())
    assert stats["tokenizer_backend"]["windows"] == {"hf": 3}
    assert all("tokens differ from HF" in c["reason"] for c in stats["tokenizer_backend"]["checks"])
    capsys.readouterr()
    assert pack([str(corpus)], str(tokenizer), tmp_path / "fast", "fast") == 2
    assert "tokens differ from HF on" in capsys.readouterr().err

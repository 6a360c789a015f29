"""A Hugging Face id that is not a local path, while the Hub cannot be reached: one probe to
$HF_ENDPOINT (here a closed port on 127.0.0.1, so nothing leaves the machine), then the local
cache only. Not cached: one line and exit 2 within seconds (before: 49 s and 20 ``Retrying``
lines for a tokenizer, 25 s for a model); cached: it loads, offline. No Ray starts."""

from __future__ import annotations

import json
import shutil
import time

import pytest
from support.ports import free_port

from packfeed.service.assets import demo_tokenizer_path
from packfeed.service.cli import main
from packfeed.service.tokenize import hf_hub
from packfeed.service.tokenize.hf_hub import hub_unreachable
from packfeed.service.tokenize.samples import load_tokenizer

pytestmark = pytest.mark.integration

# The import of transformers is most of it (11 s seen on a loaded 2-core machine); the probe is
# ms. What it excludes: transformers' own retries against the closed port, 49 s and 20 lines.
FAST_S = 25.0


@pytest.fixture
def closed_hub(monkeypatch, tmp_path):
    """$HF_ENDPOINT on a 127.0.0.1 port nobody listens on, offline mode unset, and an empty
    Hugging Face cache (huggingface_hub read $HF_HOME at its import: its constant is patched)."""
    import huggingface_hub.constants

    endpoint = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy",
                 "https_proxy", "all_proxy"):  # a proxy would answer for the closed port
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(hf_hub, "_probes", {})
    return endpoint, tmp_path / "hub"


def test_an_uncached_tokenizer_id_fails_fast_in_one_line(closed_hub, tmp_path, capsys):
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"text": "hello"}) + "\n")
    start = time.monotonic()
    code = main(["pack", str(data), "--tokenizer", "packfeed-test/no-such-tokenizer", "--seq-len", "64",
                 "--output", str(tmp_path / "out")])
    took = time.monotonic() - start
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("packfeed pack: error: ")]
    assert code == 2 and "Retrying" not in err and len(errors) == 1, err
    assert errors[0] == (
        f"packfeed pack: error: tokenizer 'packfeed-test/no-such-tokenizer': not a local directory and the Hugging "
        f"Face Hub is unreachable ({closed_hub[0]}: Connection refused), nor is it in the local cache; pass a local "
        "path or set HF_HUB_OFFLINE=1 with the tokenizer cached")
    assert took < FAST_S


def test_an_uncached_model_id_fails_fast_in_one_line(closed_hub):
    from packfeed.trainer.run_config import ModelConfig
    from packfeed.trainer.model.builder import check_model

    start = time.monotonic()
    with pytest.raises(ValueError, match=r"^model 'packfeed-test/no-such-model': not a local directory and the "
                                         r"Hugging Face Hub is unreachable \(.*Connection refused\)"):
        check_model(ModelConfig(name="packfeed-test/no-such-model"), vocab_size=100)
    assert time.monotonic() - start < FAST_S


def test_a_cached_id_loads_offline(closed_hub, caplog):
    """A tokenizer in the Hub cache's layout (refs/main -> snapshots/<commit>/, .no_exist/ for
    the files the Hub lacks) loads with the Hub unreachable, and says where it came from."""
    repo = closed_hub[1] / "models--packfeed-test--cached-tokenizer"
    shutil.copytree(demo_tokenizer_path(), repo / "snapshots" / "0123abcd")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abcd")
    (repo / ".no_exist" / "0123abcd").mkdir(parents=True)
    (repo / ".no_exist" / "0123abcd" / "config.json").touch()
    start = time.monotonic()
    with caplog.at_level("INFO", logger="packfeed.service.tokenize.samples"):
        tokenizer = load_tokenizer("packfeed-test/cached-tokenizer")
    assert tokenizer.vocab_size == load_tokenizer(demo_tokenizer_path()).vocab_size
    assert time.monotonic() - start < FAST_S
    assert "the Hugging Face Hub is unreachable" in caplog.text and "loaded from the local cache" in caplog.text


def test_offline_mode_and_local_paths_are_not_probed(closed_hub, monkeypatch):
    assert hub_unreachable(demo_tokenizer_path()) is None  # a local directory
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hub_unreachable("org/name") is None  # transformers reads the cache only, fast
    monkeypatch.delenv("HF_HUB_OFFLINE")
    assert hub_unreachable("org/name") == f"{closed_hub[0]}: Connection refused"

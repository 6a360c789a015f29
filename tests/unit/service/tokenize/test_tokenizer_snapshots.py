"""The driver's tokenizer from its snapshot (snapshots.py) is the tokenizer transformers loads,
it comes back without transformers, and any change to what the load depended on loads again.

Same tokenizer: the snapshot's fields equal ``ShippedTokenizer.of`` of transformers' own load,
and every window of the bundled corpus packs the same rows, for the bundled tokenizer and the
real Qwen2.5 one; the bundled one's directory with a template that is a dict, absent or as
shipped. Fresh
process: a second load imports neither transformers nor torch. Invalidation: editing, adding
or renaming any file, another transformers version, a damaged entry; a large file by size and
mtime. Not cached: a Hub id, a caller that did not ask (train saves and decodes with the full
tokenizer).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from support.tokenizers import qwen_tokenizer_dir

from packfeed.service.assets import demo_corpus_paths, demo_tokenizer_path
from packfeed.service.data.config import DataConfig
from packfeed.service.data.plan import build_plan
from packfeed.service.pipeline.window import process_window
from packfeed.service.tokenize import snapshots
from packfeed.service.tokenize.fast import quick_cache
from packfeed.service.tokenize.samples import load_tokenizer
from packfeed.service.tokenize.shipped import ShippedTokenizer

COLUMNS = ("input_ids", "labels", "position_ids", "seq_lens", "sample_ids", "pair_roles")


@pytest.fixture
def cache(monkeypatch, tmp_path) -> Path:
    monkeypatch.setenv("PACKFEED_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory) -> str:
    return qwen_tokenizer_dir(str(tmp_path_factory.mktemp("qwen")))


def copy_of(directory: str, tmp_path: Path) -> Path:
    target = tmp_path / "tok"
    shutil.copytree(directory, target)
    (target / "NOTES.md").write_text("where this tokenizer came from\n")  # a file transformers ignores
    return target


def entries(cache: Path) -> list[Path]:
    root = cache / "tokenizers"
    return sorted(p for p in root.iterdir() if not p.name.startswith(".")) if root.exists() else []


def fields(tok) -> dict:
    shipped = ShippedTokenizer.of(tok)
    data, backend_json = shipped.snapshot()
    return {**data, "backend_json": backend_json, "name": shipped.name_or_path}


def with_template(directory: Path, template) -> None:
    """Set the directory's chat template as transformers reads it: in tokenizer_config.json (a
    string or a dict saved as a list of {name, template}), or none at all."""
    config_path = directory / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config.pop("chat_template", None)
    for extra in ("chat_template.jinja", "chat_template.json"):
        (directory / extra).unlink(missing_ok=True)
    if isinstance(template, dict):
        config["chat_template"] = [{"name": k, "template": v} for k, v in template.items()]
    elif template is not None:
        config["chat_template"] = template
    config_path.write_text(json.dumps(config))


TEMPLATES = {
    "as shipped": ...,
    "none": None,
    "dict": {"default": "D{% for m in messages %}{{ m['content'] }}{% endfor %}",
             "tool_use": "T{% for m in messages %}{{ m['content'] }}{% endfor %}"},
}


# Qwen2.5's large vocabulary and added tokens as shipped; the template's forms on the bundled
# tokenizer (they do not depend on the vocabulary, and each Qwen2.5 load costs seconds)
@pytest.mark.parametrize(("which", "template"), [("bundled", t) for t in TEMPLATES] + [("qwen", "as shipped")],
                         ids=[f"bundled-{t}" for t in TEMPLATES] + ["qwen-as shipped"])
def test_the_snapshot_is_the_tokenizer_transformers_loads(cache, tmp_path, qwen_dir, which, template):
    from transformers import AutoTokenizer

    directory = copy_of(demo_tokenizer_path() if which == "bundled" else qwen_dir, tmp_path)
    if TEMPLATES[template] is not ...:
        with_template(directory, TEMPLATES[template])
    first = load_tokenizer(str(directory), snapshot=True)
    second = load_tokenizer(str(directory), snapshot=True)
    assert not isinstance(first.tokenizer, ShippedTokenizer), "the first load is transformers'"
    assert isinstance(second.tokenizer, ShippedTokenizer), "the second comes from the snapshot"
    assert len(entries(cache)) == 1
    assert fields(second.tokenizer) == fields(AutoTokenizer.from_pretrained(str(directory)))
    assert (second.vocab_size, second.eos_id, second.pad_id, second.name) == (
        first.vocab_size, first.eos_id, first.pad_id, first.name)


@pytest.mark.parametrize("which", ["bundled", "qwen"])
def test_every_window_packs_the_same_rows_from_the_snapshot(cache, qwen_dir, which):
    directory = demo_tokenizer_path() if which == "bundled" else qwen_dir
    config = DataConfig.from_inputs(demo_corpus_paths(), tokenizer=directory, seq_len=1024, window_samples=2048)
    plan = build_plan(config)
    load_tokenizer(directory, snapshot=True)
    kept = load_tokenizer(directory, snapshot=True, num_threads=1)
    full = load_tokenizer(directory, num_threads=1)
    assert isinstance(kept.tokenizer, ShippedTokenizer) and not isinstance(full.tokenizer, ShippedTokenizer)
    assert plan.num_windows > 1
    for k in range(plan.num_windows):
        a, stats_a = process_window(plan.window(k), {"auto": full}, config, plan)
        b, stats_b = process_window(plan.window(k), {"auto": kept}, config, plan)
        for column in COLUMNS:
            assert np.array_equal(getattr(a, column), getattr(b, column)), (k, column)
        assert dataclasses.replace(stats_a, tokenizer_checks=None) == dataclasses.replace(stats_b, tokenizer_checks=None)
    assert kept.backend == full.backend == "fast"


def test_the_drivers_proof_ships_with_the_snapshot_and_the_snapshot_keeps_none(cache):
    directory = demo_tokenizer_path()
    load_tokenizer(directory, snapshot=True)
    kept = load_tokenizer(directory, snapshot=True, backend="fast")
    shipped = kept.ship()
    assert shipped.fast_proof is not None and shipped.fast_proof.files
    assert kept.tokenizer.fast_proof is None, "the driver's snapshot itself is not changed by shipping"
    assert ShippedTokenizer.of(kept.tokenizer) is kept.tokenizer


def test_a_second_process_loads_it_without_transformers_torch_or_jinja(cache):
    code = (
        "import sys\n"
        "from packfeed.service.tokenize.samples import load_tokenizer\n"
        f"tok = load_tokenizer({demo_tokenizer_path()!r}, snapshot=True, backend='fast')\n"
        "tok.check_backend()\n"
        "# steps 1-3 render a chat probe, and the bundled ChatML template renders in Python (chat.py)\n"
        "tok._renderer().conversation([{'role': 'user', 'content': 'hi'}, {'role': 'assistant', 'content': 'yo'}],\n"
        "                             None, False)\n"
        "print(type(tok.tokenizer).__name__, 'transformers.tokenization_utils_base' in sys.modules,\n"
        "      'torch' in sys.modules, 'jinja2' in sys.modules)\n"
    )
    env = dict(os.environ, PACKFEED_CACHE_DIR=str(cache))
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=180)
            for _ in range(2)]
    for run in runs:
        assert run.returncode == 0, run.stderr
    first, second = (run.stdout.strip().splitlines()[-1] for run in runs)
    assert first.split()[1:3] == ["True", "True"], first  # transformers' load, torch with it
    assert second == "ShippedTokenizer False False False"  # nor transformers' template compiler


def edit_config(directory: Path) -> None:
    config = json.loads((directory / "tokenizer_config.json").read_text())
    config["chat_template"] = "EDITED{% for m in messages %}{{ m['content'] }}{% endfor %}"
    (directory / "tokenizer_config.json").write_text(json.dumps(config))


CHANGES = {
    "an edited file": edit_config,
    "a new file": lambda d: (d / "extra.txt").write_text("a file transformers ignores"),
    "a renamed file": lambda d: (d / "NOTES.md").rename(d / "NOTES.txt"),
}


@pytest.mark.parametrize("change", list(CHANGES), ids=list(CHANGES))
def test_any_change_to_the_directory_loads_it_again(cache, tmp_path, change):
    from transformers import AutoTokenizer

    directory = copy_of(demo_tokenizer_path(), tmp_path)
    load_tokenizer(str(directory), snapshot=True)
    CHANGES[change](directory)
    again = load_tokenizer(str(directory), snapshot=True)
    assert not isinstance(again.tokenizer, ShippedTokenizer), "a change is a miss"
    assert len(entries(cache)) == 2
    kept = load_tokenizer(str(directory), snapshot=True)
    assert isinstance(kept.tokenizer, ShippedTokenizer)
    assert fields(kept.tokenizer) == fields(AutoTokenizer.from_pretrained(str(directory)))


def test_another_transformers_version_is_another_key(monkeypatch, tmp_path):
    directory = demo_tokenizer_path()
    before = snapshots.directory_key(directory)
    real = snapshots.metadata.version
    monkeypatch.setattr(snapshots.metadata, "version", lambda p: "0.0.0" if p == "transformers" else real(p))
    assert snapshots.directory_key(directory) != before


def test_a_large_file_counts_by_size_and_mtime(monkeypatch, tmp_path):
    directory = copy_of(demo_tokenizer_path(), tmp_path)
    weights = directory / "model.safetensors"
    weights.write_bytes(b"\0" * 4096)
    monkeypatch.setattr(snapshots, "HASHED_BYTES", 1024)
    key = snapshots.directory_key(str(directory))
    stat = weights.stat()
    with open(weights, "r+b") as f:  # same size, new contents, mtime kept: the same key (not read)
        f.write(b"\1")
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert snapshots.directory_key(str(directory)) == key
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert snapshots.directory_key(str(directory)) != key
    monkeypatch.setattr(snapshots, "HASHED_BYTES", 1 << 30)  # under the limit: its contents count
    assert snapshots.directory_key(str(directory)) != key


@pytest.mark.parametrize("damage", ["truncated", "missing", "not json"])
def test_a_damaged_entry_loads_the_tokenizer_again(cache, damage):
    directory = demo_tokenizer_path()
    load_tokenizer(directory, snapshot=True)
    [entry] = entries(cache)
    target = entry / "fields.json"
    if damage == "truncated":
        target.write_text(json.dumps({"eos_token_id": 0}))
    elif damage == "missing":
        (entry / "backend.json").unlink()
    else:
        target.write_bytes(b"\xff{")
    again = load_tokenizer(directory, snapshot=True)
    assert not isinstance(again.tokenizer, ShippedTokenizer)
    assert again.pad_id == load_tokenizer(directory).pad_id


def test_no_snapshot_unless_asked_and_none_for_a_hub_id(cache, monkeypatch):
    from transformers import AutoTokenizer

    assert not isinstance(load_tokenizer(demo_tokenizer_path()).tokenizer, ShippedTokenizer)
    assert entries(cache) == []
    # a Hub id in the local cache, as transformers would load it (stood in for: no network here)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # no probe of the Hub (hf_hub.py) from a unit test
    bundled = AutoTokenizer.from_pretrained(demo_tokenizer_path())
    monkeypatch.setattr(AutoTokenizer, "from_pretrained", lambda name, *a, **k: bundled)
    for _ in range(2):
        tok = load_tokenizer("packfeed-test/bundled", snapshot=True)
        assert tok.tokenizer is bundled
    assert entries(cache) == []


def test_an_unwritable_cache_still_loads(monkeypatch, tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    monkeypatch.setenv("PACKFEED_CACHE_DIR", str(blocked))
    for _ in range(2):
        tok = load_tokenizer(demo_tokenizer_path(), snapshot=True)
        assert not isinstance(tok.tokenizer, ShippedTokenizer)
    assert quick_cache.read_entry(blocked / "tokenizers") is None

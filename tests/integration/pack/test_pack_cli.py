"""`packfeed pack` end to end on a real local Ray: bad rows mixed into every input kind.

Checks the issue's contract: every good sample delivered exactly once (by sample_ids), tokens
equal to the tokenizer's own output, labels masked at every sample start and on prompts, every
bad row skipped and counted by reason, deterministic output, streamed efficiency.
"""

from __future__ import annotations

import json
import random
import re
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support.model_batch import segments_by_sample
from transformers import AutoTokenizer

from packfeed.client.rows import IGNORE_INDEX, check_rows
from packfeed.service.assets import demo_corpus_paths, demo_tokenizer_path
from packfeed.service.cli import main
from packfeed.service.faults import FAULTS_DIR_ENV, FAULTS_ENV
from packfeed.service.packed.writer import read_packed_dir

pytestmark = pytest.mark.integration

SEQ_LEN = 256


def _chat(i: int) -> dict:
    return {"messages": [
        {"role": "user", "content": f"What is {i} plus {i}?"},
        {"role": "assistant", "content": f"{i} plus {i} is {2 * i}."},
    ]}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[list[str], dict[int, dict], dict[int, str]]:
    """Inputs in four formats with bad rows; returns (paths, good samples by id, bad ids -> reason)."""
    root = tmp_path_factory.mktemp("corpus")
    good: dict[int, dict] = {}
    bad: dict[int, str] = {}
    sample_id = 0

    # 1. conversational JSONL, written as raw bytes so invalid UTF-8 can be planted.
    lines: list[bytes] = []
    planted = {
        7: (b"{not json", "malformed_json"),
        19: (b'{"messages": "\xff\xfe"}', "invalid_utf8"),
        23: (b"   ", "blank_line"),
        31: (json.dumps({"messages": [{"role": "wizard", "content": "hi"}]}).encode(), "unknown_role"),
        40: (json.dumps({"text_typo": "hello"}).encode(), "missing_field"),
        55: (json.dumps({"messages": []}).encode(), "empty_field"),
        56: (json.dumps({"messages": [{"role": "user", "content": "only a question"}]}).encode(), "no_trained_tokens"),
    }
    for i in range(120):
        if i in planted:
            lines.append(planted[i][0])
            bad[sample_id] = planted[i][1]
        else:
            record = _chat(i)
            lines.append(json.dumps(record).encode())
            good[sample_id] = record
        sample_id += 1
    (root / "chat.jsonl").write_bytes(b"\n".join(lines) + b"\n")

    # 2. prompt/completion JSONL.
    with open(root / "qa.jsonl", "w") as f:
        for i in range(80):
            if i == 3:
                record = {"prompt": "Question: empty?\nAnswer:", "completion": ""}
                bad[sample_id] = "empty_field"
            elif i == 60:
                record = {"prompt": "Question: type?\nAnswer:", "completion": 5}
                bad[sample_id] = "wrong_type"
            else:
                record = {"prompt": f"Question: spell {i} backwards.\nAnswer:", "completion": f" {str(i)[::-1]}"}
                good[sample_id] = record
            f.write(json.dumps(record) + "\n")
            sample_id += 1

    # 3. Parquet text, with long documents (truncated at SEQ_LEN) and a null.
    rng = random.Random(0)
    texts = []
    for i in range(150):
        if i == 10:
            texts.append(None)
            bad[sample_id] = "empty_field"
        else:
            words = " ".join(rng.choice(["river", "stone", "light", "Velmora", "owl"]) for _ in range(rng.randint(1, 300)))
            texts.append(words)
            good[sample_id] = {"text": words}
        sample_id += 1
    pq.write_table(pa.table({"text": texts}), root / "docs.parquet")

    # 4. Plain-text files, one document each; one is not UTF-8.
    txt_dir = root / "txt"
    txt_dir.mkdir()
    for i in range(5):
        path = txt_dir / f"doc{i}.txt"
        if i == 2:
            path.write_bytes(b"caf\xe9 latin-1")
            bad[sample_id] = "invalid_utf8"
        else:
            path.write_text(f"Document {i}: the owls of Quillan.")
            good[sample_id] = {"text": f"Document {i}: the owls of Quillan."}
        sample_id += 1
    return [str(root / "chat.jsonl"), str(root / "qa.jsonl"), str(root / "docs.parquet"), str(txt_dir)], good, bad


def _pack(inputs, out: Path, *extra: str) -> dict:
    argv = ["pack", *inputs, "--tokenizer", demo_tokenizer_path(), "--seq-len", str(SEQ_LEN),
            "--output", str(out), "--validate", *extra]
    import ray

    cluster = ray.get_runtime_context().gcs_address
    assert main(argv) == 0
    assert ray.is_initialized() and ray.get_runtime_context().gcs_address == cluster, \
        "the command left the caller's Ray running"
    return json.loads((out / ".packfeed" / "stats.json").read_text())


@pytest.fixture(scope="module")
def packed_50(ray_cluster, corpus, tmp_path_factory) -> dict[int, tuple[Path, dict]]:
    """Workers (1 or 2) -> (output, stats) of the corpus packed in windows of 50 samples, seed 0:
    the clean runs the determinism, driver-write and dead-actor tests compare theirs with (read
    only; packed once for the three)."""
    inputs, _, _ = corpus
    root = tmp_path_factory.mktemp("packed_50")
    return {workers: (root / f"w{workers}", _pack(inputs, root / f"w{workers}", "--window-samples", "50",
                                                  "--num-workers", str(workers)))
            for workers in (1, 2)}


def _expected_tokens(tok, record: dict) -> list[int]:
    if "messages" in record:
        ids = tok.apply_chat_template(record["messages"], tokenize=True)
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    elif "prompt" in record:
        ids = tok(record["prompt"] + record["completion"])["input_ids"]
    else:
        ids = tok(record["text"])["input_ids"]
    return ids + [tok.eos_token_id]


def test_every_good_sample_exactly_once_with_exact_tokens_and_masks(ray_cluster, corpus, tmp_path):
    inputs, good, bad = corpus
    stats = _pack(inputs, tmp_path / "out", "--window-samples", "64", "--seed", "3")
    rows = read_packed_dir(tmp_path / "out")
    check_rows(rows, SEQ_LEN)
    assert np.array_equal(rows.row_index, np.arange(rows.num_rows))

    by_sample = segments_by_sample(rows)
    assert sorted(by_sample) == sorted(good), "every good sample exactly once, no bad one"
    assert all(len(segs) == 1 for segs in by_sample.values()), "whole-sample packing never splits a sample"

    tok = AutoTokenizer.from_pretrained(demo_tokenizer_path())
    eos = tok.convert_ids_to_tokens(tok.eos_token_id)
    truncated = 0
    interior_starts = 0
    for sid, [(ids, labels)] in by_sample.items():
        expected = _expected_tokens(tok, good[sid])
        truncated += len(expected) > SEQ_LEN
        assert ids.tolist() == expected[:SEQ_LEN], f"sample {sid}: tokens differ from the tokenizer's"
        assert labels[0] == IGNORE_INDEX, f"sample {sid}: first token must not be trained"
        trained = tok.decode(ids[labels != IGNORE_INDEX])
        record = good[sid]
        if "messages" in record:
            answer = record["messages"][-1]["content"]
            assert trained == f"{answer}<|im_end|>\n{eos}", f"sample {sid}: only the assistant turn is trained"
        elif "prompt" in record:
            assert trained == record["completion"] + eos, f"sample {sid}: the prompt is masked"
        else:
            assert (labels[1:] != IGNORE_INDEX).all(), f"sample {sid}: text trains every token but the first"
    for r in range(rows.num_rows):
        interior_starts += len(rows.row_seq_lens(r)) - 1
    assert interior_starts > 100, "the corpus must exercise many sample boundaries"
    assert truncated > 0, "the corpus must exercise the overlong policy"

    reasons: dict[str, int] = {}
    for reason in bad.values():
        reasons[reason] = reasons.get(reason, 0) + 1
    assert stats["skipped"] == reasons
    assert stats["samples_read"] == len(good) + len(bad)
    assert stats["samples_packed"] == len(good)
    assert stats["truncated"] == truncated
    assert stats["rows"] == rows.num_rows
    assert stats["tokens"] == int(rows.seq_lens[rows.sample_ids >= 0].sum())
    assert {ex["sample_id"] for ex in stats["skip_examples"]} <= set(bad)


def test_same_inputs_and_seed_give_identical_rows_whatever_the_workers(ray_cluster, corpus, packed_50, tmp_path):
    inputs, good, _ = corpus
    dirs = {"a": packed_50[1][0], "b": packed_50[2][0], "c": tmp_path / "c"}
    _pack(inputs, dirs["c"], "--window-samples", "50", "--num-workers", "2", "--seed", "1")
    a, b, c = (read_packed_dir(dirs[name]) for name in "abc")
    for column in ("input_ids", "labels", "position_ids", "seq_lens", "sample_ids", "row_index"):
        assert np.array_equal(getattr(a, column), getattr(b, column)), column
    assert np.array_equal(a.row_index, np.arange(a.num_rows)), "global row_index across the actors' part files"
    # the actors write the part files (one per window): the same bytes whatever the workers
    parts = {name: sorted(p.name for p in dirs[name].glob("part-*.parquet")) for name in "ab"}
    assert len(parts["a"]) > 2 and parts["a"] == parts["b"]
    for part in parts["a"]:
        assert (dirs["a"] / part).read_bytes() == (dirs["b"] / part).read_bytes(), part
    assert not np.array_equal(a.sample_ids, c.sample_ids), "another seed gives another order"
    assert sorted(a.sample_ids[a.sample_ids >= 0]) == sorted(c.sample_ids[c.sample_ids >= 0]) == sorted(good)


def test_on_a_multi_node_cluster_the_driver_writes_a_local_output_with_the_same_rows(ray_cluster, corpus, packed_50,
                                                                                    tmp_path, monkeypatch):
    """A local --output of a multi-node cluster is the driver's disk: the rows come to it."""
    import packfeed.service.packjob.pack_run as pack_module

    inputs, _, _ = corpus
    actors, _ = packed_50[2]  # written by the actors (one node: its disk is the driver's)
    monkeypatch.setattr(pack_module, "_actors_write", lambda output: False)
    stats = _pack(inputs, tmp_path / "driver", "--window-samples", "50", "--num-workers", "2")
    a, b = read_packed_dir(actors), read_packed_dir(tmp_path / "driver")
    for column in ("input_ids", "labels", "position_ids", "seq_lens", "sample_ids", "row_index"):
        assert np.array_equal(getattr(a, column), getattr(b, column)), column
    assert [p.name for p in (tmp_path / "driver").glob("part-*.parquet")] == ["part-00000.parquet"]
    assert stats["rows"] == a.num_rows and stats["epoch_rows"] == [a.num_rows]


def test_a_packing_actor_that_dies_is_replaced_and_the_rows_are_the_same(ray_cluster, corpus, packed_50, tmp_path,
                                                                        monkeypatch):
    """Fault injection: the actor that starts window 2 dies (os._exit, as an OOM kill would end
    it); Ray Data restarts it and runs the window again. The output is the clean run's."""
    inputs, good, _ = corpus
    clean_dir, clean = packed_50[1]
    monkeypatch.setenv(FAULTS_ENV, "packer-window:2:exit")
    monkeypatch.setenv(FAULTS_DIR_ENV, str(tmp_path / "drill"))  # once: the restarted actor packs it
    crashed = _pack(inputs, tmp_path / "crashed", "--window-samples", "50", "--num-workers", "1")
    assert (tmp_path / "drill" / "packer-window-2-any.fired").exists(), "the actor did die at window 2"
    a, b = read_packed_dir(clean_dir), read_packed_dir(tmp_path / "crashed")
    for column in ("input_ids", "labels", "position_ids", "seq_lens", "sample_ids", "row_index"):
        assert np.array_equal(getattr(a, column), getattr(b, column)), column
    assert sorted(b.sample_ids[b.sample_ids >= 0]) == sorted(good)
    assert {k: crashed[k] for k in ("rows", "samples_read", "samples_packed", "skipped", "windows")} == \
        {k: clean[k] for k in ("rows", "samples_read", "samples_packed", "skipped", "windows")}


def test_strict_mode_names_file_and_row(ray_cluster, corpus, tmp_path, capsys):
    inputs, _, _ = corpus
    code = main(["pack", inputs[0], "--tokenizer", demo_tokenizer_path(), "--seq-len", str(SEQ_LEN),
                 "--output", str(tmp_path / "strict"), "--strict"])
    assert code == 2
    err = capsys.readouterr().err
    assert "chat.jsonl" in err and "row 7" in err, err
    assert not (tmp_path / "strict" / ".packfeed" / "stats.json").exists()
    assert err.strip().splitlines()[-1].startswith("packfeed pack: error: ") and "Traceback" not in err


def test_streamed_efficiency_within_bound(ray_cluster, tmp_path):
    # 60k lognormal-length texts in 4 windows on 2 workers.
    rng = np.random.default_rng(0)
    words = ["alpha", "beta", "gamma", "delta", "river", "stone"]
    path = tmp_path / "texts.jsonl"
    with open(path, "w") as f:
        for n in np.clip(rng.lognormal(3.0, 1.0, size=60_000).astype(int), 1, 2000):
            f.write(json.dumps({"text": " ".join(rng.choice(words, size=n))}) + "\n")
    stats = _pack([str(path)], tmp_path / "out", "--window-samples", "16384")
    assert stats["windows"] == 4 and stats["samples_packed"] == 60_000
    assert stats["rows"] <= 1.002 * stats["bound_rows"] + 2, stats


def test_readme_main_command_packs_in_a_subprocess(tmp_path):
    """The README's demo: a fresh process, bundled data; small enough that the driver packs it
    alone, sooner than an embedded Ray and its packing actors would start."""
    out = tmp_path / "demo"
    proc = subprocess.run(
        [sys.executable, "-m", "packfeed.service.cli", "pack", *demo_corpus_paths(),
         "--tokenizer", demo_tokenizer_path(), "--seq-len", "2048", "--output", str(out), "--progress-seconds", "1"],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    stats = json.loads((out / ".packfeed" / "stats.json").read_text())
    assert stats["samples_packed"] == 7500 and stats["skipped_total"] == 0
    assert stats["windows"] == 8, "an eighth of a small epoch per window: several windows for several packers"
    assert stats["rows"] <= 1.002 * stats["bound_rows"] + stats["windows"], stats
    # packed by the driver alone (head_start.py): no Ray, no actor, so no steady rate of theirs
    assert stats["driver_windows"] == stats["windows"] and stats["steady_tokens_per_second"] is None
    assert stats["ray_init_seconds"] is None and "no Ray started" in proc.stderr
    assert "efficiency" in proc.stdout
    # the detected format of each input (progress lines: test_head_start.py, a run long enough for them)
    for name, fmt in (("chat.jsonl", "messages"), ("instruct.jsonl", "prompt_completion"), ("stories.jsonl", "text")):
        assert re.search(rf"{name}: [\d,]+ rows; first 20: {fmt} 20", proc.stderr), proc.stderr
    noise = [line for line in proc.stderr.splitlines() if "Token authentication is enabled" in line
             or "Progress bars disabled" in line or "Starting execution of Dataset" in line]
    assert not noise, noise


# ---- runs that must not count as a success ---------------------------------------------------
CHAT_OK = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
NO_ANSWER = {"messages": [{"role": "user", "content": "only a question"}]}  # parses, trains nothing


def _write(path: Path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_a_mixed_format_file_packs_every_sample(ray_cluster, tmp_path):
    """Issue: one messages row then prompt/completion and text rows packed 1 of 6, exit 0."""
    rows = [CHAT_OK, {"prompt": "Q: one?", "completion": " one"}, {"text": "a story"},
            {"prompt": "Q: two?", "completion": " two"}, {"text": "another story"}, CHAT_OK]
    stats = _pack([_write(tmp_path / "mixed.jsonl", rows)], tmp_path / "out")
    assert (stats["samples_read"], stats["samples_packed"], stats["skipped_total"]) == (6, 6, 0)
    assert stats["formats"] == {"messages": 2, "prompt_completion": 2, "text": 2}


def test_a_run_that_packs_nothing_fails_with_the_reason(ray_cluster, tmp_path, capsys):
    path = _write(tmp_path / "questions.jsonl", [NO_ANSWER] * 30)  # valid records the tokenizer cannot train
    code = main(["pack", path, "--tokenizer", demo_tokenizer_path(), "--seq-len", str(SEQ_LEN),
                 "--output", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and "nothing was packed: 30 samples read, all skipped or dropped (no_trained_tokens 30)" in err
    stats = json.loads((tmp_path / "out" / ".packfeed" / "stats.json").read_text())
    assert stats["status"].startswith("failed: nothing was packed")


def test_max_skip_fraction_fails_a_mostly_bad_run(ray_cluster, tmp_path, capsys):
    path = _write(tmp_path / "half.jsonl", [CHAT_OK, NO_ANSWER] * 20)
    args = ["pack", path, "--tokenizer", demo_tokenizer_path(), "--seq-len", str(SEQ_LEN)]
    assert main([*args, "--output", str(tmp_path / "a"), "--max-skip-fraction", "0.6"]) == 0
    code = main([*args, "--output", str(tmp_path / "b"), "--max-skip-fraction", "0.25"])
    err = capsys.readouterr().err
    assert code == 2 and "20 of 40 samples were skipped (50.0%), more than --max-skip-fraction 0.25" in err


def test_a_source_that_delivers_nothing_is_named(ray_cluster, tmp_path, capsys):
    good, bad = _write(tmp_path / "good.jsonl", [CHAT_OK] * 20), _write(tmp_path / "bad.jsonl", [NO_ANSWER] * 10)
    cfg = tmp_path / "mix.toml"
    cfg.write_text(f'[data]\ntokenizer = "{demo_tokenizer_path()}"\nseq_len = {SEQ_LEN}\n'
                   f'[[data.sources]]\nname = "good"\npaths = ["{good}"]\n'
                   f'[[data.sources]]\nname = "questions"\npaths = ["{bad}"]\nrepeat = 2.0\n')
    code = main(["pack", "--config", str(cfg), "--output", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and "source(s) ['questions'] delivered no sample" in err
    stats = json.loads((tmp_path / "out" / ".packfeed" / "stats.json").read_text())
    questions = next(s for s in stats["sources"] if s["name"] == "questions")
    assert (questions["samples_read"], questions["skipped"]) == (20, {"no_trained_tokens": 20})


def test_the_library_starts_an_embedded_ray_whatever_was_imported_first(tmp_path):
    """A script that imports Ray (or packfeed's pipeline, which imports Ray) before
    ``init_ray`` gets a working embedded Ray: the auth mode is set only while Ray can still
    read it, never half-way (a GCS wanting a token the driver does not send). Ray's single-node
    mode (loopback only) is the started Ray's, not left in the caller's environment, where a
    later `ray start --address` (a worker node) would refuse to join. Ray's dashboard agent
    listens on a free port: here Ray's fixed one (52365) is taken, as by another Ray on the
    machine, and the agent still answers (it used to retry for 3.5 s, then start without it)."""
    script = (
        "import {first}, os, urllib.request\n"
        "from packfeed.service.cluster.raycluster import init_ray, shutdown_ray\n"
        "print(init_ray('local'))\n"
        "import ray\n"
        "print('a task returned', ray.get(ray.remote(lambda: 2).remote()))\n"
        "print('node', ray.util.get_node_ip_address())\n"
        "print('mode left', os.environ.get('RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER'))\n"
        "port = ray._private.worker.global_worker.node.dashboard_agent_listen_port\n"
        "url = f'http://127.0.0.1:{{port}}/api/local_raylet_healthz'\n"
        "print('agent', port, urllib.request.urlopen(url, timeout=10).status)\n"
        "shutdown_ray()\n"
    )
    taken = socket.socket()
    try:
        taken.bind(("127.0.0.1", 52365))
        taken.listen()
    except OSError:  # held already (another Ray on this machine): taken all the same
        pass
    with taken:
        for first in ("ray", "packfeed.service.pipeline.ray_pipeline"):
            out = subprocess.run([sys.executable, "-c", script.format(first=first)], capture_output=True, text=True,
                                 timeout=180, cwd=tmp_path)  # fmt: skip
            assert out.returncode == 0 and "a task returned 2" in out.stdout, (first, out.stderr[-3000:])
            assert "node 127.0.0.1" in out.stdout and "mode left None" in out.stdout, out.stdout
            agent = re.search(r"^agent (\d+) (\d+)$", out.stdout, re.M)
            assert agent and agent.group(1) != "52365" and agent.group(2) == "200", out.stdout


def test_no_ray_data_thread_outlives_its_reader_or_ray(tmp_path):
    """A reader stopped mid-stream (serve's on SIGTERM, a hub reader superseded) left Ray Data's
    block prefetcher thread parked for good, holding its last blocks; woken after
    ``ray.shutdown()`` it called ``ray.wait`` on a dead core worker and the process aborted with
    exit 1 after a clean drain. The reader stops its own prefetcher on close; ``shutdown_ray``
    waits for Ray Data's other threads. The script writes its threads to a file: on stdout, Ray's
    log thread printed a line into the middle of one of them (a print is several writes)."""
    threads = tmp_path / "threads.json"
    script = (
        "import json, sys, threading\n"
        "from packfeed.service.assets import demo_corpus_paths, demo_tokenizer_path\n"
        "from packfeed.service.data.config import DataConfig\n"
        "from packfeed.service.pipeline.ray_pipeline import PackingPipeline\n"
        "from packfeed.service.cluster.scaling import PackingScaling\n"
        "from packfeed.service.data.plan import build_plan\n"
        "from packfeed.service.cluster.raycluster import init_ray, shutdown_ray\n"
        "said = {}\n"
        "init_ray('local')\n"
        "config = DataConfig.from_inputs(demo_corpus_paths(), tokenizer=demo_tokenizer_path(), seq_len=512,\n"
        "                                window_samples=1024)\n"
        "rows = PackingPipeline(config, build_plan(config), scaling=PackingScaling(num_workers=1)).iter_rows()\n"
        "next(rows)\n"
        "said['reading'] = sorted(t.name for t in threading.enumerate())\n"
        "rows.close()  # stopped mid-stream\n"
        "said['before'] = sorted(t.name for t in threading.enumerate())\n"
        "shutdown_ray()\n"
        "said['after'] = sorted(t.name for t in threading.enumerate() if t.is_alive())\n"
        "open(sys.argv[1], 'w').write(json.dumps(said))\n"
    )
    out = subprocess.run([sys.executable, "-c", script, str(threads)], capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    said = json.loads(threads.read_text())
    assert "Prefetcher" in said["reading"], "the case did not arise: nothing to stop"  # guards the test itself
    assert "Prefetcher" not in said["before"], said["before"]
    assert said["after"] == ["MainThread"], said["after"]

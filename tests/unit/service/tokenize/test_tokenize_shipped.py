"""The tokenizer the packing actors get (``ShippedTokenizer``) packs the rows the driver's own
tokenizer packs, without transformers, and the fast back-end's steps 1-3 run once per run.

Same rows: every window of the bundled corpus (text, chat, prompt/completion) and preference
pairs, through a pickled ShippedTokenizer, equal the loaded tokenizer's rows, under each
back-end and loss mode, with the bundled tokenizer and the real Qwen2.5 one. The proof: an
actor's tokenizer takes the driver's steps 1-3 (quicktok's import is not called again) and still
runs step 4 on its own window; a refusal travels as the refusal. Templates: the one
``get_chat_template`` picks with and without tools, for a template dict, equals transformers'.
"""

from __future__ import annotations

import dataclasses
import pickle
import subprocess
import sys

import numpy as np
import pytest
from test_tokenize import window
from support.tokenizers import gpt2_regex_tokenizer, qwen_tokenizer_dir, word_tokenizer

from packfeed.service.assets import demo_corpus_paths, demo_tokenizer_path
from packfeed.service.data.config import DataConfig
from packfeed.service.data.plan import build_plan
from packfeed.service.inputs.records import Conversation, Preference, PromptCompletion
from packfeed.service.pipeline.window import process_window
from packfeed.service.tokenize.samples import SampleTokenizer
from packfeed.service.tokenize.shipped import ShippedTokenizer

COLUMNS = ("input_ids", "labels", "position_ids", "seq_lens", "sample_ids", "pair_roles")


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    from transformers import AutoTokenizer

    return {
        "bundled": AutoTokenizer.from_pretrained(demo_tokenizer_path()),
        "qwen": AutoTokenizer.from_pretrained(qwen_tokenizer_dir(str(tmp_path_factory.mktemp("qwen")))),
    }


def shipped_through_pickle(driver: SampleTokenizer) -> ShippedTokenizer:
    """What a packing actor holds: the driver's ``ship()`` after a trip through pickle."""
    return pickle.loads(pickle.dumps(driver.ship()))


# every back-end and loss mode with the bundled tokenizer; the real 151k vocabulary through the fast path
CASES = [("bundled", b, loss) for b in ("hf", "auto", "fast") for loss in ("auto", "all")] + [("qwen", "auto", "auto")]


@pytest.mark.parametrize("through", ["pickle", "this-process"])
@pytest.mark.parametrize(("name", "backend", "loss"), CASES)
def test_every_window_packs_the_same_rows_through_the_shipped_tokenizer(tokenizers, name, backend, loss, through):
    """Through pickle: what a packing actor gets. In this process: what the driver's head start
    builds from its own ``ship()``, reusing the driver's Rust backend and quicktok encoder."""
    tok = tokenizers[name]
    config = DataConfig.from_inputs(demo_corpus_paths(), tokenizer=name, seq_len=1024, loss=loss, window_samples=2048)
    plan = build_plan(config)
    driver = SampleTokenizer(tok, backend=backend, loss=loss, num_threads=1)
    driver.check_backend()  # the driver's steps 1-3 under auto, as the probe runs them
    shipped = shipped_through_pickle(driver) if through == "pickle" else driver.ship()
    actor = SampleTokenizer(shipped, backend=backend, loss=loss, num_threads=1)
    reference = SampleTokenizer(tok, backend=backend, loss=loss, num_threads=1)
    assert plan.num_windows > 1
    for k in range(plan.num_windows):
        a, stats_a = process_window(plan.window(k), {loss: reference}, config, plan)
        b, stats_b = process_window(plan.window(k), {loss: actor}, config, plan)
        for column in COLUMNS:
            assert np.array_equal(getattr(a, column), getattr(b, column)), (k, column)
        assert dataclasses.replace(stats_a, tokenizer_checks=None) == dataclasses.replace(stats_b, tokenizer_checks=None)
    assert actor.backend == reference.backend == ("hf" if backend == "hf" else "fast")
    reused = through == "this-process"
    assert (actor._backend is driver._backend) is reused
    if backend != "hf":  # the encoder was chosen on the first window: under auto, quicktok's is loaded now
        assert (actor._encoders.fast.quick is driver._encoders.fast.quick) is reused
    assert (actor.vocab_size, actor.eos_id, actor.pad_id, actor.name) == (
        reference.vocab_size, reference.eos_id, reference.pad_id, reference.name)


@pytest.mark.parametrize("style", ["chatml", "gemma", "llama2"])
def test_pairs_chats_and_tools_tokenize_the_same_through_the_shipped_tokenizer(style):
    tok = word_tokenizer(style)
    hi, hello = {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello world"}
    records = [
        "the sky is blue",
        Conversation([hi, hello, {"role": "user", "content": "why"}, {"role": "assistant", "content": "because"}]),
        Conversation([hi, hello], tools=[{"type": "function", "function": {"name": "f"}}]),
        PromptCompletion([hi], [hello]),
        PromptCompletion("the cat", " sat on the mat ."),
        Preference("the dog", " sat .", " ran ."),
        Preference([hi], [hello], [{"role": "assistant", "content": "bye"}]),
    ]
    for loss in ("auto", "all", "completion"):
        ref = SampleTokenizer(tok, backend="hf", loss=loss).tokenize(window(records))
        got = SampleTokenizer(shipped_through_pickle(SampleTokenizer(tok, backend="hf")), backend="hf",
                              loss=loss).tokenize(window(records))
        for name in ("tokens", "labels", "offsets", "sample_ids"):
            assert np.array_equal(getattr(ref, name), getattr(got, name)), (loss, name)
        assert ref.skips == got.skips
        assert len(ref.sample_ids) >= 6  # not vacuous: (almost) every record became a sample


def test_the_actor_takes_the_drivers_steps_1_to_3_and_still_proves_its_window(tokenizers, monkeypatch, tmp_path):
    import quicktok

    driver = SampleTokenizer(tokenizers["qwen"], backend="auto", num_threads=1)
    driver.check_backend()
    shipped = shipped_through_pickle(driver)
    assert shipped.fast_proof.refused is None and shipped.fast_proof.files

    def no_import(*args, **kwargs):
        raise AssertionError("quicktok's import ran again in the actor")

    monkeypatch.setattr(quicktok, "import_tokenizer", no_import)
    actor = SampleTokenizer(shipped, backend="auto", num_threads=1)
    actor.tokenize(window(["The cat sat on the mat.", PromptCompletion("2 + 2 =", " 4")]))
    report = actor.backend_report
    assert actor.backend == "fast" and report["reason"] == "verified"
    assert report["checks"]["steps_1_3"] == "proven by the driver"
    assert report["checks"]["stress_edges"] == driver.backend_report["checks"]["stress_edges"] > 0
    assert report["checks"]["sample_records"] == 2  # step 4: the actor's own window, both back-ends

    # Without a proof (a tokenizer named, not shipped) the actor runs steps 1-3 itself: with no
    # import cached, quicktok's import runs, and the patch refuses it.
    monkeypatch.setenv("PACKFEED_CACHE_DIR", str(tmp_path))
    with pytest.raises(ValueError, match="quicktok's import ran again"):
        SampleTokenizer(tokenizers["qwen"], backend="fast", num_threads=1)


def test_a_refusal_travels_as_the_refusal():
    tok = gpt2_regex_tokenizer()
    driver = SampleTokenizer(tok, backend="auto")
    line = driver.check_backend()
    shipped = shipped_through_pickle(driver)
    assert "GPT2_BYTELEVEL_DEFAULT" in shipped.fast_proof.refused and shipped.fast_proof.files is None
    actor = SampleTokenizer(shipped, backend="auto")
    actor.tokenize(window(["The cat sat."]))
    assert actor.backend == "hf" and actor.backend_report["reason"] == shipped.fast_proof.refused
    assert shipped.fast_proof.refused in line
    with pytest.raises(ValueError, match="GPT2_BYTELEVEL_DEFAULT"):
        SampleTokenizer(shipped, backend="fast")


def test_hf_ships_no_proof_and_auto_before_its_check_ships_none_either():
    tok = word_tokenizer("chatml")
    assert SampleTokenizer(tok, backend="hf").ship().fast_proof is None
    assert SampleTokenizer(tok, backend="auto").ship().fast_proof is None  # steps 1-3 not run: each actor runs them


@pytest.mark.parametrize("templates", [
    {"default": "D{{ messages[0]['content'] }}", "tool_use": "T{{ messages[0]['content'] }}"},
    {"default": "D{{ messages[0]['content'] }}"},
    {"tool_use": "T{{ messages[0]['content'] }}", "other": "O"},
    "S{{ messages[0]['content'] }}",
    None,
])
def test_the_template_picked_with_and_without_tools_is_transformers_choice(templates):
    tok = word_tokenizer("chatml")
    tok.chat_template = templates
    shipped = pickle.loads(pickle.dumps(ShippedTokenizer.of(tok)))
    assert shipped.chat_template == templates
    for tools in (None, [], [{"type": "function", "function": {"name": "f"}}]):
        try:
            expected = tok.get_chat_template(None, tools)
        except ValueError as e:
            with pytest.raises(ValueError, match="ValueError"):
                shipped.get_chat_template(None, tools)
            assert str(e)[:40] in str(pytest.raises(ValueError, shipped.get_chat_template, None, tools).value)
            continue
        assert shipped.get_chat_template(None, tools) == expected


def test_an_actor_process_packs_without_importing_transformers(tmp_path):
    """The point of shipping: a fresh process (a packing actor's) unpickles the tokenizer and
    tokenizes text, prompt/completion and a pair with both back-ends, and transformers (with
    torch) is never imported. A conversation imports only transformers' template compiler."""
    driver = SampleTokenizer(word_tokenizer("chatml"), backend="hf")
    blob = tmp_path / "shipped.pkl"
    blob.write_bytes(pickle.dumps(driver.ship()))
    code = f"""
import pickle, sys
from test_tokenize import window
from packfeed.service.inputs.records import Conversation, PromptCompletion, Preference
from packfeed.service.tokenize.samples import SampleTokenizer
tok = SampleTokenizer(pickle.loads(open({str(blob)!r}, "rb").read()), backend="hf")
out = tok.tokenize(window(["the sky is blue", PromptCompletion("the cat", " sat ."), Preference("a", " b", " c")]))
assert len(out.sample_ids) == 3, out.skips
print("text", "transformers" in sys.modules, "torch" in sys.modules)
tok.tokenize(window([Conversation([{{"role": "user", "content": "hi"}}, {{"role": "assistant", "content": "hello"}}])]))
print("chat", "transformers.models" in " ".join(sys.modules), "torch" in sys.modules)
"""
    import os

    tests_dir = os.path.dirname(__file__)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([tests_dir, os.path.join(tests_dir, "..", "..", ".."),
                                                       os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["text False False", "chat False False"], out.stdout

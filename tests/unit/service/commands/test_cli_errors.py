"""A user's mistake is one line naming the input and the fix, exit status 2, no traceback, and
Ray never starts (the unit conftest makes ``ray.init`` fail loudly). Each case is a mistake an
adversarial run made into a raw traceback before (issue: "Errors a person can read")."""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pytest
from support.tokenizers import gpt2_regex_tokenizer

from packfeed.service.assets import demo_tokenizer_path
from packfeed.service.cli import main
from packfeed.service.errors import root_cause, user_message

TOK = demo_tokenizer_path()


def run(capsys, *argv) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().err


def one_line_error(err: str, command: str = "pack") -> str:
    """The one error line (other lines may be the command's info lines, or output a Ray of an
    earlier test in this session still prints)."""
    assert "Traceback" not in err, err
    errors = [line for line in err.splitlines() if line.startswith(f"packfeed {command}: error: ")]
    assert len(errors) == 1, err
    return errors[0]


@pytest.fixture
def good(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps({"text": f"doc {i}"}) + "\n" for i in range(5)))
    return str(path)


def test_a_huge_seq_len_is_bounded(capsys, good, tmp_path):
    code, err = run(capsys, "pack", good, "--tokenizer", TOK, "--seq-len", "1000000000000", "--output", str(tmp_path / "o"))
    assert code == 2 and "seq_len must be at most 1,048,576" in one_line_error(err)


def test_a_symlink_loop_input_is_named(capsys, tmp_path):
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    code, err = run(capsys, "pack", str(loop), "--tokenizer", TOK, "--seq-len", "64", "--output", str(tmp_path / "o"))
    line = one_line_error(err)
    assert code == 2 and str(loop) in line and "symbolic links" in line
    directory = tmp_path / "dir"
    directory.mkdir()
    (directory / "self.jsonl").symlink_to(directory / "self.jsonl")  # a loop inside a directory
    code, err = run(capsys, "pack", str(directory), "--tokenizer", TOK, "--seq-len", "64", "--output", str(tmp_path / "o"))
    line = one_line_error(err)
    assert code == 2 and "self.jsonl" in line and "symbolic links" in line


def test_a_read_only_output_location_is_named(capsys, good):
    code, err = run(capsys, "pack", good, "--tokenizer", TOK, "--seq-len", "64", "--output", "/sys/packfeed-out")
    assert code == 2 and "/sys/packfeed-out" in one_line_error(err)


def test_a_corrupt_tokenizer_json_is_named(capsys, good, tmp_path):
    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "tokenizer.json").write_text("{ not json")
    (tok / "tokenizer_config.json").write_text("{}")
    code, err = run(capsys, "pack", good, "--tokenizer", str(tok), "--seq-len", "64", "--output", str(tmp_path / "o"))
    line = one_line_error(err)
    assert code == 2 and f"tokenizer {str(tok)!r}: cannot load it" in line


def test_a_typo_in_the_tokenizer_path_is_named(capsys, good, tmp_path):
    code, err = run(capsys, "pack", good, "--tokenizer", "service/assets/tokenizr", "--seq-len", "64",
                    "--output", str(tmp_path / "o"))
    assert code == 2 and "'service/assets/tokenizr' does not exist" in one_line_error(err)


@pytest.mark.parametrize(("name", "local"), [
    ("gpt2", False), ("Qwen/Qwen2.5-0.5B", False),  # Hub ids: `org/name` was refused as a missing directory
    ("service/assets/tokenizr", True), ("./tok", True), ("/abs/tok", True), ("~/tok", True), (TOK, True),
])
def test_a_hub_id_is_not_taken_for_a_missing_directory(name, local):
    """Tokenizer and model names: a path that does not exist is named at once; a Hub id is loaded."""
    from packfeed.service.tokenize.hf_hub import looks_local

    assert looks_local(name) is local


@pytest.mark.parametrize("kind", ["arrow-stream", "parquet"])
def test_a_truncated_or_corrupt_columnar_file_is_named(capsys, tmp_path, kind):
    table = pa.table({"text": [f"doc {i}" for i in range(1000)]})
    if kind == "arrow-stream":
        path = tmp_path / "d.arrow"
        with pa.ipc.new_stream(str(path), table.schema) as w:
            for b in table.to_batches(max_chunksize=100):
                w.write_batch(b)
        path.write_bytes(path.read_bytes()[: os.path.getsize(path) // 2])  # truncated mid-stream
    else:
        path = tmp_path / "d.parquet"
        path.write_bytes(b"PAR1" + os.urandom(300))  # garbage with a Parquet magic
    code, err = run(capsys, "pack", str(path), "--tokenizer", TOK, "--seq-len", "64", "--output", str(tmp_path / "o"))
    line = one_line_error(err)
    assert code == 2 and str(path) in line and "re-export it or leave it out" in line


def test_a_config_file_with_a_syntax_error_is_named(capsys, tmp_path):
    cfg = tmp_path / "run.toml"
    cfg.write_text("[data\nseq_len = 3")
    code, err = run(capsys, "pack", "--config", str(cfg), "--output", str(tmp_path / "o"))
    assert code == 2 and f"--config {cfg}: not valid TOML" in one_line_error(err)


def test_a_format_that_fits_no_row_fails_before_ray_with_the_fix(capsys, good, tmp_path):
    """Issue: `--format messages` on a text file packed nothing and exited 0."""
    code, err = run(capsys, "pack", good, "--tokenizer", TOK, "--seq-len", "64", "--format", "messages",
                    "--output", str(tmp_path / "o"))
    line = one_line_error(err)
    assert code == 2 and "none of the first 5 rows" in line and "missing_field 5" in line
    assert "these rows are text: drop --format" in line


def test_a_bad_mixture_in_the_config_fails_naming_the_source(capsys, good, tmp_path):
    cfg = tmp_path / "mix.toml"
    cfg.write_text(f'[data]\ntokenizer = "{TOK}"\nseq_len = 64\n[[data.sources]]\nname = "web"\npaths = ["{good}"]\n'
                   'weight = -1\n')
    code, err = run(capsys, "pack", "--config", str(cfg), "--output", str(tmp_path / "o"))
    assert code == 2 and "source 'web': weight must be a finite number > 0" in one_line_error(err)


@pytest.mark.parametrize(("scaling", "flags", "message"), [
    ("packer_resources = 4", (), "packer resources must be a table of resource = amount, got 4"),
    ('packing_workers = "4"', (), "[scaling] packing_workers must be a whole number >= 1, got '4'"),
    ('packer_labels = "packer"', (), "packer labels must be a table of label"),
    ("packing_cpus_per_worker = 0", (), "[scaling] packing_cpus_per_worker must be a finite number > 0, got 0"),
    ("packing_cpus_per_worker = inf", (), "[scaling] packing_cpus_per_worker must be a finite number > 0, got inf"),
    ("", ("--num-workers", "0"), "--num-workers must be a whole number >= 1, got 0"),
    ("", ("--packer-resource", "GPU_LIKE=-1"), "packer resources: GPU_LIKE must be a finite number > 0, got -1.0"),
    ("", ("--packer-resource", "GPU_LIKE=inf"), "packer resources: GPU_LIKE must be a finite number > 0, got inf"),
])
def test_wrong_scaling_values_fail_before_ray_naming_the_key(capsys, good, tmp_path, scaling, flags, message):
    cfg = tmp_path / "run.toml"
    cfg.write_text(f'[data]\ntokenizer = "{TOK}"\nseq_len = 64\n[[data.sources]]\npaths = ["{good}"]\n[scaling]\n{scaling}\n')
    code, err = run(capsys, "pack", "--config", str(cfg), "--output", str(tmp_path / "o"), *flags)
    assert code == 2 and message in one_line_error(err)  # serve and train read [scaling] with the same checks


@pytest.mark.parametrize(("data", "flags", "message"), [
    ("[[data.sources]]\npaths = 5", (), "source #1: paths must be a non-empty list of files, directories or globs, got 5"),
    ("inputs = [1]", (), "inputs must be a non-empty list of files, directories or globs, got [1]"),
    ('strict = "false"\ninputs = ["GOOD"]', (), "strict must be true or false, got 'false'"),
    ('add_eos = "false"\ninputs = ["GOOD"]', (), "add_eos must be true or false, got 'false'"),
    ("samples_per_epoch = 10000000000000000000\n[[data.sources]]\npaths = [\"GOOD\"]\nweight = 1",
     (), "samples_per_epoch must be at most 1,099,511,627,776"),
    ('[[data.sources]]\npaths = ["GOOD"]\nrepeat = 1e30', (), "source 'data': repeat 1e+30 gives"),
    ('inputs = ["GOOD"]\nepochs = 1000000000', (), "the run would have 5,000,000,000 windows"),
    ('inputs = ["GOOD"]', ("--progress-seconds", "nan"), "--progress-seconds must be a finite number > 0, got nan"),
])
def test_wrong_data_values_fail_before_ray_naming_the_key(capsys, good, tmp_path, data, flags, message):
    """Wrong types and sizes in [data]: one line naming the key, not a traceback or an overflow."""
    cfg = tmp_path / "run.toml"
    cfg.write_text(f'[data]\ntokenizer = "{TOK}"\nseq_len = 64\nwindow_samples = 1\n' + data.replace("GOOD", good) + "\n")
    code, err = run(capsys, "pack", "--config", str(cfg), "--output", str(tmp_path / "o"), *flags)
    assert code == 2 and message in one_line_error(err)


def test_a_config_file_that_is_not_a_text_of_tables_is_named(capsys, good, tmp_path):
    for name, content, message in (("run.toml", b"[data]\nseq_len = 64 \xff\n", "byte 20 is not UTF-8"),
                                   ("run.json", b'{"data": 5}', "[data] must be a table of keys, got a int")):
        cfg = tmp_path / name
        cfg.write_bytes(content)
        code, err = run(capsys, "pack", good, "--config", str(cfg), "--output", str(tmp_path / "o"))
        assert code == 2 and f"--config {cfg}: {message}" in one_line_error(err)


def test_an_output_over_the_input_is_refused(capsys, good, tmp_path):
    code, err = run(capsys, "pack", str(tmp_path), "--tokenizer", TOK, "--seq-len", "64", "--output", str(tmp_path),
                    "--overwrite")
    assert code == 2 and "contains the input" in one_line_error(err)
    code, err = run(capsys, "pack", str(tmp_path), "--tokenizer", TOK, "--seq-len", "64", "--output",
                    str(tmp_path / "packed"))  # a later `pack DIR/**` would read its own rows
    assert code == 2 and f"lies inside the input {tmp_path}" in one_line_error(err)


def test_overwrite_keeps_the_previous_output_when_a_later_check_fails(capsys, good, tmp_path):
    """``--overwrite`` removed the previous rows before the tokenizer, the inputs and Ray's address
    were checked: a typo cost a good dataset."""
    from packfeed.service.packed.writer import ParquetRowWriter

    out = tmp_path / "o"
    ParquetRowWriter(out, seq_len=64, config_hash="h").close(config={"previous": True}, stats={"rows": 0})
    before = {p.name: p.read_bytes() for p in (out / ".packfeed").iterdir()}
    code, err = run(capsys, "pack", good, "--tokenizer", "service/assets/tokenizr", "--seq-len", "64",
                    "--output", str(out), "--overwrite")
    assert code == 2 and "tokenizr" in one_line_error(err)
    code, err = run(capsys, "pack", good, "--format", "messages", "--tokenizer", TOK, "--seq-len", "64",
                    "--output", str(out), "--overwrite")  # the probe refuses the source
    assert code == 2 and "none of the first" in one_line_error(err)
    code, err = run(capsys, "pack", good, "--tokenizer", TOK, "--seq-len", "64", "--output", str(out),
                    "--overwrite", "--address", "typo")  # Ray is reached after the inputs are checked
    assert code == 2 and "is not host:port" in one_line_error(err)
    assert {p.name: p.read_bytes() for p in (out / ".packfeed").iterdir()} == before
    assert set(before) == {"files.json", "config.json", "stats.json"}


def test_debug_shows_the_traceback_of_a_user_error(capsys, good, tmp_path):
    argv = ["pack", good, "--tokenizer", TOK, "--seq-len", str(10**12), "--output", str(tmp_path / "o")]
    for where in ([], ["--debug"]):  # before the command or among its flags
        with pytest.raises(ValueError, match="seq_len must be at most"):
            main(["--debug", *argv] if not where else [*argv, *where])


def test_version_and_bugs_keep_their_traceback(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.startswith("packfeed ")
    assert user_message(KeyError("x")) is None and user_message(RuntimeError("x")) is None
    assert user_message(ValueError("bad\n value")) == "bad value"
    assert user_message(FileNotFoundError(2, "No such file or directory", "a.jsonl")).endswith("'a.jsonl'")


def test_a_drill_and_ray_datas_retry_note_are_one_line_of_the_cause():
    """A fault drill's FaultInjected is the drill's line (exit 2), not a bug's traceback; the
    note Ray Data appends to a map task's exception (its retries, how to configure them) is
    not the user's fix and is cut, from a drill's line and a user error's alike."""
    from packfeed.service.faults import FaultInjected

    note = ("\nFailed to apply UDF transform after 1/1 attempts (total backoff 0.0s).\nTo change retry attempts, "
            "backoff, or which errors are retried, configure `ray.data.DataContext.get_current()` if you believe "
            "this to be transient.")
    drill = FaultInjected("fault injected at packer-window:3 ($PACKFEED_FAULTS)" + note)
    assert user_message(drill) == ("fault injected at packer-window:3 ($PACKFEED_FAULTS): a drill, not a bug "
                                   "(unset $PACKFEED_FAULTS for a real run)")
    assert user_message(ValueError("a.jsonl row 7: no 'text' field" + note)) == "a.jsonl row 7: no 'text' field"
    assert user_message(ValueError("Failed to parse x after 1/2 attempts (total backoff 0.0s).")) == \
        "Failed to parse x after 1/2 attempts (total backoff 0.0s).", "only the appended note is cut"


def test_root_cause_unwraps_ray_style_wrappers():
    class TaskError(Exception):
        def __init__(self, cause):
            super().__init__("wrapper")
            self.cause = cause

    inner = ValueError("the data's error")
    assert root_cause(TaskError(TaskError(inner))) is inner
    assert user_message(TaskError(inner)) == "the data's error"


def test_a_user_error_in_train_workers_is_its_line_not_ray_trains_wrapper():
    """Ray Train raises WorkerGroupError (rank -> error, no __cause__): a traceback before."""
    from ray.train.v2.api.exceptions import WorkerGroupError

    inner = ValueError("unknown tiny model family 'lama'")
    wrapped = WorkerGroupError("rank 0 failed", {1: RuntimeError("rank 1 saw rank 0 go"), 0: inner})
    assert root_cause(wrapped) is inner
    assert user_message(wrapped) == "unknown tiny model family 'lama'"


# ---- issue 24: what needs no data is checked on the driver, before Ray --------------------------
@pytest.fixture
def chat(tmp_path):
    path = tmp_path / "chat.jsonl"
    rows = [{"messages": [{"role": "user", "content": f"hi {i}"}, {"role": "assistant", "content": "hello"}]}
            for i in range(5)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture
def no_template_tokenizer(tmp_path):
    """The bundled tokenizer without its chat template."""
    import shutil

    tok = tmp_path / "tok-no-template"
    shutil.copytree(TOK, tok, ignore=shutil.ignore_patterns("chat_template.jinja"))
    assert "chat_template" not in (tok / "tokenizer_config.json").read_text()
    return str(tok)


@pytest.mark.parametrize("command", ["pack", "train"])
def test_a_tokenizer_without_a_chat_template_on_chat_rows_fails_before_ray(capsys, tmp_path, chat, good,
                                                                         no_template_tokenizer, command):
    """Issue 24: 206 lines of Ray tracebacks from the packing actors before the right message."""
    cfg = tmp_path / "mix.toml"
    cfg.write_text(f'[data]\ntokenizer = "{no_template_tokenizer}"\nseq_len = 64\n'
                   f'[[data.sources]]\nname = "web"\npaths = ["{good}"]\n'
                   f'[[data.sources]]\nname = "chat"\npaths = ["{chat}"]\n'
                   '[model]\nname = "tiny-llama"\n')
    code, err = run(capsys, command, "--config", str(cfg), "--output", str(tmp_path / "o"))
    line = one_line_error(err, command)
    assert code == 2 and f"source 'chat': {chat}: row 0, sample 5: tokenizer" in line
    assert "has no chat template, and `messages` rows" in line and "give a tokenizer whose" in line
    assert good not in line


def test_serve_checks_the_chat_template_before_ray(chat, no_template_tokenizer):
    from packfeed.service.cli import build_parser
    from packfeed.service.commands.args import data_config_from_args
    from packfeed.service.delivery.serve_run import open_pipeline_stream
    from packfeed.service.cluster.scaling import PackingScaling

    args = build_parser().parse_args(["serve", chat, "--tokenizer", no_template_tokenizer, "--seq-len", "64"])
    with pytest.raises(ValueError, match=r"source 'chat': .*chat.jsonl: row 0, sample 0: tokenizer .* no chat "):
        # the checks before Ray, then Ray (the unit conftest refuses it)
        open_pipeline_stream(data_config_from_args(args), PackingScaling(), None)


def test_a_chat_template_that_cannot_find_assistant_turns_fails_before_ray(capsys, tmp_path, chat):
    """A template that is not prefix-preserving is found on the probed rows, naming the row."""
    import shutil

    tok = tmp_path / "tok"
    shutil.copytree(TOK, tok)
    (tok / "chat_template.jinja").write_text(  # the turn count leads the text: prefixes render differently
        "{{ messages | length }}{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '\\n' }}{% endfor %}")
    code, err = run(capsys, "pack", chat, "--tokenizer", str(tok), "--seq-len", "64", "--output", str(tmp_path / "o"))
    line = one_line_error(err)
    assert code == 2 and f"source 'chat': {chat}: row 0, sample 0: the chat template" in line
    assert "is not prefix-preserving" in line
    code, err = run(capsys, "pack", chat, "--tokenizer", str(tok), "--seq-len", "64", "--loss", "all",  # no turns
                    "--output", str(tmp_path / "o"), "--address", "typo")  # to locate: past the probe, up to Ray
    assert code == 2 and "is not host:port" in one_line_error(err)


@pytest.mark.parametrize(("model", "message"), [
    ("tiny-lama", "unknown tiny model 'tiny-lama' (did you mean 'tiny-llama'?): choose tiny-<family>"),
    ("./models/mine", "model './models/mine' does not exist: give a local save_pretrained directory"),
])
def test_a_model_name_that_loads_nothing_fails_before_ray(capsys, good, tmp_path, model, message):
    """Issue 24: `unknown tiny model` after 35 s, with a traceback from a Ray Train worker."""
    code, err = run(capsys, "train", good, "--tokenizer", TOK, "--seq-len", "64", "--model", model,
                    "--output", str(tmp_path / "o"))
    assert code == 2 and message in one_line_error(err, "train")


@pytest.mark.parametrize("command", ["pack", "train"])
def test_the_fast_back_ends_refusal_is_said_before_ray(capsys, good, tmp_path, command):
    """Issue 24: under --tokenizer-backend auto the reason came only once the actors had started."""
    refused = str(tmp_path / "gpt2-regex")  # the bundled tokenizer is accepted (issue 25): one quicktok refuses
    gpt2_regex_tokenizer().save_pretrained(refused)
    argv = [command, good, "--tokenizer", refused, "--seq-len", "64", "--output", str(tmp_path / "o")]
    # pack: Ray at once (a run this small would start none); the unit conftest ends the run there
    argv += ["--model", "tiny-llama"] if command == "train" else ["--no-head-start"]
    with pytest.raises(RuntimeError, match="must not start Ray"):  # the unit conftest: the run ends where Ray starts
        main(argv)
    err = capsys.readouterr().err
    assert err.count("the HF tokenizers back-end packs, the fast one was refused: quicktok refused the import: "
                     "unrecognized pretokenizer pattern (pattern: GPT2_BYTELEVEL_DEFAULT)") == 1
    with pytest.raises(RuntimeError, match="must not start Ray"):
        main([*argv, "--tokenizer-backend", "hf"])
    assert "back-end" not in capsys.readouterr().err


def test_a_typo_of_the_sources_table_is_named(capsys, good, tmp_path):
    """Issue 24: `[[data.source]]` said `missing INPUT...`."""
    cfg = tmp_path / "mix.toml"
    cfg.write_text(f'[data]\ntokenizer = "{TOK}"\nseq_len = 64\n[[data.source]]\npaths = ["{good}"]\n')
    code, err = run(capsys, "pack", "--config", str(cfg), "--output", str(tmp_path / "o"))
    line = one_line_error(err)
    assert code == 2 and "unknown data config keys ['source'] (did you mean 'sources'?)" in line


def test_a_file_in_two_sources_is_warned_about_naming_both(capsys, good, tmp_path):
    """Issue 24: the same file in two sources was counted twice without a word."""
    cfg = tmp_path / "mix.toml"
    cfg.write_text(f'[data]\ntokenizer = "{TOK}"\nseq_len = 64\ntokenizer_backend = "hf"\n'
                   f'[[data.sources]]\nname = "a"\npaths = ["{tmp_path}/*.jsonl"]\n'
                   f'[[data.sources]]\nname = "b"\npaths = ["{good}"]\n')
    with pytest.raises(RuntimeError, match="must not start Ray"):  # the unit conftest: the run ends where Ray starts
        main(["pack", "--config", str(cfg), "--output", str(tmp_path / "o"), "--no-head-start"])
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("packfeed pack: warning: ")]
    assert warnings == [f"packfeed pack: warning: {good} is in sources 'a' and 'b': each of them reads its rows, so "
                        "they count once per source; give each file to one source (repeat or weight sets how often "
                        "a source's rows come)"]

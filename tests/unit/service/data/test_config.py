import pytest

from packfeed.service.data.config import DataConfig

BASE = dict(inputs=("a.jsonl",), tokenizer="tok", seq_len=128)


def make(**fields) -> DataConfig:
    """A config in the plain form (inputs: one source), as config files and INPUT... give it."""
    return DataConfig.from_dict(fields)


@pytest.mark.parametrize(
    "override, message",
    [
        pytest.param({"inputs": ()}, "inputs", id="no-inputs"),
        pytest.param({"inputs": "a.jsonl"}, "inputs", id="inputs-as-one-string"),
        pytest.param({"tokenizer": ""}, "tokenizer", id="no-tokenizer"),
        pytest.param({"seq_len": 1}, "seq_len", id="seq-len-too-small"),
        pytest.param({"seq_len": 12.5}, "seq_len", id="seq-len-not-int"),
        pytest.param({"strategy": "ffd"}, "strategy must be one of", id="unknown-strategy"),
        pytest.param({"overlong": "wrap"}, "overlong", id="unknown-overlong"),
        pytest.param({"format": "sharegpt"}, "format", id="unknown-format"),
        pytest.param({"loss": "prompt"}, "loss", id="unknown-loss"),
        pytest.param({"window_samples": 0}, "window_samples", id="empty-window"),
    ],
)
def test_invalid_config_is_a_clear_value_error(override, message):
    with pytest.raises(ValueError, match=message):
        make(**{**BASE, **override})


def test_round_trip_and_hash_names_the_stream():
    config = make(**BASE, seed=3)
    again = DataConfig.from_dict(config.to_dict())
    assert again == config and again.config_hash() == config.config_hash()
    assert make(**BASE, seed=4).config_hash() != config.config_hash()


def test_unknown_keys_are_rejected_with_the_known_ones_listed():
    with pytest.raises(ValueError, match=r"data config keys \['seqlen'\] \(did you mean 'seq_len'\?\); known keys"):
        DataConfig.from_dict({**BASE, "seqlen": 5})
    # [[data.source]], a typo of [[data.sources]]: named, not reported as "no data"
    with pytest.raises(ValueError, match=r"unknown data config keys \['source'\] \(did you mean 'sources'\?\)"):
        DataConfig.from_dict({"tokenizer": "tok", "seq_len": 8, "source": [{"paths": ["a.jsonl"]}]})
    with pytest.raises(ValueError, match=r"keys \['epoch', 'sead'\] \(did you mean 'epoch' -> 'epochs', 'sead' -> "
                                         r"'seed'\?\)"):
        DataConfig.from_dict({**BASE, "epoch": 2, "sead": 1})


def test_config_is_frozen_and_keyword_only():
    config = make(**BASE)
    with pytest.raises(Exception):
        config.seq_len = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        DataConfig(("a",), "tok", 128)  # type: ignore[misc]


# ---- mixtures ------------------------------------------------------------------------------
def from_data(**data):
    return DataConfig.from_dict({"tokenizer": "tok", "seq_len": 128, **data})


def test_a_mixture_from_a_config_table_round_trips_and_names_sources():
    config = from_data(epochs=2, sources=[
        {"paths": ["data/chat/"], "repeat": 2.0},
        {"name": "web", "paths": "data/web.parquet", "repeat": 0.5, "format": "text", "loss": "all"},
        {"paths": ["data/corpus/*.jsonl"]},
    ])
    assert [s.name for s in config.sources] == ["chat", "web", "corpus"]
    assert config.inputs == ("data/chat/", "data/web.parquet", "data/corpus/*.jsonl")
    assert config.source_format(config.sources[1]) == "text" and config.source_loss(config.sources[0]) == "auto"
    assert DataConfig.from_dict(config.to_dict()) == config


def test_the_hash_covers_sources_shares_and_epochs_but_not_run_policy():
    base = dict(sources=[{"name": "a", "paths": ["a.jsonl"], "repeat": 1.0}])
    h = from_data(**base).config_hash()
    assert from_data(**base, epochs=2).config_hash() != h
    assert from_data(sources=[{"name": "a", "paths": ["a.jsonl"], "repeat": 2.0}]).config_hash() != h
    assert from_data(sources=[{"name": "b", "paths": ["a.jsonl"], "repeat": 1.0}]).config_hash() != h
    assert from_data(**base, max_skip_fraction=0.1).config_hash() == h  # fails runs, never changes rows
    assert from_data(**base, strict=True).config_hash() == h  # a run that succeeds under strict skipped nothing


@pytest.mark.parametrize("sources, extra, message", [
    pytest.param([{"name": "a", "paths": ["a"], "repeat": 1}, {"name": "b", "paths": ["b"], "weight": 1}], {},
                 r"sources \['a'\] set repeat and \['b'\] weight: use one or the other on every source",
                 id="mixing-repeat-and-weight"),
    pytest.param([{"name": "a", "paths": ["a"]}, {"name": "b", "paths": ["b"], "weight": 1}], {},
                 r"sources \['a'\] have no weight: with weights, every source needs one", id="a-weight-missing"),
    pytest.param([{"name": "a", "paths": ["a"], "weight": 1}], {}, "need \\[data\\] samples_per_epoch", id="weight-alone"),
    pytest.param([{"name": "a", "paths": ["a"], "repeat": 1}], {"samples_per_epoch": 10},
                 "samples_per_epoch applies to sources with weight", id="samples-without-weights"),
    pytest.param([{"name": "a", "paths": ["a"], "repeat": 0}], {}, "source 'a': repeat must be a finite number > 0",
                 id="zero-repeat"),
    pytest.param([{"name": "a", "paths": ["a"], "weight": float("nan")}], {"samples_per_epoch": 5},
                 "source 'a': weight must be a finite number > 0", id="nan-weight"),
    pytest.param([{"name": "a", "paths": ["a"], "repeat": float("inf")}], {}, "source 'a': repeat", id="inf-repeat"),
    pytest.param([{"name": "a", "paths": ["a"], "repeat": 1, "weight": 1}], {}, "source 'a': give repeat or weight",
                 id="both-on-one"),
    pytest.param([{"name": "a", "paths": ["a"], "reapeat": 2}], {}, r"source 'a': unknown keys \['reapeat'\]",
                 id="unknown-key"),
    pytest.param([{"paths": ["x/a.jsonl"], "reapeat": 2}], {}, r"source #1: unknown keys \['reapeat'\] \(did you mean "
                 r"'repeat'\?\)", id="unnamed-unknown-key"),
    pytest.param([{"name": "a", "repeat": 2}], {}, "source 'a': missing `paths`", id="no-paths"),
    pytest.param([{"name": "a", "paths": []}], {}, "source 'a': paths must be a non-empty list", id="empty-paths"),
    pytest.param([{"name": "a", "paths": ["a"]}, {"name": "a", "paths": ["b"]}], {}, "names must be unique",
                 id="duplicate-names"),
    pytest.param([{"name": "a", "paths": ["a"], "format": "chat"}], {}, "source 'a': format must be one of",
                 id="bad-format"),
    pytest.param([{"name": "a", "paths": ["a"]}], {"epochs": 0}, "epochs must be an integer >= 1", id="no-epochs"),
    pytest.param([{"name": "a", "paths": ["a"]}], {"inputs": ["b"]}, "give inputs or sources, not both",
                 id="inputs-and-sources"),
])
def test_bad_mixtures_are_value_errors_naming_the_source_and_the_fix(sources, extra, message):
    with pytest.raises(ValueError, match=message):
        from_data(sources=sources, **extra)


def test_seq_len_is_bounded_and_says_so():
    with pytest.raises(ValueError, match="seq_len must be at most 1,048,576"):
        make(**{**BASE, "seq_len": 1_000_000_000_000})


@pytest.mark.parametrize("paths, name", [
    pytest.param(["data/chat/"], "chat", id="directory"),
    pytest.param(["data/web.parquet"], "web", id="file"),
    pytest.param(["data/corpus/*.jsonl"], "corpus", id="glob"),
    pytest.param(["corpus/a.jsonl", "corpus/b.jsonl"], "corpus", id="several-files"),
    pytest.param(["a/x.jsonl", "b/y.jsonl"], "x", id="no-common-directory"),
    pytest.param(["*.jsonl"], "data", id="bare-glob"),
])
def test_default_source_names(paths, name):
    from packfeed.service.data.config import default_source_name

    assert default_source_name(paths) == name

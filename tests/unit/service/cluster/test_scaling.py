"""The packing actors' one type (service/cluster/scaling.py): what the [scaling] table, the
flags of pack and serve, and train's TrainScaling give is the same PackingScaling, checked by
one rule per field whose message names what the user wrote. Pure: nodes are dicts."""

from __future__ import annotations

import pytest

from packfeed.service.cluster.scaling import TABLE_KEYS, PackingScaling
from packfeed.trainer.run_config import RunConfig, TrainScaling

LAPTOP = {"id": "l", "address": "", "resources": {"CPU": 2.0}, "labels": {}}
HEAD = {"id": "h", "address": "", "resources": {"CPU": 1.0}, "labels": {}}
PACKER = {"id": "p", "address": "", "resources": {"CPU": 6.0}, "labels": {"packfeed/role": "packer"}}

TABLES = [
    pytest.param({}, id="empty"),
    pytest.param({"packing_workers": 3, "packing_cpus_per_worker": 0.5}, id="count-and-fraction"),
    pytest.param({"packing_workers": 2, "packing_max_workers": 8}, id="autoscaling"),
    pytest.param({"packer_labels": {}, "packer_resources": {"slot": 1}}, id="selector-off-and-a-resource"),
    pytest.param({"packer_labels": {"zone": "in(a,b)"}, "packing_cpus_per_worker": 2}, id="selector"),
]


@pytest.mark.parametrize("table", TABLES)
def test_a_scaling_table_round_trips_and_train_reads_it_the_same(table):
    scaling = PackingScaling.from_table(table)
    assert PackingScaling.from_table(scaling.to_table()) == scaling
    assert set(scaling.to_table()) == set(TABLE_KEYS)
    for key, field in TABLE_KEYS.items():
        if key in table:
            assert getattr(scaling, field) == table[key], key
    train = TrainScaling.from_table(table)  # train's default count is 1, pack's and serve's one per CPU
    assert train.packing == PackingScaling.from_table(table, num_workers=1)
    assert TrainScaling.from_table(train.to_table()) == train


def test_the_flags_win_over_the_table():
    table = {"packing_workers": 2, "packing_cpus_per_worker": 0.5, "packer_labels": {"a": "b"}}
    flags = {"num_workers": ("--num-workers", 5), "labels": ("packer labels", {"c": "d"})}
    got = PackingScaling.from_table(table, flags)
    assert (got.num_workers, got.cpus_per_worker, got.labels) == (5, 0.5, {"c": "d"})


def test_a_run_config_writes_the_scaling_table_it_was_read_from():
    """config.json and the checkpoints keep [scaling] as the TOML has it (flat keys)."""
    table = {"num_workers": 1, "packing_workers": 2, "packer_resources": {"slot": 1.0}}
    run = RunConfig.from_dict({"data": {"inputs": ["a.jsonl"], "tokenizer": "tok", "seq_len": 64},
                               "model": {"name": "tiny-llama"}, "scaling": table})
    written = run.to_dict()["scaling"]
    assert {k: written[k] for k in table} == table and "packing" not in written
    assert RunConfig.from_dict(run.to_dict()) == run


@pytest.mark.parametrize(("table", "given", "message"), [
    pytest.param({"packing_workers": 0}, {}, r"\[scaling\] packing_workers must be a whole number >= 1, got 0",
                 id="table-count"),
    pytest.param({}, {"num_workers": ("--num-workers", True)}, "--num-workers must be a whole number >= 1, got True",
                 id="flag-count"),
    pytest.param({"packing_cpus_per_worker": "1"}, {},
                 r"\[scaling\] packing_cpus_per_worker must be a finite number > 0, got '1'", id="table-cpus"),
    pytest.param({}, {"cpus_per_worker": ("--cpus-per-worker", float("inf"))},
                 "--cpus-per-worker must be a finite number > 0, got inf", id="flag-cpus"),
    pytest.param({"packing_workers": 4, "packing_max_workers": 2}, {},
                 r"\[scaling\] packing_max_workers \(2\) must be >= \[scaling\] packing_workers \(4\)",
                 id="pool-below-its-start"),
    pytest.param({"packing_workers": 4}, {"max_workers": ("--max-workers", 3)},
                 r"--max-workers \(3\) must be >= \[scaling\] packing_workers \(4\)", id="flag-pool-below-table"),
    pytest.param({"packer_labels": "packer"}, {}, "packer labels must be a table of label", id="labels"),
    pytest.param({"packer_resources": {"slot": -1}}, {}, "packer resources: slot must be a finite number > 0",
                 id="resources"),
])
def test_a_wrong_value_is_named_as_the_user_wrote_it(table, given, message):
    with pytest.raises(ValueError, match=message):
        PackingScaling.from_table(table, given)


@pytest.mark.parametrize(("kwargs", "message"), [
    pytest.param({"num_workers": 0}, "num_workers must be a whole number >= 1", id="count"),
    pytest.param({"cpus_per_worker": 0}, "cpus_per_worker must be a finite number > 0", id="cpus"),
    pytest.param({"num_workers": 3, "max_workers": 2}, r"max_workers \(2\) must be >= num_workers \(3\)", id="pool"),
    pytest.param({"labels": {"a": 1}}, "labels must be a table of label", id="labels"),
])
def test_the_type_itself_refuses_what_the_table_refuses(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PackingScaling(**kwargs)


def test_a_training_run_needs_a_count_of_packing_actors():
    with pytest.raises(ValueError, match="packing must be a PackingScaling with num_workers set"):
        TrainScaling(packing=PackingScaling())


@pytest.mark.parametrize(("scaling", "nodes", "windows", "actors", "labels"), [
    pytest.param(PackingScaling(num_workers=3), [LAPTOP], 10, 3, {}, id="a-count-is-kept"),
    pytest.param(PackingScaling(num_workers=3), [LAPTOP], 2, 2, {}, id="never-more-than-the-windows"),
    pytest.param(PackingScaling(), [LAPTOP], 10, 2, {}, id="one-per-cpu"),
    pytest.param(PackingScaling(cpus_per_worker=0.5), [LAPTOP], 10, 4, {}, id="one-per-half-cpu"),
    pytest.param(PackingScaling(), [HEAD, PACKER], 10, 6, {"packfeed/role": "packer"}, id="packer-nodes-by-default"),
    pytest.param(PackingScaling(labels={}), [HEAD, PACKER], 10, 7, {}, id="an-empty-selector-is-every-node"),
])
def test_actors_and_selector_on_the_nodes(scaling, nodes, windows, actors, labels):
    placed = scaling.placed(nodes)
    assert placed.labels == labels and scaling.num_actors(windows, nodes) == actors
    assert placed.num_actors(windows, nodes) == actors  # placing twice changes nothing

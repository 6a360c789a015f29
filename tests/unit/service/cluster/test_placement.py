"""Placement (service/cluster/placement.py): label selectors matched as Ray
matches them, role defaults only on labelled clusters, and requests that can never be placed
refused with the numbers. Pure: nodes are dicts as ``node_resources()`` returns them."""

from __future__ import annotations

import pytest

from packfeed.service.cluster.placement import check_fits, label_matches, resolve
from packfeed.service.cluster.scaling import PackingScaling
from packfeed.trainer.run_config import TrainScaling
from packfeed.service.cluster.placement import check_train_placement as check_placement

HEAD = {"id": "h", "address": "", "resources": {"CPU": 1.0}, "labels": {}}
PACKER = {"id": "p", "address": "", "resources": {"CPU": 4.0}, "labels": {"packfeed/role": "packer"}}
TRAINER = {"id": "t", "address": "", "resources": {"CPU": 8.0, "GPU": 2.0}, "labels": {"packfeed/role": "trainer"}}
LAPTOP = {"id": "l", "address": "", "resources": {"CPU": 2.0}, "labels": {}}


@pytest.mark.parametrize("labels, selector, matches", [
    pytest.param({"packfeed/role": "packer"}, {"packfeed/role": "packer"}, True, id="equal"),
    pytest.param({"packfeed/role": "trainer"}, {"packfeed/role": "packer"}, False, id="other-value"),
    pytest.param({}, {"packfeed/role": "packer"}, False, id="missing-label"),
    pytest.param({}, {"packfeed/role": "!trainer"}, True, id="not-matches-a-node-without-the-label"),
    pytest.param({"packfeed/role": "trainer"}, {"packfeed/role": "!trainer"}, False, id="not"),
    pytest.param({"zone": "b"}, {"zone": "in(a,b)"}, True, id="in"),
    pytest.param({"zone": "c"}, {"zone": "in(a, b)"}, False, id="not-in-the-set"),
    pytest.param({"zone": "c"}, {"zone": "!in(a,b)"}, True, id="not-in"),
    pytest.param({"a": "1", "b": "2"}, {"a": "1", "b": "3"}, False, id="every-key-must-match"),
    pytest.param({"a": "1"}, {}, True, id="empty-selector"),
])
def test_label_matching_golden(labels, selector, matches):
    assert label_matches(labels, selector) is matches


def test_role_defaults_apply_only_on_a_labelled_cluster():
    assert resolve(None, {"packfeed/role": "packer"}, [HEAD, PACKER]) == {"packfeed/role": "packer"}
    assert resolve(None, {"packfeed/role": "packer"}, [LAPTOP]) == {}
    assert resolve({}, {"packfeed/role": "packer"}, [HEAD, PACKER]) == {}, "an empty table turns the default off"
    assert resolve({"x": "y"}, {"packfeed/role": "packer"}, [LAPTOP]) == {"x": "y"}


def test_requests_that_can_never_be_placed_are_refused_with_the_numbers():
    nodes = [HEAD, PACKER, TRAINER]
    check_fits("packing actors", {"CPU": 1}, 4, {"packfeed/role": "packer"}, nodes)
    with pytest.raises(ValueError, match=r"packing actors: 5 x \(1 CPU\) do not fit on the 1 nodes matching .*room for 4"):
        check_fits("packing actors", {"CPU": 1}, 5, {"packfeed/role": "packer"}, nodes)
    with pytest.raises(ValueError, match=r"1 x \(64 CPU\).*largest node 4"):
        check_fits("packing actors", {"CPU": 64}, 1, {"packfeed/role": "packer"}, nodes)
    with pytest.raises(ValueError, match=r"no node matches the labels \{'packfeed/role': 'gpu'\} .*"
                                         r"packfeed/role=packer, packfeed/role=trainer"):
        check_fits("packing actors", {"CPU": 1}, 1, {"packfeed/role": "gpu"}, nodes)
    with pytest.raises(ValueError, match="fake_gpu"):
        check_fits("train workers", {"CPU": 1, "fake_gpu": 1}, 1, {}, nodes)
    check_fits("the feeder", {}, 1, {"packfeed/role": "!trainer"}, nodes)  # no request: any matching node


def test_a_training_run_is_placed_by_roles_and_checked_as_a_whole():
    chosen = check_placement(TrainScaling(num_workers=2, cpus_per_worker=1, use_gpu="yes", packing=PackingScaling(num_workers=3)),
                             use_gpu=True, nodes=[HEAD, PACKER, TRAINER])
    assert chosen.packer == {"packfeed/role": "packer"} and chosen.trainer == {"packfeed/role": "trainer"}
    assert chosen.driver_options() == {"label_selector": {"packfeed/role": "!trainer"}}
    with pytest.raises(ValueError, match=r"train workers: 3 x \(1 CPU, 1 GPU\)"):
        check_placement(TrainScaling(num_workers=3, cpus_per_worker=1, use_gpu="yes"), use_gpu=True,
                        nodes=[HEAD, PACKER, TRAINER])


def test_on_one_unlabelled_machine_trainers_and_packers_share_its_cpus():
    chosen = check_placement(TrainScaling(), use_gpu=False, nodes=[LAPTOP])  # 2 x 0.5 + 1 x 1 = 2 CPUs
    assert (chosen.packer, chosen.trainer, chosen.driver) == ({}, {}, {})
    with pytest.raises(ValueError, match=r"= 3 CPUs, the nodes they share have 2"):
        check_placement(TrainScaling(num_workers=2, cpus_per_worker=1.0), use_gpu=False, nodes=[LAPTOP])

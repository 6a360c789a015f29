"""``join_group`` (trainer/launch/torchrun.py): the ranks of a torchrun attempt meet on torchrun's
real store (a TCPStore on 127.0.0.1) before their process group forms; a group that cannot form
is one line within its bound, not a silent wait for the backend's timeout. The restart itself
(a rank SIGKILLed, the group back on its attempt's own keys) is
tests/integration/train/test_torchrun.py's."""

from __future__ import annotations

import time

import pytest
import torch.distributed as dist

from packfeed.trainer.launch.torchrun import join_group


def test_a_rank_whose_peers_never_start_fails_in_one_line_within_the_bound(monkeypatch):
    store = dist.TCPStore("127.0.0.1", 0, 2, is_master=True, wait_for_workers=False)  # torchrun's agent's
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(store.port))
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    start = time.monotonic()
    with pytest.raises(ValueError, match=r"^rank 0: 1 of 2 ranks joined the group of attempt 1 in 2 s; the others "
                                         r"did not start") as error:
        join_group("gloo", rank=0, world=2, arrive_s=2)
    assert 2 <= time.monotonic() - start < 30 and "\n" not in str(error.value)
    assert not dist.is_initialized()
    # what the attempt's rank wrote is under its own prefix: the next attempt counts from zero
    assert dist.PrefixStore("packfeed/attempt-1", store).add("arrived", 0) == 1
    assert dist.PrefixStore("packfeed/attempt-2", store).add("arrived", 0) == 0


def test_no_store_to_join_is_one_line_within_the_bound(monkeypatch):
    gone = dist.TCPStore("127.0.0.1", 0, 2, is_master=True, wait_for_workers=False)
    port = gone.port
    del gone  # a port nothing listens on any more: an agent that is gone
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    start = time.monotonic()
    with pytest.raises(ValueError, match=rf"^rank 1: torchrun's store at 127.0.0.1:{port} did not answer in 2 s"):
        join_group("gloo", rank=1, world=2, arrive_s=2)
    assert time.monotonic() - start < 30

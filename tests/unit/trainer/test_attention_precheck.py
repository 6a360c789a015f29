"""An attention back-end the train workers' device cannot run is refused on the driver in one
line, exit 2, before Ray starts (the unit conftest makes ``ray.init`` fail loudly), and on a
torchrun rank before its process group; before, every Ray Train worker died with
``RuntimeError: attention back-end 'packfeed_varlen' needs a CUDA GPU, but the device is cpu``."""

from __future__ import annotations

import os

import pytest
import torch

from packfeed.service.cli import main
from packfeed.trainer.model.attention import check_attention, ray_workers_device

DEMO = os.path.join(os.path.dirname(__file__), "..", "..", "..", "examples", "train_demo.toml")
CUDA_BACKENDS = ["varlen", "packfeed_varlen", "flash_attention_2", "fa2", "flash_attention_4"]


@pytest.mark.parametrize("attn", CUDA_BACKENDS)
def test_a_cuda_backend_on_the_cpu_is_a_users_error(attn):
    with pytest.raises(ValueError, match=rf"^--attn {attn} \(\[model\] attn\) cannot run on the train workers' "
                                         r"device \(the CPU: x\): .*needs .*"):
        check_attention(attn, "cpu", "the CPU: x")


@pytest.mark.parametrize("attn", ["auto", "sdpa", "eager", "SDPA"])
def test_what_runs_on_the_cpu_passes(attn):
    check_attention(attn, "cpu")


@pytest.mark.parametrize("use_gpu, embedded, cuda, device", [
    pytest.param("no", False, True, "cpu", id="use-gpu-no-anywhere"),
    pytest.param("auto", True, False, "cpu", id="embedded-without-gpu"),
    pytest.param("yes", True, False, "cpu", id="embedded-asked-gpu-has-none"),
    pytest.param("auto", True, True, None, id="embedded-gpu-checked-by-the-workers"),
    pytest.param("auto", False, False, None, id="cluster-unknown"),
])
def test_the_drivers_knowledge_of_the_workers_device(monkeypatch, use_gpu, embedded, cuda, device):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    found = ray_workers_device(use_gpu, embedded=embedded)
    assert (found and found[0]) == device


def test_packfeed_train_refuses_before_ray_starts(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    code = main(["train", "--config", DEMO, "--attn", "varlen", "--output", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    assert err.strip().splitlines()[-1].startswith(
        "packfeed train: error: --attn varlen ([model] attn) cannot run on the train workers' device (the CPU: "
        "this machine has no CUDA GPU")
    assert not (tmp_path / "run").exists()  # refused before the output was prepared


def test_a_torchrun_rank_refuses_before_its_process_group(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for name, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0")):
        monkeypatch.setenv(name, value)
    code = main(["train", "--config", DEMO, "--attn", "varlen", "--launcher", "torchrun", "--server", "127.0.0.1:1",
                 "--output", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and "packfeed train: error: --attn varlen ([model] attn): attention back-end 'packfeed_varlen' " \
                         "needs a CUDA GPU, but the device is cpu" in err, err

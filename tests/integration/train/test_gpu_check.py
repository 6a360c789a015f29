"""tests/gpu/gpu_check.sh, the GPU check of the whole trainer, run on CPU with a tiny model.

The script's every step runs as it will on a GPU machine (tests/gpu through pytest, a pack on
the driver without Ray, `packfeed train --launcher torchrun` with FSDP2, full activation
checkpointing and the chunked loss, bench/bench_memory.py, the report), sized for CPU by
GPU_CHECK_CPU=1; the report must hold each figure it promises.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from support.serve import REPO

pytestmark = pytest.mark.integration


def test_the_gpu_check_runs_every_step_on_cpu_and_writes_its_report(tmp_path):
    out = tmp_path / "check"
    proc = subprocess.run(["bash", str(REPO / "tests" / "gpu" / "gpu_check.sh"), str(out)], cwd=REPO,
                          env={**os.environ, "GPU_CHECK_CPU": "1", "RAY_ADDRESS": ""}, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((out / "train" / "summary.json").read_text())
    assert summary["steps"] == 6 and summary["launcher"] == "torchrun"
    assert (out / "train" / "final" / "model.safetensors").exists()
    report = (out / "report.md").read_text()
    for promised in ("# packfeed GPU check on CPU", "tests/gpu:", "padded (one sample a row) would need",
                     "real tokens/s", "peak memory per rank:", "loss:", "fsdp-full-chunked"):
        assert promised in report, (promised, report)
    stats = json.loads((out / "packed" / ".packfeed" / "stats.json").read_text())
    assert stats["rows"] < stats["samples_packed"], "long documents, packed: fewer rows than samples"

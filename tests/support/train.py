"""A small `packfeed train` run as a real process, and what a stopped or finished one must show.

Used by tests/integration/train/test_train_signals.py (Ctrl-C), train/test_train_fsdp.py (SIGTERM
to the driver, resumed at another world size) and cluster/test_local_cluster.py (`ray job stop`).
The run:
tiny Llama, 2 workers, seq_len 256, 4 rows a step, a metrics record every step, the only
checkpoint at the stop (or the end), every (step, rank)'s rows recorded.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import time
from pathlib import Path

from support.serve import REPO, GroupWatch, kill_groups

from packfeed.service.assets import demo_corpus_paths, demo_tokenizer_path
from packfeed.trainer.state.checkpoint import latest_checkpoint, read_state
from packfeed.trainer.loop.interval import read_jsonl

STEPS, WORKERS, ROWS_PER_RANK = 50, 2, 2  # 4 rows a step; the corpus below holds ~57 steps of rows
SIGNAL_AT = 2  # the step a run has reached when the signal is sent: mid-run, far from STEPS
PACKFEED = str(REPO / ".venv" / "bin" / "packfeed")
STOPPED = re.compile(r"stopped at step (\d+) of (\d+) \((SIG\w+)\): checkpoint (\S+); continue with "
                     r"`packfeed train \.\.\. --resume`")


def corpus_head(root: Path, lines: int) -> list[str]:
    """The first ``lines`` lines of each bundled corpus file, written under ``root``: the paths
    (100 lines: ~100 rows of 256 tokens, so a run can use its data up)."""
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for source in demo_corpus_paths():
        path = root / os.path.basename(source)
        with open(source) as f:
            path.write_text("".join(itertools.islice(f, lines)))
        paths.append(str(path))
    return paths


def run_config_text(inputs: list[str], *, steps: int, window_samples: int | None = 64, epochs: int | None = None,
                    packing: bool = True) -> str:
    """The TOML of the tests' small runs: the bundled tokenizer, seq_len 256, tiny Llama (SDPA),
    2 workers of 2 rows a step, a metrics record every step, every (step, rank)'s rows recorded,
    the only checkpoint at the stop (or the end); ``packing``: the packing actor's [scaling] keys
    (a run that packs under Ray; not for torchrun's)."""
    data = "".join(f"{key} = {value}\n" for key, value in (("window_samples", window_samples), ("epochs", epochs))
                   if value is not None)
    packers = "packing_workers = 1\npacking_cpus_per_worker = 0.5\n" if packing else ""
    return f"""
[data]
inputs = {json.dumps(inputs)}
tokenizer = {json.dumps(demo_tokenizer_path())}
seq_len = 256
{data}
[model]
name = "tiny-llama"
attn = "sdpa"

[train]
max_steps = {steps}
micro_batch_rows = {ROWS_PER_RANK}
grad_accum = 1
log_every = 1
checkpoint_every = 0
lr = 3e-3
warmup_steps = 2
record_rows = true

[scaling]
num_workers = {WORKERS}
cpus_per_worker = 0.5
{packers}"""


def write_config(root: Path) -> Path:
    """A run config on the first 100 lines of each bundled file, 3 epochs (~229 rows of 256)."""
    path = root / "run.toml"
    path.write_text(run_config_text(corpus_head(root, 100), steps=STEPS, epochs=3))
    return path


class Train:
    """`packfeed train` in its own process group with its own embedded Ray, its output in ``log``
    and every process group of its tree watched (``left()``: what still runs after it ended)."""

    def __init__(self, config: Path, output: Path, *flags: str) -> None:
        self.log = output.with_name(output.name + f"-{time.monotonic_ns()}.log")
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [PACKFEED, "train", "--config", str(config), "--output", str(output), *flags], stdout=out,
                stderr=subprocess.STDOUT, env={**os.environ, "RAY_ADDRESS": ""}, cwd=REPO, start_new_session=True)
        self.watch = GroupWatch(self.proc.pid)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def text(self) -> str:
        return re.sub(r"\x1b\[[0-9;]*m", "", self.log.read_text(errors="replace"))  # Ray colours worker lines

    def ended(self, timeout: float = 300) -> tuple[int, str]:
        """(exit status, output) once it ends; its processes are killed if it does not."""
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            kill_groups(self.watch.groups)
            raise AssertionError(f"packfeed train did not end in {timeout:.0f} s:\n{self.text()[-3000:]}") from None
        out = self.text()
        assert "Traceback" not in out, out[-4000:]
        return self.proc.returncode, out

    def left(self) -> list[str]:
        """The run's processes still alive 30 s after it ended (killed, so none outlives the test)."""
        left = self.watch.left(timeout=30)
        kill_groups(self.watch.groups)
        return left


def wait_for_step(output: Path, step: int, alive, timeout: float = 300) -> int:
    """Wait until the run's metrics reach ``step``; returns the step reached."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        records = read_jsonl(output / "metrics.jsonl") if (output / "metrics.jsonl").exists() else []
        if records and records[-1]["step"] >= step:
            return records[-1]["step"]
        assert alive(), "the run ended before it reached the step to signal at"
        time.sleep(0.05)
    raise AssertionError(f"the run did not reach step {step} in {timeout:.0f} s")


def wait_for_line(run: Train, pattern: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and run.alive():
        if re.search(pattern, run.text()):
            return
        time.sleep(0.05)
    raise AssertionError(f"no line {pattern!r}:\n{run.text()[-3000:]}")


def last_packfeed_line(out: str) -> str:
    """The driver's last own line (Ray forwards the workers' lines late, after it at times)."""
    return [line for line in out.splitlines() if line.startswith("packfeed train:")][-1]


def trained(output: Path) -> list[tuple[int, int, list[int]]]:
    """(step, rank, global row indices) of every step every rank trained, in file order."""
    return [(r["step"], r["rank"], r["row_index"]) for path in sorted((output / "rows").glob("rank*.jsonl"))
            for r in read_jsonl(path)]


def steps_of_every_rank(last: int) -> list[tuple[int, int]]:
    return [(s, r) for s in range(1, last + 1) for r in range(WORKERS)]


def contract_rows(step: int, rank: int) -> list[int]:
    """The rows an uninterrupted run trains: rank k of N gets the step's rows k mod N."""
    per_step = WORKERS * ROWS_PER_RANK
    return [per_step * (step - 1) + rank + WORKERS * j for j in range(ROWS_PER_RANK)]


def assert_stopped_at_checkpoint(output: Path, out: str, signal_name: str, signalled_at: int, *,
                                 steps: int = STEPS) -> tuple[int, Path]:
    """The driver's line names the checkpoint of the step every rank stopped after, of a run of
    ``steps``; returns (that step, the checkpoint)."""
    match = STOPPED.search(out)
    assert match, out[-3000:]
    step, last, name, checkpoint = int(match[1]), int(match[2]), match[3], Path(match[4])
    assert (name, last) == (signal_name, steps)
    assert signalled_at <= step < steps, "the signal came mid-run and the run stopped soon after it"
    assert latest_checkpoint(output) == checkpoint and read_state(checkpoint)["step"] == step
    assert {"scheduler.pt", "trainer_state.json"} <= {p.name for p in checkpoint.iterdir()}
    assert sorted((s, r) for s, r, _ in trained(output)) == steps_of_every_rank(step), \
        "every rank trained the same steps, each once, and stopped after the checkpointed one"
    assert not (output / "final").exists(), "a stopped run writes no final model"
    return step, checkpoint


def assert_final_model(output: Path, steps: int) -> None:
    """A finished run's final/: its state at the last step, the model and tokenizer files, nothing
    left of its writing, and a summary without a stop."""
    assert json.loads((output / "final" / "packfeed_state.json").read_text()) == {"step": steps}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= \
        {p.name for p in (output / "final").iterdir()}
    assert not list(output.glob(".final*")), "nothing is left of the final model's writing"
    summary = json.loads((output / "summary.json").read_text())
    assert summary["steps"] == steps and "stopped" not in summary


def assert_a_finished_run_resumes_to_nothing(config: Path, output: Path, steps: int, *flags: str) -> None:
    """``--resume`` of a finished run says so, starts no Ray and changes no file."""
    before = {p: p.read_bytes() for p in (output / "summary.json", output / "metrics.jsonl")}
    names = sorted(str(p.relative_to(output)) for p in output.rglob("*"))
    code, out = Train(config, output, *flags, "--resume").ended(timeout=120)
    assert code == 0, out[-3000:]
    assert f"is finished, nothing to do: it trained step {steps} of {steps}" in out, out[-2000:]
    assert "Ray:" not in out, "a finished run starts no Ray"
    assert {p: p.read_bytes() for p in before} == before, "summary.json and metrics.jsonl untouched"
    assert sorted(str(p.relative_to(output)) for p in output.rglob("*")) == names



"""A three-node Ray cluster on one machine: packing on the packer node, training on the trainer
node, the feeder on neither trainer (docs/design.md, "On a cluster").

Three ``ray start`` processes on 127.0.0.1 (a head; a CPU node labelled packfeed/role=packer; a
"GPU" node labelled packfeed/role=trainer whose accelerator is a custom resource, fake_gpu)
with fractional CPU requests so everything fits 2 cores. ``packfeed train`` and ``packfeed
serve`` run with an EMPTY placement config: the role labels alone place them. Ray's state API
then says where every actor ran. The packer node's Ray metrics endpoint shows packfeed's
packing counters. A placement no node can satisfy, and an unreachable head, fail at once with
a message naming what is missing. The test stops exactly the processes it started.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
from support.ports import free_port
from support.serve import REPO

from packfeed.service.assets import demo_corpus_paths, demo_tokenizer_path

pytestmark = pytest.mark.integration

RAY = str(REPO / ".venv" / "bin" / "ray")
PACKFEED = str(REPO / ".venv" / "bin" / "packfeed")


@pytest.fixture(scope="module")
def cluster():
    root = Path(tempfile.mkdtemp(prefix="pf3-", dir="/tmp"))  # short: Ray's socket paths are limited
    token = root / "auth_token"
    token.write_text(secrets.token_hex(16))
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token), "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    ports = {name: free_port() for name in ("gcs", "dashboard", "client", "agent0", "agent1", "agent2", "metrics0",
                                            "metrics1", "metrics2")}
    head = f"127.0.0.1:{ports['gcs']}"
    common = ["--node-ip-address", "127.0.0.1", "--disable-usage-stats"]
    nodes = [
        ["--head", "--port", str(ports["gcs"]), "--num-cpus", "1", "--temp-dir", str(root / "tmp"),
         "--include-dashboard", "true", "--dashboard-host", "127.0.0.1", "--dashboard-port", str(ports["dashboard"]),
         "--ray-client-server-port", str(ports["client"]), "--dashboard-agent-listen-port", str(ports["agent0"]),
         "--metrics-export-port", str(ports["metrics0"])],
        ["--address", head, "--num-cpus", "2", "--labels", "packfeed/role=packer",
         "--dashboard-agent-listen-port", str(ports["agent1"]), "--metrics-export-port", str(ports["metrics1"])],
        ["--address", head, "--num-cpus", "2", "--resources", '{"fake_gpu": 2}', "--labels", "packfeed/role=trainer",
         "--dashboard-agent-listen-port", str(ports["agent2"]), "--metrics-export-port", str(ports["metrics2"])],
    ]
    try:
        for args in nodes:
            subprocess.run([RAY, "start", *args, *common], env=env, check=True, capture_output=True, timeout=180)
        yield {"root": root, "env": env, "head": head, "ports": ports}
    finally:
        subprocess.run([sys.executable, str(REPO / "deploy" / "local" / "stop_cluster.py"), str(root / "tmp")],
                       capture_output=True, timeout=120)


def actors_by_role(cluster) -> dict[str, set[str]]:
    """class name -> roles of the nodes its actors ran on (alive or dead). An actor Ray never
    placed (its creation cancelled at the end of the stream: Ray Data's pool may still be
    asking for one) ran on no node and has none."""
    code = (
        "from ray.util.state import list_actors, list_nodes\n"
        f"url = 'http://127.0.0.1:{cluster['ports']['dashboard']}'\n"
        "roles = {n.node_id: n.labels.get('packfeed/role', 'head') for n in list_nodes(address=url)}\n"
        "for a in list_actors(address=url, detail=True, limit=10000):\n"
        "    if a.node_id: print(a.class_name, roles.get(a.node_id))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env=cluster["env"], capture_output=True, text=True, timeout=120,
                         check=True).stdout
    found: dict[str, set[str]] = {}
    for line in out.splitlines():
        name, role = line.rsplit(" ", 1)
        found.setdefault(name, set()).add(role)
    return found


def test_train_runs_packing_on_the_packer_node_and_workers_on_the_trainer_node(cluster, tmp_path):
    config = tmp_path / "train.toml"
    corpus = ", ".join(f'"{p}"' for p in demo_corpus_paths())
    config.write_text(
        f'[data]\ninputs = [{corpus}]\ntokenizer = "{demo_tokenizer_path()}"\nseq_len = 512\n'
        '[model]\nname = "tiny-llama"\noverrides = { hidden_size = 64, intermediate_size = 128, num_hidden_layers = 1, '
        'num_attention_heads = 2, num_key_value_heads = 1 }\n'
        "[train]\nmax_steps = 2\nmicro_batch_rows = 2\ncheckpoint_every = 0\n"
        # no placement at all: the node labels place everything
        '[scaling]\nnum_workers = 2\ncpus_per_worker = 0.5\nuse_gpu = "no"\ntrainer_resources = { fake_gpu = 1 }\n'
        "packing_workers = 1\npacking_cpus_per_worker = 1.0\n"
    )
    proc = subprocess.run([PACKFEED, "train", "--config", str(config), "--address", cluster["head"],
                           "--output", str(tmp_path / "run")], env=cluster["env"], capture_output=True, text=True,
                          timeout=400)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    where = actors_by_role(cluster)
    assert where["MapWorker(MapBatches(WindowActor))"] == {"packer"}, where
    assert where["RayTrainWorker"] == {"trainer"}, where
    assert "trainer" not in where["StreamFeeder"], where


def test_serve_packs_on_the_packer_node_and_its_counters_reach_rays_metrics(cluster, tmp_path):
    from packfeed.client.stream import PackedStream

    port = free_port()
    server = subprocess.Popen(
        [PACKFEED, "serve", *demo_corpus_paths(), "--tokenizer", demo_tokenizer_path(), "--seq-len", "512",
         "--address", cluster["head"], "--port", str(port), "--state-dir", str(tmp_path / "state")],
        env=cluster["env"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    try:
        with PackedStream(f"127.0.0.1:{port}", batch_rows=8, retry_timeout_s=180) as stream:
            samples = sorted(int(s) for batch in stream for s in batch.sample_ids if s >= 0)
        assert samples == list(range(7500))
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(120) == 0, server.stderr.read()[-3000:]
    assert actors_by_role(cluster)["MapWorker(MapBatches(WindowActor))"] == {"packer"}
    url = f"http://127.0.0.1:{cluster['ports']['metrics1']}/metrics"
    counters = ("ray_packfeed_windows_packed_total", "ray_packfeed_actor_packed_tokens_total")
    deadline = time.monotonic() + 60  # Ray exports the actors' counters every few seconds
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    while time.monotonic() < deadline and not all(name in text for name in counters):
        time.sleep(0.5)
        text = urllib.request.urlopen(url, timeout=10).read().decode()
    assert all(name in text for name in counters), [name for name in counters if name not in text]


def test_a_placement_no_node_satisfies_fails_at_once_naming_the_labels(cluster, tmp_path):
    start = time.monotonic()
    proc = subprocess.run(
        [PACKFEED, "pack", *demo_corpus_paths(), "--tokenizer", demo_tokenizer_path(), "--seq-len", "512",
         "--address", cluster["head"], "--packer-label", "packfeed/role=gpu", "--output", str(tmp_path / "out")],
        env=cluster["env"], capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "no node matches the labels {'packfeed/role': 'gpu'}" in proc.stderr
    assert "packfeed/role=packer" in proc.stderr and "packfeed/role=trainer" in proc.stderr
    assert time.monotonic() - start < 60 and "Traceback" not in proc.stderr


def test_an_unreachable_head_is_one_clear_error(tmp_path):
    port = free_port()  # nothing listens there
    proc = subprocess.run([PACKFEED, "pack", *demo_corpus_paths(), "--tokenizer", demo_tokenizer_path(), "--seq-len",
                           "512", "--address", f"127.0.0.1:{port}", "--output", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and f"cannot reach the Ray head at 127.0.0.1:{port}" in proc.stderr
    assert "Traceback" not in proc.stderr

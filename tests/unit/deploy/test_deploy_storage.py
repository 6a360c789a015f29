"""deploy/k8s keeps its data on a bucket (issue 23), checked offline: no cluster, no network.

Inputs, pack's and train's --output (checkpoints included) and serve's --state-dir are URIs on
one bucket; the Ray container of every pod (head: the driver lists, scans and writes metadata;
packer: the packing actors read; trainer: the train workers upload checkpoints) has that store's
credentials from the Secret packfeed-storage (secretKeyRef, or a key file of a volume of that
Secret), never as literal values; no pod mounts a data volume; the tokenizer is in the image.
Each check has a test that breaks a manifest and expects it to fail, and the GCS form that
raycluster.yaml describes passes.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from support.deploy import (
    CREDENTIAL_ENV,
    Manifests,
    credential_problems,
    data_volumes,
    doc_id,
    dockerfile_instructions,
    dockerignored,
    flag_value,
    groups,
    load_text,
    parse_entrypoint,
    ray_container,
    uri_buckets,
)
from packfeed.service.commands.args import data_config_from_args
from packfeed.service.storage import scheme_of

REPO = Path(__file__).resolve().parents[3]
K8S = Manifests(REPO / "deploy" / "k8s")
DOCKER = REPO / "deploy" / "docker"
JOBS = K8S.jobs
CLUSTERS = [pytest.param(spec, id=name) for name, spec in K8S.cluster_specs]
STORAGE_SECRET = "packfeed-storage"  # the bucket's credentials (raycluster.yaml says how to create it)
find, cluster_of = K8S.find, K8S.cluster_of


def image_root() -> Path:
    """Where the Dockerfile copies this repository in the image."""
    return Path(next(rest for kind, rest in dockerfile_instructions(DOCKER / "Dockerfile") if kind == "WORKDIR"))


def image_problem(path: str) -> str | None:
    """Why ``path`` is not in the image's copy of this repository (None when it is, or when it
    is no path: a Hugging Face id). With no data volume, a local path is in the image or nowhere."""
    if not path.startswith("/"):
        return None
    p = Path(path)
    if image_root() not in p.parents:
        return f"{path}: not in the image ({image_root()}), and no pod has a data volume"
    relative = p.relative_to(image_root())
    matches = sorted(REPO.glob(str(relative)))
    if not matches:
        return f"{path}: nothing at {relative} in the repository the image copies"
    if any(dockerignored(m.relative_to(REPO).as_posix(), (REPO / ".dockerignore").read_text()) for m in matches):
        return f"{path}: .dockerignore leaves it out of the image"
    return None


def bucket_problems(job: dict, data) -> list[str]:
    """Why ``job``'s data (``data``: its DataConfig) is not all on a store that the Ray container
    of every pod of its cluster reaches with credentials from the storage Secret: inputs,
    ``--output`` and ``--state-dir`` are URIs of a scheme with known credentials (a local path is
    one pod's own disk), and every group has those credentials."""
    entrypoint = job["spec"]["entrypoint"]
    outputs = [(flag, value) for flag in ("--output", "--state-dir") if (value := flag_value(entrypoint, flag))]
    problems = [] if outputs else ["neither --output nor --state-dir"]
    schemes = set()
    for what, path in [*(("input", p) for source in data.sources for p in source.paths), *outputs]:
        scheme = scheme_of(path)
        if not scheme:
            problems.append(f"{what} {path}: a local path, not on the bucket (each pod has its own disk)")
        elif scheme not in CREDENTIAL_ENV:
            problems.append(f"{what} {path}: no credentials known for {scheme}://")
        schemes.add(scheme)
    for name, group in groups(cluster_of(job)):
        problems += [f"{name}: {p}" for scheme in sorted(schemes & set(CREDENTIAL_ENV))
                     for p in credential_problems(group, scheme, STORAGE_SECRET)]
    return problems


def job_data(job: dict, tmp_path: Path, edit_config=lambda text: text):
    """The job's DataConfig, from its config file (``edit_config`` applied to its text) and flags."""
    args = parse_entrypoint(job["spec"]["entrypoint"])
    return data_config_from_args(args, load_text(edit_config(K8S.config_text(job, args)), args, tmp_path))


@pytest.mark.parametrize("item", JOBS, ids=doc_id)
def test_data_is_on_a_bucket_every_pod_reaches_with_the_secrets_credentials(item, tmp_path):
    """Issue 23: inputs, outputs, checkpoints and serve's state on a bucket; the driver (head),
    the packing actors (packer) and the train workers (trainer) all read or write it."""
    job = item[1]
    data = job_data(job, tmp_path)
    assert not bucket_problems(job, data), bucket_problems(job, data)
    assert image_problem(data.tokenizer) is None, image_problem(data.tokenizer)


@pytest.mark.parametrize("cluster", CLUSTERS)
def test_no_pod_mounts_a_data_volume(cluster):
    found = {name: data_volumes(group) for name, group in groups(cluster) if data_volumes(group)}
    assert not found, found


def test_every_uri_of_deploy_k8s_names_one_bucket():
    """One bucket to replace when adopting the manifests (config.yaml says so); comments included."""
    buckets = uri_buckets("".join(path.read_text() for path in sorted(K8S.folder.glob("*.yaml"))))
    assert len(buckets) == 1, buckets


def _container_env(doc, group_index):
    spec = doc["spec"]["rayClusterSpec"]
    group = spec["headGroupSpec"] if group_index is None else spec["workerGroupSpecs"][group_index]
    return ray_container(group)["env"]


def _set_env(doc, group_index, name, entry):
    env = _container_env(doc, group_index)
    env[next(i for i, e in enumerate(env) if e["name"] == name)] = {"name": name, **entry}


@pytest.mark.parametrize("change, expected", [
    pytest.param(lambda d: _container_env(d, 0).clear(), "packer: no AWS_ACCESS_KEY_ID", id="packer-without-env"),
    pytest.param(lambda d: _set_env(d, 1, "AWS_SECRET_ACCESS_KEY", {"value": "wJalr"}),
                 "trainer: AWS_SECRET_ACCESS_KEY: not from key", id="literal-secret"),
    pytest.param(lambda d: _set_env(d, None, "AWS_ACCESS_KEY_ID",
                                    {"valueFrom": {"secretKeyRef": {"name": "other", "key": "AWS_ACCESS_KEY_ID"}}}),
                 "head: AWS_ACCESS_KEY_ID: not from key AWS_ACCESS_KEY_ID of Secret packfeed-storage",
                 id="another-secret"),
    pytest.param(lambda d: _set_env(d, 0, "AWS_ENDPOINT_URL",
                                    {"valueFrom": {"secretKeyRef": {"name": STORAGE_SECRET, "key": "AWS_ENDPOINT_URL"}}}),
                 "packer: AWS_ENDPOINT_URL: optional must be True", id="endpoint-required"),
    pytest.param(lambda d: d["spec"].update(entrypoint=d["spec"]["entrypoint"].replace(
        "s3://example-bucket/packfeed/runs/train", "/mnt/packfeed/runs/train")), "--output /mnt/packfeed/runs/train: "
                 "a local path", id="output-on-a-pod-disk"),
    pytest.param(lambda d: d["spec"].update(entrypoint=d["spec"]["entrypoint"].replace("s3://", "wasb://")),
                 "no credentials known for wasb://", id="unknown-scheme"),
])
def test_the_bucket_check_rejects_a_broken_job(change, expected, tmp_path):
    doc = copy.deepcopy(find("RayJob", "packfeed-train"))
    change(doc)
    problems = bucket_problems(doc, job_data(doc, tmp_path))
    assert any(expected in p for p in problems), problems


def test_the_volume_check_finds_a_data_volume():
    group = copy.deepcopy(find("RayJob", "packfeed-train")["spec"]["rayClusterSpec"]["workerGroupSpecs"][1])
    group["template"]["spec"]["volumes"].append({"name": "shared", "persistentVolumeClaim": {"claimName": "c"}})
    assert data_volumes(group) == ["shared (persistentVolumeClaim)"]


@pytest.mark.parametrize("with_volume", [True, False])
def test_the_bucket_check_takes_gcs_with_a_key_file_from_the_secret(with_volume, tmp_path):
    """The GCS form raycluster.yaml describes: GOOGLE_APPLICATION_CREDENTIALS names a key file
    that a volume of the storage Secret holds."""
    doc = copy.deepcopy(find("RayJob", "packfeed-train"))
    doc["spec"]["entrypoint"] = doc["spec"]["entrypoint"].replace("s3://", "gs://")
    for _, group in groups(doc["spec"]["rayClusterSpec"]):
        container = ray_container(group)
        container["env"] = [{"name": "GOOGLE_APPLICATION_CREDENTIALS", "value": "/etc/packfeed/gcs/key.json"}]
        if with_volume:
            container["volumeMounts"].append({"name": "gcs", "mountPath": "/etc/packfeed/gcs", "readOnly": True})
            group["template"]["spec"]["volumes"].append({"name": "gcs", "secret": {"secretName": STORAGE_SECRET}})
    problems = bucket_problems(doc, job_data(doc, tmp_path, lambda text: text.replace("s3://", "gs://")))
    if with_volume:
        assert not problems, problems
    else:
        assert len(problems) == 3 and all("not a file of a volume of Secret packfeed-storage" in p for p in problems)

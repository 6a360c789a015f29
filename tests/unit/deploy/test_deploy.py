"""The KubeRay manifests of deploy/k8s, checked offline: no cluster, no network.

Every ray.io document validates against KubeRay's CRD schema (as strictly as `kubectl apply`,
see support/deploy.py) and passes the rules KubeRay's operator adds; every RayJob entrypoint is a
command packfeed's own parser accepts; the config file it names is in a ConfigMap mounted
there, loads with packfeed's loaders, and packfeed's placement check accepts the cluster the
manifest describes; serve reads its token and TLS from Secrets and is reachable through a
Service. test_deploy_storage.py checks that the data lives on a bucket every pod reaches,
test_deploy_image.py the image.

Each kind of check has a test that breaks a manifest or a config and expects it to fail.
The CRD schemas are reference data outside the repository, in ../shared/k8s (its README).
"""

from __future__ import annotations

import argparse
import copy
import functools
import re
import tomllib
from pathlib import Path

import pytest
import yaml
from jsonschema import Draft7Validator

from support.deploy import (
    CRD_FILES,
    Manifests,
    constraint_pins,
    crd_schemas,
    doc_id,
    dockerfile_instructions,
    gpus,
    groups,
    load_text,
    operator_rule_errors,
    parse_entrypoint,
    pod_labels,
    ray_container,
    ray_nodes,
    ray_resources,
    volume_at,
    volume_file_key,
)
from packfeed.service.cluster import placement
from packfeed.service.cli import build_parser
from packfeed.service.commands import serve
from packfeed.service.commands.args import data_config_from_args, load_config_file, packing_from_args
from packfeed.trainer.launch.command import run_config_from_args
from packfeed.service.cluster.placement import check_train_placement as check_placement

REPO = Path(__file__).resolve().parents[3]
K8S = Manifests(REPO / "deploy" / "k8s")
DOCKER = REPO / "deploy" / "docker"
CRD_DIR = REPO.parent / "shared" / "k8s"
MANIFESTS, RAY_DOCS, JOBS, CLUSTER_SPECS = K8S.items, K8S.ray_docs, K8S.jobs, K8S.cluster_specs
OTHER_DOCS = [m for m in MANIFESTS if m not in RAY_DOCS]
CLUSTERS = [pytest.param(spec, id=name) for name, spec in CLUSTER_SPECS]
CORE_API = {"ConfigMap": "v1", "Secret": "v1", "Service": "v1", "PersistentVolumeClaim": "v1"}
DNS_1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
find, cluster_of, config_text = K8S.find, K8S.cluster_of, K8S.config_text


@functools.lru_cache(maxsize=1)
def schemas() -> dict[tuple[str, str], dict]:
    """KubeRay's CRD schemas; the calling test FAILS (never skips) when they are not there."""
    missing = [name for name in CRD_FILES if not (CRD_DIR / name).is_file()]
    if missing:
        pytest.fail(f"{CRD_DIR} lacks {', '.join(missing)}: deploy/k8s is validated against KubeRay's CRDs. Copy "
                    "ray-operator/config/crd/bases/{" + ",".join(CRD_FILES) + "} of ray-project/kuberay (the release "
                    "the manifests target, v1.7.x) into that folder (../shared/k8s next to the repository)",
                    pytrace=False)
    return crd_schemas(CRD_DIR)


def schema_errors(doc: dict) -> list[str]:
    key = (doc.get("apiVersion"), doc.get("kind"))
    if key not in schemas():
        return [f"no CRD schema for {key}; known: {sorted(schemas())}"]
    errors = Draft7Validator(schemas()[key]).iter_errors(doc)
    return sorted(f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in errors)


def job_command(job: dict) -> str:
    return parse_entrypoint(job["spec"]["entrypoint"]).command


def check_with_packfeed(args: argparse.Namespace, base: dict, cluster: dict) -> dict[str, dict]:
    """packfeed's own checks of the job's config and flags before anything starts, then its
    placement checks on the nodes the cluster starts with, and for the autoscaled packing pool
    on the most nodes it can grow to. Returns the selectors packfeed resolves (role -> labels)."""
    start, largest = ray_nodes(cluster, "minReplicas"), ray_nodes(cluster, "maxReplicas")
    if args.command == "train":
        scaling = run_config_from_args(args, base).scaling
        has_gpus = any(node["resources"].get("GPU") for node in start)
        use_gpu = scaling.use_gpu == "yes" or (scaling.use_gpu == "auto" and has_gpus)
        chosen = check_placement(scaling, use_gpu=use_gpu, nodes=start)
        selectors = {"packer": chosen.packer, "trainer": chosen.trainer, "driver": chosen.driver}
        packing = scaling.packing
    else:
        data_config_from_args(args, base)
        packing = packing_from_args(args, base)
        if args.command == "serve":
            serve.check_args(args, token="read from the token Secret")
        selectors = {"packer": packing.placed(start).labels}
    request = {"CPU": packing.cpus_per_worker, **packing.resources}
    if args.command != "train":  # None: one actor per CPU of the packer nodes, which fits by construction
        placement.check_fits("packing actors", request, packing.num_workers or 1, selectors["packer"], start)
    if packing.max_workers:
        placement.check_fits("packing actors at packing_max_workers", request, packing.max_workers, selectors["packer"],
                             largest)
    return selectors


# --- what deploy/k8s holds ---------------------------------------------------------------------


def test_deploy_k8s_runs_pack_train_and_serve_on_a_raycluster():
    """Guards the parametrized tests below from passing on nothing."""
    kinds = {doc["kind"] for _, doc in MANIFESTS}
    assert {"RayCluster", "RayJob", "ConfigMap", "Service"} <= kinds, kinds
    assert "PersistentVolumeClaim" not in kinds, "data lives on a bucket, not on a shared volume"
    assert sorted(job_command(doc) for _, doc in JOBS) == ["pack", "serve", "train"]
    assert len(CLUSTERS) == 3  # the RayCluster, and the clusters of the train and serve jobs


@pytest.mark.parametrize("item", RAY_DOCS, ids=doc_id)
def test_ray_documents_validate_against_the_kuberay_crds(item):
    errors = schema_errors(item[1])
    assert not errors, f"{doc_id(item)}:\n" + "\n".join(errors)


TRAIN_GROUP = ["spec", "rayClusterSpec", "workerGroupSpecs", 0]


@pytest.mark.parametrize("path, value, expected", [
    pytest.param(TRAIN_GROUP + ["minReplicas"], "1", "is not of type 'integer'", id="string-for-integer"),
    pytest.param(TRAIN_GROUP + ["maxReplica"], 4, "'maxReplica' was unexpected", id="unknown-field"),
    pytest.param(TRAIN_GROUP + ["labels", "packfeed/role"], 1, "is not of type 'string'", id="label-not-a-string"),
    pytest.param(TRAIN_GROUP + ["template", "spec", "containers", 0, "resources", "limits", "cpu"], "eight",
                 "does not match", id="bad-quantity"),
    pytest.param(["spec", "shutdownAfterJobFinishes"], "yes", "is not of type 'boolean'", id="string-for-boolean"),
])
def test_the_schema_check_rejects_a_broken_manifest(path, value, expected):
    doc = copy.deepcopy(find("RayJob", "packfeed-train"))
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    errors = schema_errors(doc)
    assert any(expected in e for e in errors), errors


@pytest.mark.parametrize("item", RAY_DOCS, ids=doc_id)
def test_ray_documents_pass_the_kuberay_operator_rules(item):
    errors = operator_rule_errors(item[1])
    assert not errors, f"{doc_id(item)}: " + "; ".join(errors)


def _workers(doc):
    return doc["spec"]["rayClusterSpec"]["workerGroupSpecs"]


@pytest.mark.parametrize("change, expected", [
    pytest.param(lambda d: _workers(d)[0]["rayStartParams"].update(labels="packfeed/role=packer"), "top-level `labels`",
                 id="labels-in-rayStartParams"),
    pytest.param(lambda d: _workers(d)[0]["labels"].update({"packfeed/role": "packer node"}),
                 "not a Kubernetes label value", id="label-value-with-a-space"),
    pytest.param(lambda d: _workers(d)[0].update(minReplicas=5), "greater than maxReplicas", id="min-above-max"),
    pytest.param(lambda d: d["spec"].update(deletionStrategy={"deletionRules": [
        {"policy": "DeleteCluster", "condition": {"jobStatus": "FAILED"}}]}), "mutually exclusive",
                 id="deletionRules-and-shutdownAfterJobFinishes"),
    pytest.param(lambda d: d["spec"].update(
        shutdownAfterJobFinishes=False, ttlSecondsAfterFinished=0,
        deletionStrategy={"deletionRules": [{"policy": "DeleteWorkers", "condition": {"jobStatus": "FAILED"}}]}),
                 "not supported with autoscaling", id="DeleteWorkers-with-autoscaling"),
    pytest.param(lambda d: d["spec"].update(shutdownAfterJobFinishes=False), "needs shutdownAfterJobFinishes",
                 id="ttl-without-shutdown"),
    pytest.param(lambda d: d["spec"]["rayClusterSpec"].update(rayVersion="2.51.0"), "2.52.0", id="token-auth-old-ray"),
    pytest.param(lambda d: d["metadata"].update(name="packfeed_train"), "DNS-1035", id="name-with-underscore"),
])
def test_the_operator_rules_reject_a_broken_job(change, expected):
    doc = copy.deepcopy(find("RayJob", "packfeed-train"))
    change(doc)
    assert any(expected in e for e in operator_rule_errors(doc)), operator_rule_errors(doc)


# Fields the KubeRay operator refuses unless one of its feature gates is on (v1.7: pkg/features/
# features.go, controllers/ray/utils/validation.go). RayJobDeletionPolicy is beta and on by
# default since 1.6, alpha and off before; the others are alpha and off.
CLUSTER_GATES = {"networkPolicy": "RayClusterNetworkPolicy", "tlsOptions": "RayClusterMTLS",
                 "historyServerOptions": "RayClusterHistoryServer"}


def feature_gated_fields(doc: dict) -> list[str]:
    """The fields of ``doc`` that need an operator feature gate, each with the gate's name."""
    spec, found = doc["spec"], []
    if doc["kind"] == "RayJob" and "deletionStrategy" in spec:
        found.append("spec.deletionStrategy: RayJobDeletionPolicy")
    cluster = spec if doc["kind"] == "RayCluster" else spec.get("rayClusterSpec", {})
    found += [f"{key}: {gate}" for key, gate in CLUSTER_GATES.items() if key in cluster]
    found += [f"workerGroupSpecs[{g['groupName']}].suspend: RayJobDeletionPolicy"
              for g in cluster.get("workerGroupSpecs", []) if g.get("suspend")]
    if cluster.get("gcsFaultToleranceOptions", {}).get("backend") == "rocksdb":
        found.append("gcsFaultToleranceOptions.backend rocksdb: GCSFaultToleranceEmbeddedStorage")
    return found


@pytest.mark.parametrize("item", RAY_DOCS, ids=doc_id)
def test_ray_documents_need_no_operator_feature_gate(item):
    """Issue 24: train-job.yaml used deletionStrategy.deletionRules, which an operator without
    the RayJobDeletionPolicy gate (KubeRay 1.5 and earlier by default) refuses."""
    assert not feature_gated_fields(item[1]), f"{doc_id(item)}: {feature_gated_fields(item[1])}"


@pytest.mark.parametrize("change, expected", [
    pytest.param(lambda d: d["spec"].update(deletionStrategy={"deletionRules": []}), "RayJobDeletionPolicy",
                 id="deletionStrategy"),
    pytest.param(lambda d: d["spec"]["rayClusterSpec"].update(tlsOptions={}), "RayClusterMTLS", id="tlsOptions"),
    pytest.param(lambda d: d["spec"]["rayClusterSpec"]["workerGroupSpecs"][0].update(suspend=True),
                 "RayJobDeletionPolicy", id="suspended-group"),
])
def test_the_feature_gate_check_finds_a_gated_field(change, expected):
    doc = copy.deepcopy(find("RayJob", "packfeed-train"))
    change(doc)
    assert any(expected in f for f in feature_gated_fields(doc)), feature_gated_fields(doc)


@pytest.mark.parametrize("item", JOBS, ids=doc_id)
def test_a_job_deletes_its_own_cluster_after_any_end(item):
    """shutdownAfterJobFinishes acts on every end (succeeded, failed, stopped, never started);
    KubeRay's deletionRules match no stopped job, whose GPU pods would stay until the RayJob is
    deleted. A job on a cluster it does not own leaves it alone."""
    spec = item[1]["spec"]
    if "rayClusterSpec" not in spec:
        assert not spec.get("shutdownAfterJobFinishes"), "a selected cluster is not the job's to delete"
        return
    assert spec.get("shutdownAfterJobFinishes") is True and 0 < spec["ttlSecondsAfterFinished"] <= 900, spec


def test_every_pod_runs_as_the_images_user():
    """Issue 24: every pod runs as the image's user, who owns its files, with that group as
    fsGroup (the group of the mounted Secret and ConfigMap files: the serve token is 0440)."""
    copies = [rest for kind, rest in dockerfile_instructions(DOCKER / "Dockerfile") if kind == "COPY"]
    uid, gid = (int(x) for x in re.search(r"--chown=(\d+):(\d+)", copies[0]).groups())
    for name, cluster in CLUSTER_SPECS:
        for group_name, group in groups(cluster):
            context = group["template"]["spec"].get("securityContext", {})
            assert (context.get("runAsUser"), context.get("runAsGroup"), context.get("fsGroup")) == (uid, gid, gid), \
                f"{name} {group_name}: {context}"


@pytest.mark.parametrize("item", OTHER_DOCS, ids=doc_id)
def test_other_documents_are_well_formed(item):
    _, doc = item
    kind, name = doc.get("kind"), doc.get("metadata", {}).get("name", "")
    assert kind in CORE_API and doc.get("apiVersion") == CORE_API[kind], f"{doc_id(item)}: apiVersion/kind"
    assert DNS_1123_LABEL.fullmatch(name) and len(name) <= 63, f"{doc_id(item)}: metadata.name {name!r}"
    spec = doc.get("spec", {})
    if kind == "ConfigMap":
        assert doc["data"] and all(isinstance(v, str) for v in doc["data"].values())
    elif kind == "Service":
        assert spec["selector"] and spec["ports"]
        for port in spec["ports"]:
            assert isinstance(port["port"], int) and isinstance(port.get("targetPort", port["port"]), (int, str)), port
    elif kind == "PersistentVolumeClaim":
        # the outputs are written by pods on several nodes: the volume must be mountable by all
        assert "ReadWriteMany" in spec["accessModes"] and spec["resources"]["requests"]["storage"]
    elif kind == "Secret":
        assert doc.get("data") or doc.get("stringData")


# --- entrypoints, configs and placement, checked with packfeed's own code ---------------------


@pytest.mark.parametrize("item", JOBS, ids=doc_id)
def test_entrypoints_are_commands_the_packfeed_cli_accepts(item):
    args = parse_entrypoint(item[1]["spec"]["entrypoint"])
    assert args.config is not None and args.config.is_absolute()


@pytest.mark.parametrize("entrypoint, expected", [
    ("packfeed train --confg /etc/packfeed/config/train.toml", "unrecognized arguments"),
    ("packfeed serve --config /c.toml --port fifty", "invalid int value"),
    ("packfeed tran --config /c.toml", "invalid choice"),
    ("python -m packfeed train --config /c.toml", "does not run packfeed"),
])
def test_the_entrypoint_check_rejects_what_packfeed_would(entrypoint, expected):
    with pytest.raises(AssertionError, match=expected):
        parse_entrypoint(entrypoint)


@pytest.mark.parametrize("item", JOBS, ids=doc_id)
def test_job_configs_load_and_place_with_packfeeds_own_checks(item, tmp_path):
    job = item[1]
    args = parse_entrypoint(job["spec"]["entrypoint"])
    base = load_text(config_text(job, args), args, tmp_path)
    selectors = check_with_packfeed(args, base, cluster_of(job))
    # packfeed's role defaults place everything, from the labels of the groups alone
    assert selectors["packer"] == placement.PACKER_DEFAULT
    if args.command == "train":  # train's feeder is its one driver-side actor
        assert selectors["trainer"] == placement.TRAINER_DEFAULT and selectors["driver"] == placement.DRIVER_DEFAULT


@pytest.mark.parametrize("old, new, expected", [
    pytest.param("packing_workers = 6", "packing_worker = 6", "unknown [scaling] keys", id="scaling-key-typo"),
    pytest.param("epochs = 2", "epoch = 2", "unknown data config keys", id="data-key-typo"),
    pytest.param("max_steps = 30", "max_step = 30", "unknown [train] keys", id="train-key-typo"),
    pytest.param("num_workers = 2", "num_workers = 3", "train workers: 3 x", id="more-workers-than-gpus"),
    pytest.param("packing_workers = 6", "packing_workers = 9", "packing actors: 9 x", id="pool-too-big-at-start"),
    pytest.param("packing_max_workers = 30", "packing_max_workers = 40", "packing_max_workers: 40 x",
                 id="pool-too-big-at-max"),
])
def test_packfeeds_checks_reject_a_broken_config(old, new, expected, tmp_path):
    job = find("RayJob", "packfeed-train")
    args = parse_entrypoint(job["spec"]["entrypoint"])
    text = config_text(job, args)
    assert old in text
    base = load_text(text.replace(old, new, 1), args, tmp_path)
    with pytest.raises(ValueError, match=re.escape(expected)):
        check_with_packfeed(args, base, cluster_of(job))


# --- the clusters: roles, metrics, images --------------------------------------------------------


@pytest.mark.parametrize("cluster", CLUSTERS)
def test_groups_carry_the_packfeed_role_of_what_they_run(cluster):
    roles = {}
    for name, group in groups(cluster):
        role = group.get("labels", {}).get(placement.ROLE_LABEL)
        if name == "head":
            # no role: the driver-side actors may run there; Ray CPU 0: no packing actor does
            assert role is None and ray_resources(group)["CPU"] == 0, "head"
            continue
        assert role in ("packer", "trainer"), f"group {name}: {placement.ROLE_LABEL}={role}"
        assert (role == "trainer") == (gpus(group) > 0), f"group {name}: GPUs only, and always, on trainer pods"
        roles[role] = group
    packer = roles["packer"]
    # autoscaler v2 is what scales a group for actors that ask for its labels
    assert cluster["enableInTreeAutoscaling"] and cluster["autoscalerOptions"]["version"] == "v2"
    assert 1 <= packer["minReplicas"] < packer["maxReplicas"]


@pytest.mark.parametrize("cluster", CLUSTERS)
def test_every_ray_node_exports_metrics_on_a_named_port(cluster):
    for name, group in groups(cluster):
        port = group.get("rayStartParams", {}).get("metrics-export-port")
        assert port is not None, f"group {name}: no metrics-export-port"
        ports = {p.get("name"): p["containerPort"] for p in ray_container(group).get("ports", [])}
        assert ports.get("metrics") == int(port), f"group {name}: container port `metrics` != {port}"


@pytest.mark.parametrize("cluster", CLUSTERS)
def test_pods_run_the_packfeed_image_of_the_pinned_ray(cluster):
    assert cluster["rayVersion"] == constraint_pins(REPO / "constraints.txt")["ray"]
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    for name, group in groups(cluster):
        repository, _, tag = ray_container(group)["image"].rpartition(":")
        assert repository.endswith("/packfeed"), f"group {name}: {repository}"
        # deploy/docker builds VARIANT=cpu and VARIANT=gpu (CUDA torch) images
        assert tag == f"{version}-{'gpu' if gpus(group) else 'cpu'}", f"group {name}: tag {tag}"


def test_all_pods_pull_from_one_image_repository():
    images = {ray_container(g)["image"].rpartition(":")[0] for _, c in CLUSTER_SPECS for _, g in groups(c)}
    assert len(images) == 1, images


def test_serve_takes_token_and_tls_from_secrets_and_a_service_reaches_its_head():
    [job] = [doc for _, doc in JOBS if job_command(doc) == "serve"]
    args = parse_entrypoint(job["spec"]["entrypoint"])
    cluster = cluster_of(job)
    head = cluster["headGroupSpec"]
    assert args.host == "0.0.0.0" and args.metrics_port is not None
    secret_of = {}
    for flag, path in (("--auth-token-file", args.auth_token_file), ("--tls-cert", args.tls_cert),
                       ("--tls-key", args.tls_key)):
        found = path and volume_at(head, path)
        assert found and "secret" in found[0], f"{flag} {path}: not a file of a Secret volume on the head"
        source = found[0]["secret"]
        secret_of[flag] = (source["secretName"], volume_file_key(source, found[2]))
        assert source.get("defaultMode", 0o644) & 0o007 == 0, f"{flag}: the Secret's files are world-readable"
    token_secret, token_key = secret_of["--auth-token-file"]
    assert token_key is not None
    # one kubernetes.io/tls Secret holds both, under its standard keys; the token is elsewhere
    assert secret_of["--tls-cert"][1] == "tls.crt" and secret_of["--tls-key"][1] == "tls.key"
    assert secret_of["--tls-cert"][0] == secret_of["--tls-key"][0] != token_secret
    assert head["template"]["spec"].get("securityContext", {}).get("fsGroup") is not None  # group-readable for ray
    # exactly one Service selects the serve head, and no other pod of any cluster
    head_labels = pod_labels("head", head).items()
    services = [d for _, d in MANIFESTS if d["kind"] == "Service" and d["spec"]["selector"].items() <= head_labels]
    assert len(services) == 1, services
    selector = services[0]["spec"]["selector"].items()
    others = [(n, g) for _, c in CLUSTER_SPECS for n, g in groups(c) if g is not head]
    assert not [n for n, g in others if selector <= pod_labels(n, g).items()]
    container_ports = {p["name"]: p["containerPort"] for p in ray_container(head)["ports"] if "name" in p}
    exposed = set()
    for port in services[0]["spec"]["ports"]:
        target = port.get("targetPort", port["port"])
        exposed.add(container_ports[target] if isinstance(target, str) else target)
    assert {args.port, args.metrics_port} <= exposed
    # stopped (also by deleting the RayJob), the server drains before Ray's SIGKILL, in a pod
    # that Kubernetes does not kill before
    stop_wait = int(yaml.safe_load(job["spec"]["runtimeEnvYAML"])["env_vars"]["RAY_JOB_STOP_WAIT_TIME_S"])
    assert args.grace_seconds < stop_wait < head["template"]["spec"]["terminationGracePeriodSeconds"]


def test_a_stopped_train_job_has_the_time_to_checkpoint_before_any_kill():
    """`ray job stop` SIGTERMs `packfeed train`, which finishes its step and checkpoints it; Ray
    SIGKILLs the driver RAY_JOB_STOP_WAIT_TIME_S later (default 3 s: never enough), and the head
    pod must outlive that wait."""
    job = find("RayJob", "packfeed-train")
    head = cluster_of(job)["headGroupSpec"]
    stop_wait = int(yaml.safe_load(job["spec"]["runtimeEnvYAML"])["env_vars"]["RAY_JOB_STOP_WAIT_TIME_S"])
    assert 60 <= stop_wait < head["template"]["spec"]["terminationGracePeriodSeconds"]


# --- deploy/local: a job submitted by submit.sh ---------------------------------------------------


def test_a_submitted_jobs_relative_paths_are_the_submitters_not_rays_copy(tmp_path, monkeypatch):
    """Issue 24: a job of deploy/local/submit.sh runs in Ray's temporary copy of the working
    directory; its relative --config, inputs and tokenizer were read there and recorded in
    .packfeed/config.json as paths into that copy. They start where submit.sh ran (the
    PACKFEED_SUBMIT_DIR it passes), as a relative --output does."""
    user, copy_dir = tmp_path / "user", tmp_path / "ray_pkg"  # the copy holds the same relative paths
    for root, seq_len in ((user, 64), (copy_dir, 32)):
        (root / "data").mkdir(parents=True)
        (root / "data" / "a.jsonl").write_text('{"text": "a"}\n')
        (root / "tok").mkdir()
        (root / "job.toml").write_text(f'[data]\ninputs = ["data/*.jsonl"]\ntokenizer = "tok"\nseq_len = {seq_len}\n')
    monkeypatch.chdir(copy_dir)
    monkeypatch.setenv("PACKFEED_SUBMIT_DIR", str(user))

    def config(*argv: str):
        args = build_parser().parse_args(["pack", "--config", "job.toml", "--output", "out", *argv])
        return data_config_from_args(args, load_config_file(args.config))

    from_file, from_flag = config(), config("data/a.jsonl")
    assert from_file.seq_len == 64, "the submitter's job.toml, not the copy's"
    uris = ["s3://bucket/corpus/*.jsonl", "gs://bucket/a.jsonl", "s3://bucket/dir/"]  # issue 23: read as given
    assert [s.paths for s in config(*uris).sources] == [tuple(uris)]
    assert [s.paths for s in from_file.sources] == [(str(user / "data" / "*.jsonl"),)]
    assert [s.paths for s in from_flag.sources] == [(str(user / "data" / "a.jsonl"),)]
    assert from_file.tokenizer == from_flag.tokenizer == str(user / "tok")
    assert str(copy_dir) not in str(from_file.to_dict()) + str(from_flag.to_dict())

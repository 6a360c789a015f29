"""Reading deploy/ offline, for tests/unit/deploy/test_deploy.py (KubeRay) and test_deploy_image.py.

* ``crd_schemas(folder)``: KubeRay's CRD schemas, made strict the way ``kubectl apply`` is:
  since Kubernetes 1.27 kubectl asks the API server for strict field validation, so a field
  the schema does not know (a typo such as ``maxReplica``) is an error, not silently dropped.
  JSON Schema allows unknown fields unless told otherwise, so every object schema that lists
  its properties gets ``additionalProperties: false`` (unless it is marked
  ``x-kubernetes-preserve-unknown-fields``). The other ``x-kubernetes-*`` keywords (list
  types, CEL rules) are ignored; ``operator_rule_errors`` checks the rules that matter here.
* ``operator_rule_errors(doc)``: rules the KubeRay operator enforces when it reconciles a
  resource (ray-operator/controllers/ray/utils/validation.go, at the commit of the CRDs), which
  a schema cannot say: a RayJob that breaks them is accepted by kubectl, then fails.
* A cluster spec's groups, their Ray container, volumes and the Ray nodes they become
  (``ray_nodes``), in the shape ``packfeed.service.cluster.placement`` reads.
* ``Manifests``: a folder's documents, a RayJob's cluster and config file; ``parse_entrypoint``
  (packfeed's own parser) and ``load_text`` (packfeed's config loader).
* Data on a bucket: the storage credentials a pod's Ray container takes from a Secret
  (``credential_problems``), volumes that would hold data (``data_volumes``), the buckets URIs
  name (``uri_buckets``) and a flag's value as the entrypoint writes it (``flag_value``).
* The Dockerfile's instructions and what .dockerignore leaves out of the build context.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import re
import shlex
from pathlib import Path
from typing import Any, Iterator

import yaml

LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the CRD files are 2 MB of YAML
CRD_FILES = ("ray.io_rayclusters.yaml", "ray.io_rayjobs.yaml")
GPU_RESOURCE = "nvidia.com/gpu"
RAY_CONTAINER = 0  # KubeRay runs Ray in the first container of a pod template


def constraint_pins(path: Path) -> dict[str, str]:
    """name -> version of every ``name==version`` line of a constraints file."""
    lines = (line.split("#")[0].strip() for line in path.read_text().splitlines())
    return dict(tuple(part.strip() for part in line.split("==")) for line in lines if line)


def load_manifests(folder: Path) -> list[tuple[str, dict]]:
    """(file name, document) for every document of every folder/*.yaml, in file order."""
    out = []
    for path in sorted(folder.glob("*.yaml")):
        out.extend((path.name, doc) for doc in yaml.safe_load_all(path.read_text()) if doc is not None)
    return out


def crd_schemas(folder: Path) -> dict[tuple[str, str], dict]:
    """(apiVersion, kind) -> the strict openAPIV3Schema of every version of the CRDs in ``folder``."""
    schemas = {}
    for name in CRD_FILES:
        crd = yaml.load((folder / name).read_text(), Loader=LOADER)
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            schemas[(f"{group}/{version['name']}", kind)] = strict(version["schema"]["openAPIV3Schema"])
    return schemas


def strict(schema: dict) -> dict:
    """A copy of ``schema`` where objects with listed properties allow no others."""
    out = dict(schema)
    if "properties" in out:
        out["properties"] = {k: strict(v) for k, v in out["properties"].items()}
        if "additionalProperties" not in out and not out.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
    if isinstance(out.get("additionalProperties"), dict):
        out["additionalProperties"] = strict(out["additionalProperties"])
    if isinstance(out.get("items"), dict):
        out["items"] = strict(out["items"])
    for key in ("allOf", "anyOf", "oneOf"):
        if key in out:
            out[key] = [strict(s) for s in out[key]]
    return out


class Manifests:
    """The documents of a folder of manifests (``items``: (file name, document)), and what its
    RayJobs run: the cluster (``cluster_of``) and the config file (``config_text``)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.items = load_manifests(folder)
        self.ray_docs = [m for m in self.items if str(m[1].get("apiVersion", "")).startswith("ray.io/")]
        self.jobs = [m for m in self.items if m[1].get("kind") == "RayJob"]
        # (id, cluster spec) of every RayCluster and of every RayJob that brings its own cluster
        self.cluster_specs = [
            (doc_id((f, doc)), doc["spec"] if doc["kind"] == "RayCluster" else doc["spec"]["rayClusterSpec"])
            for f, doc in self.ray_docs if doc["kind"] == "RayCluster" or "rayClusterSpec" in doc["spec"]
        ]

    def find(self, kind: str, name: str) -> dict:
        found = [doc for _, doc in self.items if doc.get("kind") == kind and doc["metadata"]["name"] == name]
        assert len(found) == 1, f"{self.folder.name} holds {len(found)} {kind} named {name!r}, expected one"
        return found[0]

    def cluster_of(self, job: dict) -> dict:
        """The cluster spec a RayJob runs on: its own, or the RayCluster its clusterSelector names."""
        if "rayClusterSpec" in job["spec"]:
            return job["spec"]["rayClusterSpec"]
        return self.find("RayCluster", job["spec"]["clusterSelector"]["ray.io/cluster"])["spec"]

    def config_text(self, job: dict, args: argparse.Namespace) -> str:
        """The file ``--config`` names, from the ConfigMap mounted there on the head pod (a Ray
        job's entrypoint runs on the head)."""
        found = volume_at(self.cluster_of(job)["headGroupSpec"], args.config)
        assert found is not None, f"--config {args.config}: no volume is mounted there on the head pod"
        volume, _, inner = found
        assert "configMap" in volume, f"--config {args.config}: volume {volume['name']!r} is not a ConfigMap"
        key = volume_file_key(volume["configMap"], inner)
        data = self.find("ConfigMap", volume["configMap"]["name"]).get("data", {})
        assert key in data, f"--config {args.config}: ConfigMap {volume['configMap']['name']!r} has no key {key!r}"
        return data[key]


def doc_id(item: tuple[str, dict]) -> str:
    file, doc = item
    return f"{file}:{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"


def parse_entrypoint(entrypoint: str) -> argparse.Namespace:
    """``entrypoint`` parsed by packfeed's real parser; AssertionError with argparse's message
    when it refuses it."""
    from packfeed.service.cli import build_parser

    argv = shlex.split(entrypoint)
    assert argv[:1] == ["packfeed"], f"entrypoint {entrypoint!r} does not run packfeed"
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            return build_parser().parse_args(argv[1:])
    except SystemExit:
        raise AssertionError(f"packfeed refuses {entrypoint!r}: {stderr.getvalue().strip()}") from None


def load_text(text: str, args: argparse.Namespace, tmp_path: Path) -> dict:
    """A config file's text loaded by packfeed's loader, as ``--config`` would load it."""
    from packfeed.service.commands.args import load_config_file

    path = tmp_path / args.config.name  # the same suffix: load_config_file reads TOML or JSON by it
    path.write_text(text)
    return load_config_file(path)


# --- rules of the KubeRay operator (validation.go) ---------------------------------------------

DNS_1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
LABEL_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
DNS_1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
MAX_NAME = {"RayCluster": 53, "RayJob": 47}  # a RayJob's cluster is named <job>-<5 characters>
RESOURCE_PARAMS = ("num-cpus", "num-gpus", "memory", "resources")
TOKEN_AUTH_MIN_RAY = (2, 52, 0)


def operator_rule_errors(doc: dict) -> list[str]:
    kind, name, spec = doc["kind"], doc["metadata"]["name"], doc["spec"]
    errors = []
    if len(name) > MAX_NAME[kind] or not DNS_1035.fullmatch(name):
        errors.append(f"name {name!r}: must be a DNS-1035 label of at most {MAX_NAME[kind]} characters")
    cluster = spec if kind == "RayCluster" else spec.get("rayClusterSpec")
    if cluster is not None:
        errors += cluster_rule_errors(cluster)
    if kind == "RayJob":
        errors += job_rule_errors(spec)
    return errors


def cluster_rule_errors(cluster: dict) -> list[str]:
    errors = []
    autoscaling = cluster.get("enableInTreeAutoscaling", False)
    for name, group in groups(cluster):
        params = group.get("rayStartParams", {})
        if "labels" in params:
            errors.append(f"{name}: rayStartParams['labels'] is refused; use the group's top-level `labels`")
        if group.get("resources") and any(p in params for p in RESOURCE_PARAMS):
            errors.append(f"{name}: resources set both in rayStartParams and in the group's `resources`")
        errors += [f"{name}: {e}" for e in label_errors(group.get("labels", {}))]
        low, high = group.get("minReplicas"), group.get("maxReplicas")
        if name != "head" and not autoscaling and (low is None or high is None):
            errors.append(f"{name}: minReplicas and maxReplicas are required without autoscaling")
        if low is not None and high is not None and low > high:
            errors.append(f"{name}: minReplicas {low} greater than maxReplicas {high}")
        restart = group["template"]["spec"].get("restartPolicy")
        v2 = cluster.get("autoscalerOptions", {}).get("version") == "v2"
        if autoscaling and v2 and restart not in (None, "Never"):
            errors.append(f"{name}: restartPolicy must be Never or unset with autoscaler v2")
    if cluster.get("authOptions", {}).get("mode") == "token":
        version = tuple(int(x) for x in re.findall(r"\d+", cluster.get("rayVersion", ""))[:3])
        if version < TOKEN_AUTH_MIN_RAY:
            errors.append(f"authOptions.mode token needs rayVersion 2.52.0 or later, got {cluster.get('rayVersion')!r}")
    return errors


def job_rule_errors(spec: dict) -> list[str]:
    errors = []
    selector = spec.get("clusterSelector", {})
    if "rayClusterSpec" not in spec and not selector.get("ray.io/cluster"):
        errors.append("a RayJob needs rayClusterSpec or clusterSelector with ray.io/cluster")
    shutdown = spec.get("shutdownAfterJobFinishes", False)
    if not shutdown and spec.get("ttlSecondsAfterFinished", 0) > 0:
        errors.append("ttlSecondsAfterFinished needs shutdownAfterJobFinishes: true")
    if selector and spec.get("backoffLimit", 0) > 0:
        errors.append("backoffLimit is incompatible with clusterSelector")
    rules = spec.get("deletionStrategy", {}).get("deletionRules", [])
    if rules and shutdown:
        errors.append("shutdownAfterJobFinishes and deletionStrategy.deletionRules are mutually exclusive")
    autoscaling = spec.get("rayClusterSpec", {}).get("enableInTreeAutoscaling", False)
    seen = set()
    for i, rule in enumerate(rules):
        condition = rule["condition"]
        key = (condition.get("jobStatus"), condition.get("jobDeploymentStatus"), rule["policy"])
        if key in seen:
            errors.append(f"deletionRules[{i}]: a second rule for {key}")
        seen.add(key)
        if selector and rule["policy"] in ("DeleteCluster", "DeleteWorkers"):
            errors.append(f"deletionRules[{i}]: {rule['policy']} on a cluster the job does not own (clusterSelector)")
        if autoscaling and rule["policy"] == "DeleteWorkers":
            errors.append(f"deletionRules[{i}]: DeleteWorkers is not supported with autoscaling")
    return errors


def label_errors(labels: dict) -> list[str]:
    errors = []
    for key, value in labels.items():
        prefix, _, name = key.rpartition("/")
        if (prefix and (len(prefix) > 253 or not DNS_1123_SUBDOMAIN.fullmatch(prefix))) or len(name) > 63 \
                or not LABEL_NAME.fullmatch(name):
            errors.append(f"label key {key!r} is not a Kubernetes qualified name")
        if not isinstance(value, str) or len(value) > 63 or (value and not LABEL_NAME.fullmatch(value)):
            errors.append(f"label {key}: value {value!r} is not a Kubernetes label value")
    return errors


# --- a cluster spec's groups and the Ray nodes they become -------------------------------------


def groups(cluster: dict) -> Iterator[tuple[str, dict]]:
    """("head", headGroupSpec), then (groupName, workerGroupSpec) for each worker group."""
    yield "head", cluster["headGroupSpec"]
    for group in cluster.get("workerGroupSpecs", []):
        yield group["groupName"], group


def ray_container(group: dict) -> dict:
    return group["template"]["spec"]["containers"][RAY_CONTAINER]


def gpus(group: dict) -> int:
    return int(ray_container(group).get("resources", {}).get("limits", {}).get(GPU_RESOURCE, 0))


def pod_labels(name: str, group: dict) -> dict[str, str]:
    """The Kubernetes labels of the group's pods that a Service can select: the template's, the
    group's `labels` (KubeRay copies them onto the pods) and KubeRay's node type."""
    labels = dict(group["template"].get("metadata", {}).get("labels", {}))
    labels.update(group.get("labels", {}))
    labels["ray.io/node-type"] = "head" if name == "head" else "worker"
    return labels


def ray_resources(group: dict) -> dict[str, float]:
    """The Ray resources KubeRay starts the group's nodes with: CPU (rounded up, as KubeRay does)
    and GPU from the Ray container's limits, else its requests; the group's `resources` win."""
    resources = ray_container(group).get("resources", {})
    amounts = resources.get("limits") or resources.get("requests") or {}
    out = {}
    if "cpu" in amounts:
        out["CPU"] = float(math.ceil(cpu_quantity(amounts["cpu"])))
    if GPU_RESOURCE in amounts:
        out["GPU"] = float(amounts[GPU_RESOURCE])
    for key, value in group.get("resources", {}).items():
        if key.lower() == "memory":
            continue
        out[{"cpu": "CPU", "gpu": "GPU"}.get(key.lower(), key)] = cpu_quantity(value)
    return out


def cpu_quantity(value: Any) -> float:
    text = str(value)
    return float(text[:-1]) / 1000 if text.endswith("m") else float(text)


def ray_nodes(cluster: dict, replicas: str) -> list[dict]:
    """The Ray nodes of ``cluster`` with ``replicas`` ("minReplicas" or "maxReplicas") pods per
    worker group, as ``packfeed.service.cluster.placement.node_resources()`` reports nodes."""
    nodes = []
    for name, group in groups(cluster):
        for i in range(1 if name == "head" else group[replicas]):
            nodes.append({"id": f"{name}-{i}", "address": "", "resources": ray_resources(group),
                          "labels": dict(group.get("labels", {}))})
    return nodes


def volume_at(group: dict, path: Path) -> tuple[dict, dict, str] | None:
    """(volume, volumeMount, path inside the volume) of the Ray container's mount that holds
    ``path``, the deepest one; None when no volume is mounted there."""
    holding = [m for m in ray_container(group).get("volumeMounts", [])
               if Path(m["mountPath"]) == path or Path(m["mountPath"]) in path.parents]
    best = max(holding, key=lambda m: len(Path(m["mountPath"]).parts), default=None)
    if best is None:
        return None
    volumes = {v["name"]: v for v in group["template"]["spec"].get("volumes", [])}
    return volumes[best["name"]], best, str(path.relative_to(best["mountPath"]))


def volume_file_key(source: dict, inner: str) -> str | None:
    """The ConfigMap/Secret key that a file ``inner`` of a configMap/secret volume holds."""
    items = source.get("items")
    if not items:
        return inner
    return next((item["key"] for item in items if item["path"] == inner), None)


# --- data on a bucket: credentials from a Secret, no data volume --------------------------------

# Per URI scheme, the variables the Ray container of every pod needs, all from the storage
# Secret: an access key pair (and the endpoint of an S3-compatible store) as secretKeyRefs, or
# the path of a key file that a volume of that Secret holds.
CREDENTIAL_ENV = {
    "s3": ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL"),
    "gs": ("GOOGLE_APPLICATION_CREDENTIALS",),
}
OPTIONAL_KEYS = {"AWS_ENDPOINT_URL"}  # the Secret may lack it (AWS itself needs no endpoint); the others not
FILE_ENV = {"GOOGLE_APPLICATION_CREDENTIALS"}
VOLUME_SOURCES = ("configMap", "secret", "emptyDir")  # any other source (a PVC, NFS, hostPath) holds data
URI = re.compile(r"\b([a-z][a-z0-9+.-]*)://([A-Za-z0-9][A-Za-z0-9._-]*)")  # scheme://bucket


def flag_value(entrypoint: str, flag: str) -> str | None:
    """The value of ``flag`` as the entrypoint writes it (``--output s3://b/x``; argparse's Path
    type would make ``s3:/b/x`` of it), None when absent."""
    argv = shlex.split(entrypoint)
    for i, token in enumerate(argv):
        if token == flag and i + 1 < len(argv):
            return argv[i + 1]
        if token.startswith(flag + "="):
            return token.partition("=")[2]
    return None


def data_volumes(group: dict) -> list[str]:
    """The group's pod volumes that are not ConfigMaps, Secrets or emptyDirs, as ``name (source)``."""
    out = []
    for volume in group["template"]["spec"].get("volumes", []):
        sources = [key for key in volume if key != "name"]
        if not set(sources) <= set(VOLUME_SOURCES):
            out.append(f"{volume['name']} ({', '.join(sources)})")
    return out


def credential_problems(group: dict, scheme: str, secret: str) -> list[str]:
    """Why the group's Ray container lacks the credentials of ``scheme`` from Secret ``secret``:
    a variable missing, given as a literal value, from another Secret or key, optional where the
    pod must not start without it; a key file that no volume of that Secret holds."""
    env = {entry["name"]: entry for entry in ray_container(group).get("env", [])}
    problems = []
    for name in CREDENTIAL_ENV[scheme]:
        entry = env.get(name)
        if entry is None:
            problems.append(f"no {name}")
        elif name in FILE_ENV:
            found = volume_at(group, Path(entry.get("value") or "/"))
            if found is None or found[0].get("secret", {}).get("secretName") != secret:
                problems.append(f"{name}={entry.get('value')}: not a file of a volume of Secret {secret}")
        else:
            ref = entry.get("valueFrom", {}).get("secretKeyRef") or {}
            if "value" in entry or ref.get("name") != secret or ref.get("key") != name:
                problems.append(f"{name}: not from key {name} of Secret {secret}")
            elif bool(ref.get("optional")) != (name in OPTIONAL_KEYS):
                problems.append(f"{name}: optional must be {name in OPTIONAL_KEYS}")
    return problems


def uri_buckets(text: str) -> set[str]:
    """``scheme://bucket`` of every URI of a storage scheme (``CREDENTIAL_ENV``) in ``text``."""
    return {f"{scheme}://{bucket}" for scheme, bucket in URI.findall(text) if scheme in CREDENTIAL_ENV}


# --- the image ----------------------------------------------------------------------------------

GLOB = {"**/": "(.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}  # [abc] classes are kept as they are


def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out, current = [], ""
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("#") or (not current and not line.strip()):
            continue
        if line.rstrip().endswith("\\"):
            current += line.rstrip()[:-1] + " "
            continue
        instruction, _, rest = (current + line).strip().partition(" ")
        out.append((instruction.upper(), rest.strip()))
        current = ""
    return out


def dockerignored(path: str, dockerignore: str) -> bool:
    """Whether the .dockerignore text leaves ``path`` (relative, with /) out of the build
    context: Docker's rules as far as these patterns use them (*, **, [...], a directory
    excludes what it holds, ! re-includes, the last match wins)."""
    ignored = False
    parts = path.split("/")
    for raw in dockerignore.splitlines():
        pattern = raw.strip()
        if not pattern or pattern.startswith("#"):
            continue
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").strip("/")
        tokens = re.findall(r"\*\*/|\*\*|\*|\?|\[[^]]*\]|[^*?[]+", pattern)
        regex = "".join(GLOB.get(t, t if t.startswith("[") else re.escape(t)) for t in tokens)
        if any(re.fullmatch(regex, "/".join(parts[:i])) for i in range(1, len(parts) + 1)):
            ignored = not negate
    return ignored

"""The image of deploy/docker, checked offline (Docker is not needed): it builds on the official
Ray image of the Ray that constraints.txt pins and the Python the project is tested with,
installs packfeed under constraints.txt with the torch build its variant needs, runs the
`packfeed` command, and .dockerignore sends the build what it needs and nothing local.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet

from support.deploy import constraint_pins, dockerfile_instructions, dockerignored

REPO = Path(__file__).resolve().parents[3]
DOCKER = REPO / "deploy" / "docker"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
RAY = constraint_pins(REPO / "constraints.txt")["ray"]


def instructions() -> list[tuple[str, str]]:
    return dockerfile_instructions(DOCKER / "Dockerfile")


def ignored(path: str) -> bool:
    return dockerignored(path, (REPO / ".dockerignore").read_text())


def test_the_base_image_is_the_ray_and_python_the_project_pins():
    steps = instructions()
    first_from = [kind for kind, _ in steps].index("FROM")
    args = dict(rest.split("=", 1) for kind, rest in steps[:first_from] if kind == "ARG")
    # deploy/setup.sh built .venv with the Python that runs these tests: the image runs the same
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert args == {"RAY_VERSION": RAY, "PYTHON": f"py{python.replace('.', '')}", "VARIANT": "cpu"}
    assert SpecifierSet(PYPROJECT["project"]["requires-python"]).contains(python)
    base = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], steps[first_from][1])
    assert base == f"rayproject/ray:{RAY}-py{python.replace('.', '')}-cpu"


def test_the_repository_is_copied_where_the_kuberay_configs_look():
    steps = instructions()
    workdir = next(rest for kind, rest in steps if kind == "WORKDIR")
    copies = [shlex.split(rest) for kind, rest in steps if kind == "COPY"]
    # deploy/k8s/config.yaml names the bundled corpus under WORKDIR (test_deploy.py checks the paths)
    assert [[a for a in c if not a.startswith("--")] for c in copies] == [[".", workdir]]


def test_packfeed_is_installed_under_the_constraints_with_the_torch_of_the_variant():
    run = " ; ".join(rest for kind, rest in instructions() if kind == "RUN")
    argv = shlex.split(re.search(r"pip install ([^;&|]+)", run).group(1))
    assert argv[argv.index("-c") + 1] == "constraints.txt"
    extras = {e for a in argv if (m := re.fullmatch(r"\.\[([\w,-]+)\]", a)) for e in m.group(1).split(",")}
    assert "train" in extras and extras <= set(PYPROJECT["project"]["optional-dependencies"]), extras
    # torch's index comes from torch_build.py; the build is checked after the install
    assert 'torch_build.py index "$VARIANT"' in run and 'torch_build.py verify "$VARIANT" "$RAY_VERSION"' in run
    assert run.index("torch_build.py index") < run.index("pip install") < run.index("torch_build.py verify")


def test_the_image_runs_the_packfeed_console_script():
    command = json.loads(next(rest for kind, rest in reversed(instructions()) if kind in ("CMD", "ENTRYPOINT")))
    assert command[0] in PYPROJECT["project"]["scripts"]


def test_dockerignore_keeps_what_the_build_needs_and_drops_local_state():
    project = PYPROJECT["project"]
    needed = ["constraints.txt", "pyproject.toml", project["readme"], *project["license-files"],
              "deploy/docker/torch_build.py", "service/assets/tokenizer/tokenizer.json",
              *(f"{folder}/__init__.py" for folder in PYPROJECT["tool"]["setuptools"]["package-dir"].values())]
    assert [p for p in needed if ignored(p) or not (REPO / p).exists()] == []
    dropped = [".venv/bin/python", ".git/HEAD", "runs/train/metrics.jsonl", "service/__pycache__/cli.cpython-311.pyc",
               "stray.pyc"]
    assert [p for p in dropped if not ignored(p)] == []


def torch_build():
    spec = importlib.util.spec_from_file_location("torch_build", DOCKER / "torch_build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("variant, index", [
    ("cpu", "https://download.pytorch.org/whl/cpu"),
    ("gpu", ""),  # PyPI's Linux torch is the CUDA build
    ("cu128", "https://download.pytorch.org/whl/cu128"),
    ("cu126", "https://download.pytorch.org/whl/cu126"),
])
def test_torch_comes_from_the_index_of_the_variant(variant, index):
    assert torch_build().torch_index(variant) == index


def test_an_unknown_variant_is_refused():
    with pytest.raises(ValueError, match="cpu, gpu or cuXYZ"):
        torch_build().torch_index("cuda")


@pytest.mark.parametrize("variant, ray, torch, cuda, expected", [
    ("cpu", RAY, "2.13.0+cpu", None, None),
    ("gpu", RAY, "2.13.0", "12.8", None),
    ("cu128", RAY, "2.13.0+cu128", "12.8", None),
    ("gpu", RAY, "2.13.0+cpu", None, "is the CPU build in the gpu image"),
    ("cu128", RAY, "2.13.0+cpu", None, "is the CPU build in the cu128 image"),
    ("cpu", RAY, "2.13.0", "12.8", "is a CUDA build"),
    ("cu126", RAY, "2.13.0+cu128", "12.8", "built for CUDA 12.8, the image is cu126"),
    ("cpu", "2.0.0", "2.13.0+cpu", None, f"replaced the image's Ray {RAY}"),
])
def test_the_image_check_refuses_a_torch_or_ray_that_does_not_fit(variant, ray, torch, cuda, expected):
    found = torch_build().problems(variant, ray_wanted=RAY, ray_version=ray, torch_version=torch, torch_cuda=cuda)
    if expected is None:
        assert found == []
    else:
        assert any(expected in p for p in found), found

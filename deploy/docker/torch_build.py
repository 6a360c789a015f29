"""Which torch build the packfeed image gets, and the check that it got it (the Dockerfile runs
both; tests/unit/deploy/test_deploy_image.py tests them). Standard library only: it runs before the install.

    python deploy/docker/torch_build.py index VARIANT               # prints the extra index ('' = PyPI only)
    python deploy/docker/torch_build.py verify VARIANT RAY_VERSION  # after the install; exit 1 saying why

constraints.txt pins torch==2.13.0, a version and not a build: PEP 440 lets `==2.13.0` match the
local versions 2.13.0+cpu and 2.13.0+cu128 too, and pip takes the highest match over the indexes
it reads, so the build follows the index. PyPI's torch for Linux x86_64 is the CUDA build, so:

    cpu     PyTorch's CPU index: 2.13.0+cpu, without GBs of CUDA libraries no CPU node uses
    gpu     PyPI only: the default CUDA build
    cu128   PyTorch's index of that CUDA version: 2.13.0+cu128

A CUDA variant never reads the CPU index: its torch would be the CPU build, and every train
worker would fail to find a GPU.
"""

from __future__ import annotations

import re
import sys

PYTORCH_INDEX = "https://download.pytorch.org/whl"
CUDA_VARIANT = re.compile(r"cu\d{3}")


def torch_index(variant: str) -> str:
    """The extra index torch is installed from for ``variant`` ('' for PyPI alone)."""
    if variant == "cpu":
        return f"{PYTORCH_INDEX}/cpu"
    if variant == "gpu":
        return ""
    if CUDA_VARIANT.fullmatch(variant):
        return f"{PYTORCH_INDEX}/{variant}"
    raise ValueError(f"VARIANT must be cpu, gpu or cuXYZ (e.g. cu128), got {variant!r}")


def problems(variant: str, *, ray_wanted: str, ray_version: str, torch_version: str,
             torch_cuda: str | None) -> list[str]:
    """What is wrong with an image of ``variant`` holding these versions (empty: nothing).
    ``torch_cuda`` is ``torch.version.cuda``: None for the CPU build, e.g. "12.8" otherwise."""
    out = []
    if ray_version != ray_wanted:
        out.append(f"ray {ray_version} replaced the image's Ray {ray_wanted}: constraints.txt and RAY_VERSION differ")
    if variant == "cpu" and torch_cuda is not None:
        out.append(f"torch {torch_version} is a CUDA build (CUDA {torch_cuda}) in the cpu image")
    if variant != "cpu" and torch_cuda is None:
        out.append(f"torch {torch_version} is the CPU build in the {variant} image: no train worker would find a GPU")
    if CUDA_VARIANT.fullmatch(variant) and torch_cuda is not None and torch_cuda.replace(".", "") != variant[2:]:
        out.append(f"torch {torch_version} is built for CUDA {torch_cuda}, the image is {variant}")
    return out


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "index":
        print(torch_index(argv[1]))
        return 0
    if len(argv) == 3 and argv[0] == "verify":
        import ray
        import torch

        found = problems(argv[1], ray_wanted=argv[2], ray_version=ray.__version__, torch_version=torch.__version__,
                         torch_cuda=torch.version.cuda)
        for line in found:
            print(f"image check: {line}", file=sys.stderr)
        return 1 if found else 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

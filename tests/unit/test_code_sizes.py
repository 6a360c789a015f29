"""``service/pipeline/`` (with what it held before it was split: ``service/cluster/``,
``service/packjob/``) and ``trainer/`` stay in pieces a reader takes in at once: no function
(or method) over ``MAX_FUNCTION_LINES`` lines, no module over ``MAX_MODULE_LINES``. A function's
lines are ``end_lineno - lineno + 1`` of its ``def`` (docstring included, decorators not); a
nested function counts inside its parent and on its own."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import packfeed.service.cluster
import packfeed.service.packjob
import packfeed.service.pipeline
import packfeed.trainer

MAX_FUNCTION_LINES = 60
MAX_MODULE_LINES = 450
# (the tree, a module it must hold, at least how many functions: the walk is not vacuous)
TREES = {
    "service/pipeline": (Path(packfeed.service.pipeline.__file__).resolve().parent, "ray_pipeline.py", 40),
    "service/cluster": (Path(packfeed.service.cluster.__file__).resolve().parent, "raycluster.py", 40),
    "service/packjob": (Path(packfeed.service.packjob.__file__).resolve().parent, "pack_run.py", 30),
    "trainer": (Path(packfeed.trainer.__file__).resolve().parent, "launch/torchrun.py", 150),
}


def modules(tree: str) -> list[Path]:
    root, known, _ = TREES[tree]
    found = sorted(root.rglob("*.py"))
    assert len(found) >= 4 and root / known in found, found  # not vacuous
    return found


@pytest.mark.parametrize("tree", sorted(TREES))
def test_no_function_is_over_60_lines(tree):
    lengths = {}
    for path in modules(tree):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lengths[f"{path.name}:{node.lineno} {node.name}"] = node.end_lineno - node.lineno + 1
    assert len(lengths) > TREES[tree][2], "the walk found the tree's functions"
    too_long = {name: n for name, n in lengths.items() if n > MAX_FUNCTION_LINES}
    assert not too_long, f"functions over {MAX_FUNCTION_LINES} lines in {tree}/: {too_long}"


@pytest.mark.parametrize("tree", sorted(TREES))
def test_no_module_is_over_450_lines(tree):
    sizes = {path.name: len(path.read_text().splitlines()) for path in modules(tree)}
    too_long = {name: n for name, n in sizes.items() if n > MAX_MODULE_LINES}
    assert not too_long, f"modules over {MAX_MODULE_LINES} lines in {tree}/: {too_long}"

"""``service/pipeline/`` stays in pieces a reader takes in at once: no function (or method) over
``MAX_FUNCTION_LINES`` lines, no module over ``MAX_MODULE_LINES``. A function's lines are
``end_lineno - lineno + 1`` of its ``def`` (docstring included, decorators not); a nested
function counts inside its parent and on its own. The pack driver's ``_pack`` was 136 lines
with ~15 running counters before they became ``PackReport`` (pack_report.py)."""

from __future__ import annotations

import ast
from pathlib import Path

import packfeed.service.pipeline

MAX_FUNCTION_LINES = 60
MAX_MODULE_LINES = 450
PIPELINE = Path(packfeed.service.pipeline.__file__).resolve().parent


def modules() -> list[Path]:
    found = sorted(PIPELINE.glob("*.py"))
    assert len(found) >= 10 and any(p.name == "pack_run.py" for p in found), found  # not vacuous
    return found


def test_no_function_in_the_pipeline_is_over_60_lines():
    lengths = {}
    for path in modules():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lengths[f"{path.name}:{node.lineno} {node.name}"] = node.end_lineno - node.lineno + 1
    assert len(lengths) > 100, "the walk found the pipeline's functions"
    too_long = {name: n for name, n in lengths.items() if n > MAX_FUNCTION_LINES}
    assert not too_long, f"functions over {MAX_FUNCTION_LINES} lines: {too_long}"


def test_no_module_in_the_pipeline_is_over_450_lines():
    sizes = {path.name: len(path.read_text().splitlines()) for path in modules()}
    too_long = {name: n for name, n in sizes.items() if n > MAX_MODULE_LINES}
    assert not too_long, f"modules over {MAX_MODULE_LINES} lines: {too_long}"

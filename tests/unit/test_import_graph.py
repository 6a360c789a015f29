"""packfeed's own import graph (built from the source: tests/support/import_graph.py, which says
what counts as an edge): no circle, imports flow one way.

Asserted: no circle among modules (every strongly connected component is reported with its
edges); the layering of STYLE.md rule 3: ``client`` imports nothing of ``service`` or
``trainer``, ``service`` nothing of ``trainer``, and ``trainer`` of ``service`` only its face
(``packfeed.service.face``, whose ``__all__`` holds every name the trainer takes from it). An
import inside a function hides an edge and its cost: one of ours must load a heavy library
(``heavy_modules``), a third-party one must be heavy or optional, or the pair is in an allow-list
below with its reason.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.import_graph import (
    ImportGraph,
    build_graph,
    describe_circles,
    face_names,
    heavy_modules,
    layering_violations,
    names_imported_from,
    package_roots,
    shortest_circle,
    stale_known_edges,
    strongly_connected,
    third_party_inside_functions,
    trainer_service_edges,
)

REPO = Path(__file__).resolve().parents[2]

# An import inside a function is for a library that is heavy to import. Measured with
# `python -X importtime -c "import X"` (cumulative, this venv, CPU): torch 3.3 s, accelerate
# 1.8 s, ray 0.41 s (ray.train 1.8 s, ray.data 1.3 s), datasets 1.2 s, transformers 1.1 s,
# matplotlib.pyplot 0.67 s, trl 0.28 s; safetensors.torch and peft load torch (and peft transformers). Not heavy: pyarrow 0.18 s
# (pyarrow.compute 0.24 s), numpy 0.15 s, fsspec 0.12 s, grpc_health 0.08 s, grpc 0.07 s, tqdm
# 0.05 s, psutil 0.02 s, tokenizers 0.01 s, quicktok 0.003 s.
HEAVY_THIRD_PARTY = frozenset({
    "torch", "accelerate", "ray", "datasets", "transformers", "matplotlib", "trl", "safetensors", "peft",
})
# ... or for one that may be missing: no extra requires it (fsspec: the protocols pyarrow lacks),
# or its absence is a message, not an ImportError (quicktok: the fast back-end refused, fast/backend.py;
# the trackers of the `track` extra: a run naming a missing one is refused, trainer/loop/trackers.py).
OPTIONAL_THIRD_PARTY = frozenset({"fsspec", "quicktok", "tensorboard", "mlflow", "wandb"})

# Known circles, one edge each that closes it (source, target). To be removed: each entry goes
# when the move proposed for it is made; a new circle, or an entry no longer in a circle, fails.
KNOWN_CIRCLE_EDGES: frozenset[tuple[str, str]] = frozenset()  # circles not yet removed (none): (importer, imported)

LAYERS = {  # package -> the packfeed packages it must not import
    "packfeed.client": ("packfeed.service", "packfeed.trainer"),
    "packfeed.service": ("packfeed.trainer",),
}
FACE = "packfeed.service.face"  # the one service module the trainer imports (service/face.py says why a module)
FACE_NAMES = 56  # what the trainer takes from the face (test_the_face_does_not_grow)

# Imports of ours inside a function whose target loads no heavy library, each with its reason:
# (importer, imported). A circle it breaks is one (though moving names until there is none is better).
LIGHT_IMPORTS_INSIDE_FUNCTIONS: dict[tuple[str, str], str] = {
    # `packfeed` imports every subcommand module to build its parser (service/cli.py): what a
    # subcommand runs is imported when it runs. Measured after the rest of `packfeed --help`
    # (bytecode cached, the least of 6 runs on 2 busy cores):
    ("packfeed.service.commands.pack", "packfeed.service.packjob.pack_run"): "pack's pipeline, 13 ms",
    ("packfeed.service.commands.serve", "packfeed.service.delivery.serve_run"): "serve's server, 16 ms with server",
    ("packfeed.service.commands.serve", "packfeed.service.delivery.server"): "serve's server, 16 ms with serve_run",
    # a packing actor's import of the window code is a start-up phase of its own, timed
    # (actor_packfeed_imports_s, pipeline/startup.py)
    ("packfeed.service.pipeline.ray_pipeline", "packfeed.service.pipeline.window"): "an actor's timed import phase",
}


# Light third-party libraries imported inside a function, each with its reason: (importer, module
# as written). Measured as the time it adds to `packfeed --help` (which imports the trainer; the
# least of 6 runs).
LIGHT_THIRD_PARTY_INSIDE_FUNCTIONS: dict[tuple[str, str], str] = {
    ("packfeed.service.progress", "tqdm"): "the bar on a TTY only; 5 ms on every start",
    ("packfeed.service.tokenize.shipped", "tokenizers"): "an actor's first use only; 4 ms on every start",
    ("packfeed.trainer.hf", "pyarrow.compute"): "a Ray dataset's rows only; 40 ms on every start",
    ("packfeed.trainer.model.memory_plan", "psutil"): "a CPU run's memory only; 6 ms on every start",
    ("packfeed.service.cluster.raycluster", "psutil"): "the processes below Ray, at its shutdown; 6 ms on every start",
}



@pytest.fixture(scope="module")
def graph() -> ImportGraph:
    return build_graph(package_roots(REPO / "pyproject.toml"), base=REPO)


def test_the_graph_is_not_vacuous(graph):
    assert len(graph.modules) > 100, sorted(graph.modules)
    assert len(graph.edges) > 300, len(graph.edges)
    assert {"packfeed.client", "packfeed.service", "packfeed.trainer"} <= graph.packages
    assert any(edge.function for edge in graph.edges)  # imports inside functions are seen
    assert any(edge.path.startswith("trainer/") and edge.target.startswith("packfeed.service") for edge in graph.edges)


def test_no_import_circle(graph):
    adjacency = graph.adjacency(skip=KNOWN_CIRCLE_EDGES)
    components = strongly_connected(adjacency)
    assert not components, "import circles (move names so each dependency goes one way):\n" + describe_circles(
        graph, components, adjacency)


def test_each_known_circle_edge_still_closes_a_circle(graph):
    """An entry of KNOWN_CIRCLE_EDGES whose circle is gone must leave the list."""
    stale = stale_known_edges(graph.adjacency(), KNOWN_CIRCLE_EDGES)
    assert not stale, "no longer in a circle: remove from KNOWN_CIRCLE_EDGES:\n" + "\n".join(stale)


def test_imports_flow_one_way(graph):
    wrong = layering_violations(graph.edges, LAYERS)
    assert not wrong, "client imports nothing of service/trainer; service nothing of trainer:\n" + "\n".join(
        map(str, wrong))


def test_each_module_name_says_one_thing(graph):
    """A module's file name is unique across the packages (``__init__`` aside): a reader who
    meets ``pairs.py`` or ``config.py`` in a traceback or a grep knows which one it is."""
    by_name: dict[str, list[str]] = {}
    for name, path in graph.modules.items():
        if path.name != "__init__.py":
            by_name.setdefault(path.name, []).append(name)
    shared = {file: sorted(names) for file, names in by_name.items() if len(names) > 1}
    assert not shared, f"module names used in more than one package: {shared}"
    assert len(by_name) > 100  # the modules were seen


def test_trainer_imports_of_the_service_go_through_its_face(graph):
    wrong = [edge for edge in trainer_service_edges(graph.edges) if edge.target != FACE]
    assert not wrong, f"the trainer imports the service through {FACE} only (add the name to its __all__):\n" + \
        "\n".join(map(str, wrong))
    assert any(edge.target == FACE for edge in trainer_service_edges(graph.edges))  # the face is seen


def test_the_face_lists_what_it_imports_and_what_the_trainer_takes(graph):
    """``__all__`` is exactly the names ``face.py`` binds, and holds every name a trainer module
    imports from it (read from the source: no import of the service)."""
    bound, exported = face_names(graph.modules[FACE])
    assert sorted(exported) == sorted(set(exported)), "a name twice in __all__"
    assert set(exported) == bound, f"bound, not in __all__: {sorted(bound - set(exported))}; " \
                                   f"in __all__, not bound: {sorted(set(exported) - bound)}"
    taken = names_imported_from(graph, FACE, "packfeed.trainer")
    assert taken, "no trainer module imports from the face"
    assert taken <= set(exported), f"imported from the face but not in its __all__: {sorted(taken - set(exported))}"
    assert set(exported) <= taken, f"in __all__, imported by no trainer module: {sorted(set(exported) - taken)}"


def test_the_face_does_not_grow(graph):
    """The face lists what a trainer needs and no more: service work (storage trees, the packed
    format, the N-rank feeder, placement) happens in the service, behind a few names. A trainer
    change that needs a new name either takes one of these or says here why the face grows."""
    _, exported = face_names(graph.modules[FACE])
    assert len(exported) <= FACE_NAMES, f"the face grew to {len(exported)} names (pinned at {FACE_NAMES})"


def test_packfeed_imports_inside_functions_load_a_heavy_library(graph):
    """An import of ours inside a function defers a module that loads a heavy library (directly
    or through its own imports); any other goes to the top of its module, or in an allow-list."""
    heavy = heavy_modules(graph, HEAVY_THIRD_PARTY)
    inside = [edge for edge in graph.edges if edge.function and not edge.typing_only]
    assert inside and any(edge.target in heavy for edge in inside)  # the builder sees them
    allowed = set(LIGHT_IMPORTS_INSIDE_FUNCTIONS)
    light = [edge for edge in inside if edge.target not in heavy and (edge.source, edge.target) not in allowed]
    assert not light, "imports of light modules of ours inside functions: move them to the top:\n" + "\n".join(
        map(str, light))
    used = {(edge.source, edge.target) for edge in inside if edge.target not in heavy}
    stale = sorted(set(LIGHT_IMPORTS_INSIDE_FUNCTIONS) - used)
    assert not stale, f"no longer a light import inside a function: remove from LIGHT_IMPORTS_INSIDE_FUNCTIONS: {stale}"


def test_third_party_imports_inside_functions_are_heavy_or_optional(graph):
    """A third-party import inside a function defers a heavy library or one that may be missing;
    any other goes to the top of its module, or in an allow-list with its reason."""
    assert any(imp.function and imp.top == "torch" for imp in graph.third_party)  # the builder sees them
    inside = third_party_inside_functions(graph, HEAVY_THIRD_PARTY | OPTIONAL_THIRD_PARTY)
    allowed = set(LIGHT_THIRD_PARTY_INSIDE_FUNCTIONS)
    light = [imp for imp in inside if (imp.source, imp.module) not in allowed]
    assert not light, "light third-party imports inside functions: move them to the top:\n" + "\n".join(
        f"{imp.module}  ({imp.path}:{imp.line}, inside {imp.function}())" for imp in light)
    used = {(imp.source, imp.module) for imp in inside}
    stale = sorted(set(LIGHT_THIRD_PARTY_INSIDE_FUNCTIONS) - used)
    assert not stale, f"remove from LIGHT_THIRD_PARTY_INSIDE_FUNCTIONS: {stale}"


# The builder on a package whose graph is known.

SYNTHETIC = {
    "__init__.py": "from pkg.a import f\n",
    "a.py": "from pkg import b\n\ndef f():\n    from .c import g\n    return g\n",
    "b.py": "import pkg.sub.d\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.e import T\n",
    "c.py": "from . import b\nfrom .sub import d\n",
    "e.py": "import os\n\ndef h():\n    import torch\n    from pkg.a import f\n",
    "sub/__init__.py": "",
    "sub/d.py": "from ..a import f\nfrom .. import e\nfrom pkg.sub import nothing_of_a_module\n",
}


def _synthetic(tmp_path: Path) -> ImportGraph:
    root = tmp_path / "pkg"
    for name, text in SYNTHETIC.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return build_graph({"pkg": root}, base=tmp_path)


def test_builder_on_a_synthetic_package(tmp_path):
    graph = _synthetic(tmp_path)
    got = {(e.source, e.target, e.function, e.typing_only) for e in graph.edges}
    assert got == {
        ("pkg", "pkg.a", None, False),
        ("pkg.a", "pkg.b", None, False),
        ("pkg.a", "pkg.c", "f", False),  # relative, inside a function
        ("pkg.b", "pkg.sub.d", None, False),
        ("pkg.b", "pkg.e", None, True),
        ("pkg.c", "pkg.b", None, False),
        ("pkg.c", "pkg.sub.d", None, False),  # `from .sub import d`: d is a module
        ("pkg.e", "pkg.a", "h", False),
        ("pkg.sub.d", "pkg.a", None, False),  # `from ..a import f`: f is no module
        ("pkg.sub.d", "pkg.e", None, False),
        ("pkg.sub.d", "pkg.sub", None, False),  # `from pkg.sub import <not a module>`: the package
    }
    assert [(imp.source, imp.module, imp.function) for imp in graph.third_party] == [
        ("pkg.b", "typing", None), ("pkg.e", "os", None), ("pkg.e", "torch", "h")]
    assert heavy_modules(graph, HEAVY_THIRD_PARTY) == set()  # torch only inside h()


def test_face_names_on_a_synthetic_package(tmp_path):
    root = tmp_path / "pkg"
    (root / "sub").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "sub" / "__init__.py").write_text("")
    (root / "sub" / "x.py").write_text("A = 1\nB = 2\n")
    (root / "face.py").write_text('from __future__ import annotations\nfrom pkg.sub.x import A, B as C\n'
                                  '__all__ = ["A", "C"]\n')
    (root / "user.py").write_text("from pkg.face import A\n\ndef f():\n    from pkg.face import C\n")
    graph = build_graph({"pkg": root}, base=tmp_path)
    assert face_names(root / "face.py") == ({"A", "C"}, ["A", "C"])
    assert names_imported_from(graph, "pkg.face", "pkg") == {"A", "C"}
    assert names_imported_from(graph, "pkg.face", "pkg.sub") == set()


def test_builder_finds_the_circles_of_a_synthetic_package(tmp_path):
    graph = _synthetic(tmp_path)
    adjacency = graph.adjacency()
    # a -> b -> sub.d -> a, and e -> a (inside h) -> b -> sub.d -> e; not b -> e (TYPE_CHECKING only)
    assert strongly_connected(adjacency) == [["pkg.a", "pkg.b", "pkg.c", "pkg.e", "pkg.sub.d"]]
    assert shortest_circle(adjacency, "pkg.a") == ["pkg.a", "pkg.b", "pkg.sub.d", "pkg.a"]
    report = describe_circles(graph, strongly_connected(adjacency), adjacency)
    assert "pkg.e -> pkg.a  (pkg/e.py:5, inside h())" in report
    assert "pkg.b -> pkg.e" not in report
    skip = frozenset({("pkg.sub.d", "pkg.a"), ("pkg.e", "pkg.a")})
    assert strongly_connected(graph.adjacency(skip=skip)) == []
    assert stale_known_edges(graph.adjacency(), skip) == []
    assert stale_known_edges(graph.adjacency(), frozenset({("pkg.c", "pkg.b"), ("pkg", "pkg.a")})) == [
        "pkg -> pkg.a"]  # in no circle


def test_layering_on_a_synthetic_package(tmp_path):
    graph = _synthetic(tmp_path)
    wrong = layering_violations(graph.edges, {"pkg.sub": ("pkg.a", "pkg.e"), "pkg.b": ("pkg.e",)})
    assert sorted(map(str, wrong)) == [
        "pkg.b -> pkg.e  (pkg/b.py:4, TYPE_CHECKING)",  # a typing-only import counts for the layering
        "pkg.sub.d -> pkg.a  (pkg/sub/d.py:1)",
        "pkg.sub.d -> pkg.e  (pkg/sub/d.py:2)",
    ]

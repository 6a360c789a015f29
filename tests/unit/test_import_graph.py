"""packfeed's own import graph, built from the source with ``ast``: no circle, imports flow one way.

Every ``import``/``from ... import`` of a packfeed module counts, at module level and inside
functions, absolute and relative; ``from packfeed.x import name`` is an edge to ``packfeed.x.name``
when that is a module, else to ``packfeed.x``. An import under ``if TYPE_CHECKING:`` never runs:
it counts for the layering, not for circles.

Asserted: no circle among modules (every strongly connected component is reported with its
edges), and the layering of STYLE.md rule 3: ``client`` imports nothing of ``service`` or
``trainer``; ``service`` nothing of ``trainer``. Listed, not asserted yet: the packfeed modules
imported inside functions (each one either heavy, or a place to move the import to the top).
"""

from __future__ import annotations

import ast
import sys
from collections import Counter, deque
from dataclasses import dataclass
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest's own dependency
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]

# An import inside a function is for a library that is heavy to import. Measured with
# `python -X importtime -c "import X"` (cumulative, this venv, CPU): torch 3.3 s, accelerate
# 1.8 s, ray 0.41 s (ray.train 1.8 s, ray.data 1.3 s), datasets 1.2 s, transformers 1.1 s,
# matplotlib.pyplot 0.67 s, trl 0.28 s; safetensors.torch loads torch. Not heavy: pyarrow 0.18 s
# (pyarrow.compute 0.24 s), numpy 0.15 s, fsspec 0.12 s, grpc_health 0.08 s, grpc 0.07 s, tqdm
# 0.05 s, psutil 0.02 s, tokenizers 0.01 s, quicktok 0.003 s.
HEAVY_THIRD_PARTY = frozenset({
    "torch", "accelerate", "ray", "datasets", "transformers", "matplotlib", "trl", "safetensors",
})
# ... or for one that may be missing: no extra requires it (fsspec: the protocols pyarrow lacks).
OPTIONAL_THIRD_PARTY = frozenset({"fsspec"})

# Known circles, one edge each that closes it (source, target). To be removed: each entry goes
# when the move proposed for it is made; a new circle, or an entry no longer in a circle, fails.
KNOWN_CIRCLE_EDGES: frozenset[tuple[str, str]] = frozenset()  # circles not yet removed (none): (importer, imported)

LAYERS = {  # package -> the packfeed packages it must not import
    "packfeed.client": ("packfeed.service", "packfeed.trainer"),
    "packfeed.service": ("packfeed.trainer",),
}


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    path: str  # relative to the repository root
    line: int
    function: str | None  # the enclosing function, for an import inside one
    typing_only: bool  # under ``if TYPE_CHECKING:``: never runs

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}"
        if self.function:
            where += f", inside {self.function}()"
        if self.typing_only:
            where += ", TYPE_CHECKING"
        return f"{self.source} -> {self.target}  ({where})"


@dataclass(frozen=True)
class ThirdPartyImport:
    module: str  # the dotted name as written
    source: str
    path: str
    line: int
    function: str | None

    @property
    def top(self) -> str:
        return self.module.split(".")[0]


@dataclass
class ImportGraph:
    modules: dict[str, Path]  # module name -> file
    packages: set[str]  # module names that are packages (an __init__.py)
    edges: list[Edge]
    third_party: list[ThirdPartyImport]

    def adjacency(self, *, skip: frozenset[tuple[str, str]] = frozenset()) -> dict[str, set[str]]:
        """Runtime edges (no TYPE_CHECKING ones), less those in ``skip``."""
        out: dict[str, set[str]] = {name: set() for name in self.modules}
        for edge in self.edges:
            if not edge.typing_only and edge.source != edge.target and (edge.source, edge.target) not in skip:
                out[edge.source].add(edge.target)
        return out


def package_roots(pyproject: Path) -> dict[str, Path]:
    """``{"packfeed.client": <repo>/client, ...}`` from ``[tool.setuptools] package-dir``."""
    config = tomllib.loads(pyproject.read_text())
    package_dir = config["tool"]["setuptools"]["package-dir"]
    return {name: (pyproject.parent / folder).resolve() for name, folder in package_dir.items()}


def build_graph(roots: dict[str, Path], *, base: Path) -> ImportGraph:
    """The import graph of the modules under ``roots`` (package name -> folder)."""
    modules: dict[str, Path] = {}
    packages: set[str] = set()
    for package, folder in roots.items():
        for file in sorted(folder.rglob("*.py")):
            parts = file.relative_to(folder).with_suffix("").parts
            if file.name == "__init__.py":
                parts = parts[:-1]
                packages.add(".".join((package, *parts)))
            modules[".".join((package, *parts))] = file
    namespaces = {name.split(".")[0] for name in roots}  # "packfeed": ours, whatever follows
    graph = ImportGraph(modules, packages, [], [])
    for name, file in modules.items():
        tree = ast.parse(file.read_text(), filename=str(file))
        _Visitor(graph, name, str(file.relative_to(base)), namespaces).visit(tree)
    return graph


class _Visitor(ast.NodeVisitor):
    def __init__(self, graph: ImportGraph, module: str, path: str, namespaces: set[str]):
        self.graph, self.module, self.path, self.namespaces = graph, module, path, namespaces
        self.functions: list[str] = []
        self.typing_only = False

    def _in_function(self, node: ast.AST) -> None:
        self.functions.append(getattr(node, "name", "<lambda>"))
        self.generic_visit(node)
        self.functions.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _in_function

    def visit_If(self, node: ast.If) -> None:
        test = node.test
        name = test.id if isinstance(test, ast.Name) else test.attr if isinstance(test, ast.Attribute) else None
        if name != "TYPE_CHECKING":
            self.generic_visit(node)
            return
        before, self.typing_only = self.typing_only, True
        for child in node.body:
            self.visit(child)
        self.typing_only = before
        for child in node.orelse:
            self.visit(child)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name, node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            package = self.module if self.module in self.graph.packages else self.module.rpartition(".")[0]
            for _ in range(node.level - 1):
                package = package.rpartition(".")[0]
            base = ".".join(part for part in (package, node.module) if part)
        else:
            base = node.module or ""
        targets = {}  # one edge per target a statement names: `from x import a, b` is one edge to x
        for alias in node.names:
            candidate = f"{base}.{alias.name}"
            targets[candidate if alias.name != "*" and candidate in self.graph.modules else base] = None
        for target in targets:
            self._add(target, node)

    def _add(self, name: str, node: ast.stmt) -> None:
        function = ".".join(self.functions) or None
        if name.split(".")[0] not in self.namespaces:
            if not self.typing_only:
                self.graph.third_party.append(ThirdPartyImport(name, self.module, self.path, node.lineno, function))
            return
        target = name
        while target and target not in self.graph.modules:  # `import packfeed.x.y` -> the module it names
            target = target.rpartition(".")[0]
        if not target:
            raise AssertionError(f"{self.path}:{node.lineno}: {name!r} is no module of ours")
        self.graph.edges.append(Edge(self.module, target, self.path, node.lineno, function, self.typing_only))


def strongly_connected(adjacency: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's components with more than one module, each sorted, in sorted order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(adjacency[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 4 * len(adjacency) + 100))
    try:
        for node in sorted(adjacency):
            if node not in index:
                visit(node)
    finally:
        sys.setrecursionlimit(limit)
    return sorted(found)


def shortest_circle(adjacency: dict[str, set[str]], start: str) -> list[str]:
    """The shortest path from ``start`` back to itself: ``[start, ..., start]``."""
    parents: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for nxt in sorted(adjacency[node]):
            if nxt == start:
                path = [node]  # back from node to start through the parents
                while path[-1] != start:
                    path.append(parents[path[-1]])
                return [*reversed(path), start]
            if nxt not in parents:
                parents[nxt] = node
                queue.append(nxt)
    return []


def describe_circles(graph: ImportGraph, components: list[list[str]], adjacency: dict[str, set[str]]) -> str:
    lines = []
    for component in components:
        members = set(component)
        circle = shortest_circle(adjacency, component[0])
        lines.append(f"circle of {len(component)} modules, e.g. {' -> '.join(circle)}; its edges:")
        lines += [f"    {edge}" for edge in graph.edges
                  if edge.source in members and edge.target in members and edge.target in adjacency[edge.source]]
    return "\n".join(lines)


def heavy_modules(graph: ImportGraph) -> set[str]:
    """Our modules whose import loads a heavy third-party library: directly at module level, or
    through a module-level import of ours (importing ``a.b.c`` runs ``a.b``'s ``__init__`` too)."""
    needs: dict[str, set[str]] = {name: set() for name in graph.modules}
    heavy = {imp.source for imp in graph.third_party if imp.function is None and imp.top in HEAVY_THIRD_PARTY}
    for edge in graph.edges:
        if edge.function is None and not edge.typing_only:
            needs[edge.source].add(edge.target)
    for name in graph.modules:
        parent = name.rpartition(".")[0]
        if parent in graph.modules:
            needs[name].add(parent)
    changed = True
    while changed:
        changed = False
        for name, targets in needs.items():
            if name not in heavy and targets & heavy:
                heavy.add(name)
                changed = True
    return heavy


def stale_known_edges(adjacency: dict[str, set[str]], known: frozenset[tuple[str, str]]) -> list[str]:
    """The entries of ``known`` that no longer close a circle: the edge is gone, or its two ends
    are no longer in one strongly connected component."""
    component_of = {module: i for i, component in enumerate(strongly_connected(adjacency)) for module in component}
    return [f"{source} -> {target}" for source, target in sorted(known)
            if target not in adjacency.get(source, ()) or component_of.get(source, -1) != component_of.get(target, -2)]


def layering_violations(edges: list[Edge], layers: dict[str, tuple[str, ...]]) -> list[Edge]:
    def within(name: str, package: str) -> bool:
        return name == package or name.startswith(package + ".")

    return [edge for edge in edges for package, forbidden in layers.items()
            if within(edge.source, package) and any(within(edge.target, f) for f in forbidden)]


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


def test_packfeed_imports_inside_functions_are_listed(graph, capsys):
    """Not asserted yet: printed with ``-s``. An import of ours inside a function either loads a
    heavy library (the reason it is there) or should move to the top of its module."""
    heavy = heavy_modules(graph)
    inside = [edge for edge in graph.edges if edge.function and not edge.typing_only]
    light = [edge for edge in inside if edge.target not in heavy]
    with capsys.disabled():
        print(f"\n{len(inside)} imports of packfeed modules inside functions, {len(light)} of light modules "
              "(could move to the top):")
        for source, count in Counter(edge.source for edge in inside).most_common():
            print(f"  {count:3d}  {source}")
        print("targets:")
        for target, count in Counter(edge.target for edge in inside).most_common():
            print(f"  {count:3d}  {target}{'' if target in heavy else '  (light)'}")
    assert inside  # the builder sees them (a guard, not the rule)


def test_third_party_imports_inside_functions_are_listed(graph, capsys):
    """Not asserted yet: printed with ``-s``. A third-party import inside a function that is
    neither heavy nor optional (nor the standard library) could move to the top."""
    light = [imp for imp in graph.third_party if imp.function and imp.top not in sys.stdlib_module_names
             and imp.top not in HEAVY_THIRD_PARTY | OPTIONAL_THIRD_PARTY]
    with capsys.disabled():
        print(f"\n{len(light)} imports of light third-party libraries inside functions (could move to the top):")
        for (top, source), count in sorted(Counter((imp.top, imp.source) for imp in light).items()):
            print(f"  {count:3d}  {top:12s} {source}")
    assert any(imp.function and imp.top == "torch" for imp in graph.third_party)  # the builder sees them


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
    assert heavy_modules(graph) == set()  # torch only inside h()


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

"""packfeed's own import graph, built from the source with ``ast`` (tests/unit/test_import_graph.py
states the rules it is held to).

Every ``import``/``from ... import`` of a packfeed module counts, at module level and inside
functions, absolute and relative; ``from packfeed.x import name`` is an edge to ``packfeed.x.name``
when that is a module, else to ``packfeed.x``. An import under ``if TYPE_CHECKING:`` never runs:
it counts for the layering, not for circles. Third-party imports are kept with where they are.
"""

from __future__ import annotations

import ast
import sys
from collections import deque
from dataclasses import dataclass
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest's own dependency
    import tomli as tomllib


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


def heavy_modules(graph: ImportGraph, libraries: frozenset[str]) -> set[str]:
    """Our modules whose import loads a heavy third-party library (one of ``libraries``, by top
    name): directly at module level, or through a module-level import of ours (importing
    ``a.b.c`` runs ``a.b``'s ``__init__`` too)."""
    needs: dict[str, set[str]] = {name: set() for name in graph.modules}
    heavy = {imp.source for imp in graph.third_party if imp.function is None and imp.top in libraries}
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


def trainer_service_edges(edges: list[Edge]) -> list[Edge]:
    """The trainer's imports of the service, its face included (TYPE_CHECKING ones count)."""
    def within(name: str, package: str) -> bool:
        return name == package or name.startswith(package + ".")

    return [edge for edge in edges
            if within(edge.source, "packfeed.trainer") and within(edge.target, "packfeed.service")]


def face_names(file: Path) -> tuple[set[str], list[str]]:
    """(the names ``file`` binds at module level by import, its ``__all__``)."""
    tree = ast.parse(file.read_text())
    bound: set[str] = set()
    exported: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module != "__future__":
            bound.update(alias.asname or alias.name for alias in node.names)
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            exported = [ast.literal_eval(element) for element in node.value.elts]
    return bound, exported


def names_imported_from(graph: ImportGraph, module: str, package: str) -> set[str]:
    """The names modules of ``package`` import with ``from <module> import ...``."""
    names: set[str] = set()
    for name, file in graph.modules.items():
        if name == package or name.startswith(package + "."):
            for node in ast.walk(ast.parse(file.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module == module and not node.level:
                    names.update(alias.name for alias in node.names)
    return names


def third_party_inside_functions(graph: ImportGraph, exempt: frozenset[str]) -> list[ThirdPartyImport]:
    """The third-party imports inside functions, less the standard library's and ``exempt``'s."""
    return [imp for imp in graph.third_party if imp.function and imp.top not in sys.stdlib_module_names
            and imp.top not in exempt]

"""elastune imports one way: between its packages, among the packages of planners/ and of
planners/cost/; no two modules import each other in a loop, and no module name means two
things (each is unique across the package)."""

from __future__ import annotations

import ast
import functools
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("flows", "tasks", "infra", "planners")
# Bottom first. Each layer imports only from layers below it (its own package aside).
TOP = {"planners": 0, "tasks": 1, "infra": 1, "flows": 2}
# cost and sim sit side by side and never import each other; execution, which resolves a
# job with the cost planner, is the top.
PLANNERS = {
    "samplers": 0,
    "spec": 1,
    "search": 2,
    "staging": 3,
    "sim": 4,
    "cost": 4,
    "execution": 5,
}
# The price model, the simulator, the planners, planning in flight, the reports; price_job,
# a job file in and a priced plan out, over them all.
COST = {"pricing": 0, "montecarlo": 1, "planning": 2, "inflight": 3, "reports": 4, "price_job": 5}


def modules() -> dict[str, Path]:
    """Every module by its import name."""
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            found[".".join(("elastune", *parts))] = path
    return found


def imported(path: Path) -> Iterator[str]:
    """The elastune modules a module imports, inside functions too."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        yield from (name for name in names if name.startswith("elastune."))


@functools.cache
def graph() -> dict[str, set[str]]:
    """Module -> the modules it imports (a name resolved to the module that defines it)."""
    known = modules()
    edges: dict[str, set[str]] = {}
    for name, path in known.items():
        targets = set()
        for target in imported(path):
            while target not in known and "." in target:
                target = target.rsplit(".", 1)[0]
            if target in known and target != name:
                targets.add(target)
        edges[name] = targets
    return edges


def upward(layers: dict[str, int], depth: int) -> list[str]:
    """Imports from a layer to another at or above it, layers named by part ``depth`` of the
    module names inside the layered package."""
    found = []
    for source, targets in graph().items():
        for target in targets:
            a, b = _layer(source, layers, depth), _layer(target, layers, depth)
            if a is not None and b is not None and a[0] != b[0] and b[1] >= a[1]:
                found.append(f"{source} imports {target}")
    return found


def _layer(module: str, layers: dict[str, int], depth: int) -> tuple[str, int] | None:
    """The layer (name, height) of ``module`` among ``layers``, read at part ``depth`` of
    its name, when the module lies inside the layered package."""
    parts = module.split(".")
    scope = {1: [], 2: ["planners"], 3: ["planners", "cost"]}[depth]
    if parts[1 : 1 + len(scope)] != scope or len(parts) <= depth:
        return None
    name = parts[depth]
    return (name, layers[name]) if name in layers else None


def test_every_module_lives_in_a_layer() -> None:
    planners = ROOT / "planners"
    assert [p.name for p in planners.glob("*.py") if p.name != "__init__.py"] == []
    assert {p.name for p in planners.iterdir() if (p / "__init__.py").exists()} == set(PLANNERS)
    cost = planners / "cost"
    inside = {p.name for p in cost.iterdir() if (p / "__init__.py").exists()}
    inside |= {p.stem for p in cost.glob("*.py") if p.name != "__init__.py"}
    assert inside == set(COST)


def test_packages_import_downward() -> None:
    assert upward(TOP, 1) == []


def test_the_packages_of_planners_import_downward() -> None:
    assert upward(PLANNERS, 2) == []


def test_the_packages_of_the_cost_planner_import_downward() -> None:
    assert upward(COST, 3) == []


def test_no_import_cycles() -> None:
    edges = graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in edges[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            # A package that imports its own submodules to hand their names on is no loop.
            face = min(component, key=len)
            if len(component) > 1 and not all(m.startswith(face) for m in component):
                cycles.append(sorted(component))

    for node in edges:
        if node not in index:
            visit(node)
    assert cycles == []


def test_each_module_name_means_one_thing() -> None:
    names = Counter(
        path.stem for path in modules().values() if path.name != "__init__.py"
    ) + Counter(path.parent.name for path in modules().values() if path.name == "__init__.py")
    assert [name for name, count in names.items() if count > 1] == []

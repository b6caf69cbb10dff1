"""The packages of planners/ import one way: each only from those below it."""

from __future__ import annotations

import ast
from pathlib import Path

PLANNERS = Path(__file__).resolve().parents[1] / "planners"
# Bottom first; cost and sim sit side by side and never import each other; execution, which
# compiles a job with the cost planner, is the top.
LAYERS = {"samplers": 0, "spec": 1, "search": 2, "staging": 3, "sim": 4, "cost": 4, "execution": 5}


def imported_packages(path: Path) -> set[str]:
    """The planners packages a module imports, counting imports inside functions too."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[:2] == ["elastune", "planners"] and len(parts) > 2:
                found.add(parts[2])
    return found


def test_every_module_lives_in_a_layer() -> None:
    loose = [p.name for p in PLANNERS.glob("*.py") if p.name != "__init__.py"]
    assert loose == []
    packages = {p.name for p in PLANNERS.iterdir() if (p / "__init__.py").exists()}
    assert packages == set(LAYERS)


def test_imports_point_down() -> None:
    upward = []
    for path in PLANNERS.rglob("*.py"):
        package = path.relative_to(PLANNERS).parts[0]
        if package == "__init__.py":
            continue
        for target in imported_packages(path) - {package}:
            if LAYERS[target] >= LAYERS[package]:
                upward.append(f"{path.relative_to(PLANNERS)} imports planners.{target}")
    assert upward == []

"""The package's layers (docs/architecture.md): read from the source, every import counted, local ones too.

ground (turnstream.core) <- protocol <- roles (actors, buffer, learner) <- roof (turnstream's own modules:
CLI, launcher, demo, reports). A module imports only from its own layer or below, a
role never imports another role, and no import cycle exists anywhere: neither between modules nor between the
parts of a role (its sub-packages and its top-level modules), so that each part can be read below the ones
that use it.
"""
from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PACKAGE_DIRS: dict[str, str] = PYPROJECT["tool"]["setuptools"]["package-dir"]
ROLES = ("turnstream.actors", "turnstream.buffer", "turnstream.learner")


def layer(module: str) -> tuple[int, str]:
    """(rank, name) of a module's layer; a module may import only ranks <= its own."""
    if module == "turnstream" or module.startswith("turnstream.core"):
        return 0, "ground"
    if module.startswith("turnstream.protocol"):
        return 1, "protocol"
    for role in ROLES:
        if module == role or module.startswith(role + "."):
            return 2, role
    return 3, "roof"


def module_files() -> dict[str, Path]:
    """Every module of the installed package, named as it imports, from the package-dir mapping."""
    found: dict[str, Path] = {}
    for package, folder in PACKAGE_DIRS.items():
        base = ROOT / folder
        nested = [ROOT / f for p, f in PACKAGE_DIRS.items() if p != package and (ROOT / f).is_relative_to(base)]
        for path in base.rglob("*.py"):
            if any(path.is_relative_to(n) for n in nested):
                continue
            parts = path.relative_to(base).with_suffix("").parts
            name = ".".join((package, *parts))
            found[name.removesuffix(".__init__")] = path
    return found


MODULES = module_files()


def imports_of(module: str, path: Path) -> set[str]:
    """Modules of the package that `module` imports anywhere in its file (function-local imports too)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]
        else:
            continue
        out.update(n for n in names if n in MODULES)
    out.discard(module)
    return out


GRAPH = {module: imports_of(module, path) for module, path in MODULES.items()}


def test_every_package_folder_is_installed():
    listed = set(PYPROJECT["tool"]["setuptools"]["packages"])
    packages = {m for m, p in MODULES.items() if p.name == "__init__.py"}
    assert packages == listed, "pyproject.toml's [tool.setuptools] packages must list every package folder"


def test_no_module_imports_a_higher_layer_or_another_role():
    wrong = []
    for module, targets in GRAPH.items():
        rank, name = layer(module)
        for target in sorted(targets):
            target_rank, target_name = layer(target)
            if target_rank > rank or (target_rank == rank == 2 and target_name != name):
                wrong.append(f"{module} ({name}) imports {target} ({target_name})")
    assert not wrong, "\n".join(wrong)


def test_the_package_root_holds_only_the_version():
    assert GRAPH["turnstream"] == set()


def cycles(graph: dict) -> list[list[str]]:
    """Depth-first search of `graph` (node -> the nodes it imports); each back edge is a cycle, node by node."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                found.append(path[path.index(target):] + [target])
            elif target not in state:
                visit(target)
        path.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return found


def test_no_import_cycles():
    found = cycles(GRAPH)
    assert not found, "\n".join(" -> ".join(loop) for loop in found)


def part_of_role(module: str) -> tuple[str, str] | None:
    """(role, part) for a module inside a role: the sub-package it lies in, or the top-level module it is."""
    for role in ROLES:
        if module.startswith(role + "."):
            first = module[len(role) + 1:].split(".")[0]
            return role, f"{role}.{first}"
    return None


def part_graph() -> dict[str, dict[str, tuple[str, str]]]:
    """part -> {part it imports: (one importing module, the module it imports)}, within each role."""
    parts: dict[str, dict[str, tuple[str, str]]] = {}
    for module, targets in GRAPH.items():
        mine = part_of_role(module)
        if mine is None:
            continue
        edges = parts.setdefault(mine[1], {})
        for target in sorted(targets):
            theirs = part_of_role(target)
            if theirs is not None and theirs[0] == mine[0] and theirs[1] != mine[1]:
                edges.setdefault(theirs[1], (module, target))
    return parts


def test_no_import_cycles_between_the_parts_of_a_role():
    """A cycle between two sub-packages (or a sub-package and a top-level module) of one role, each edge named
    by one import that makes it: the shared piece belongs below both."""
    parts = part_graph()
    found = cycles(parts)
    named = ["; ".join(f"{a} -> {b} ({' imports '.join(parts[a][b])})" for a, b in zip(loop, loop[1:]))
             for loop in found]
    assert not found, "\n".join(named)


def test_the_checker_sees_what_it_checks():
    # the graph must be read from the real tree: a role, its imports of protocol, and local imports
    assert "turnstream.buffer.store.replay_store" in GRAPH and "turnstream.actors.envs.registry" in GRAPH
    assert any(t.startswith("turnstream.protocol") for t in GRAPH["turnstream.buffer.server"])
    assert "turnstream.actors.envs" in GRAPH["turnstream.actors.envs.registry"]
    # the parts of a role: sub-packages and top-level modules, with the imports between them
    parts = part_graph()
    assert "turnstream.learner.step" in parts["turnstream.learner.main"]
    assert "turnstream.learner.parallel" in parts["turnstream.learner.step"]

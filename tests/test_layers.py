"""The package picture, enforced: imports run one way down the layers of docs/architecture.md,
no module imports itself back through others, and no two modules share a name."""

from __future__ import annotations

import ast
import collections
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "rollway"

#: Top to bottom. A module may import its own package and any package in a lower layer; never
#: one above, nor a sibling in its own layer. Root modules (``types``, ``errors``...) are ground.
LAYERS: list[set[str]] = [
    {"cli"},
    {"trainers", "viewer", "simulators"},
    {"client"},
    {"executors"},
    {"rollouts"},
    {"agents"},
    {"gateway"},
    {"engines"},
    {"store", "sandbox"},
    {"web"},
    {"(ground)"},
]
#: Inside a package with sub-packages, the same rule one level down: each unit (a sub-package, or
#: a module named here) imports only units below it; "(modules)" is every other plain module,
#: which may import each other. A package's ``__init__`` is its front door and may import any.
INNER_LAYERS: dict[str, list[set[str]]] = {
    "engines": [{"factory"}, {"embedded", "remote"}, {"(modules)"}],
    "gateway": [{"http", "workers"}, {"(modules)"}, {"render"}],
    "agents": [{"server"}, {"(modules)"}],
}
#: Conventional names each package may have: the seam's interface, the spec-string builder.
SHARED_NAMES = {"__init__", "base", "factory"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _imports(name: str, path: Path) -> set[str]:
    """Every rollway module ``name`` imports, at any depth of the file (TYPE_CHECKING and
    function-level imports included: they are dependencies all the same)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # ``from pkg import mod`` imports a module; ``from mod import name`` the module.
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base
                       for a in node.names]  # fmt: skip
        else:
            continue
        found.update(t for t in targets if t in MODULES and t != name)
    return found


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _package(module: str) -> str | None:
    parts = module.split(".")
    if len(parts) == 1:
        return None  # the root package's __init__: the front door, may import anything
    if (PACKAGE / parts[1]).is_dir():
        return parts[1]
    return None if parts[1] == "__main__" else "(ground)"


def _layer(package: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if package in layer)


def test_every_package_has_a_layer() -> None:
    packages = {p for p in map(_package, MODULES) if p is not None}
    unplaced = packages - set().union(*LAYERS)
    assert not unplaced, (
        f"add {sorted(unplaced)} to LAYERS (and to docs/architecture.md, docs/layout.md)"
    )


def test_imports_only_run_down_the_layers() -> None:
    wrong = []
    for module, targets in GRAPH.items():
        own = _package(module)
        if own is None:
            continue
        for target in targets:
            other = _package(target)
            if other is None or other == own:
                continue
            if _layer(other) <= _layer(own):
                wrong.append(f"{module} -> {target} ({own} may not import {other})")
    assert not wrong, "imports against the layers:\n" + "\n".join(sorted(wrong))


def _inner_unit(module: str) -> tuple[str, str] | None:
    """(package, unit) of a module inside a package that has inner layers."""
    parts = module.split(".")
    if len(parts) < 3 or parts[1] not in INNER_LAYERS or parts[-1] == "__init__":
        return None
    if MODULES[module].name == "__init__.py" and len(parts) == 3:
        return None  # the package's own front door
    named = set().union(*INNER_LAYERS[parts[1]])
    return parts[1], parts[2] if parts[2] in named else "(modules)"


def _inner_layer(package: str, unit: str) -> int:
    return next(i for i, layer in enumerate(INNER_LAYERS[package]) if unit in layer)


def test_every_sub_package_has_an_inner_layer() -> None:
    sub_packages = {p.parent.relative_to(PACKAGE).parts for p in PACKAGE.glob("*/*/__init__.py")}
    unplaced = sorted(
        "/".join(parts)
        for parts in sub_packages
        if parts[0] not in INNER_LAYERS or parts[1] not in set().union(*INNER_LAYERS[parts[0]])
    )
    assert not unplaced, f"add {unplaced} to INNER_LAYERS"


def test_imports_inside_a_package_run_down_its_inner_layers() -> None:
    wrong = []
    for module, targets in GRAPH.items():
        own = _inner_unit(module)
        if own is None:
            continue
        for target in targets:
            other = _inner_unit(target)
            if other is None or other[0] != own[0] or other[1] == own[1]:
                continue
            if _inner_layer(*other) <= _inner_layer(*own):
                wrong.append(f"{module} -> {target} ({own[1]} may not import {other[1]})")
    assert not wrong, "imports against the inner layers:\n" + "\n".join(sorted(wrong))


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return components


def test_no_module_cycles() -> None:
    # A package's __init__ re-exports its modules; a module importing a sibling through the
    # package is still a cycle, so __init__ edges stay in the graph.
    assert _cycles(GRAPH) == []


def test_no_package_cycles() -> None:
    packages: dict[str, set[str]] = collections.defaultdict(set)
    for module, targets in GRAPH.items():
        own = _package(module)
        if own is not None:
            packages[own] |= {p for p in map(_package, targets) if p not in (None, own)}
    assert _cycles(dict(packages)) == []


def test_module_names_are_unique() -> None:
    names = collections.defaultdict(list)
    for module in MODULES:
        if module.count(".") >= 1:
            names[module.rpartition(".")[2]].append(module)
    shared = {n: m for n, m in names.items() if len(m) > 1 and n not in SHARED_NAMES}
    assert not shared, f"modules that share a name: {shared}"


@pytest.mark.parametrize(
    ("graph", "expected"),
    [
        ({"a": {"b"}, "b": {"a"}, "c": set()}, [["a", "b"]]),
        ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
    ],
)
def test_the_cycle_finder_finds_cycles(
    graph: dict[str, set[str]], expected: list[list[str]]
) -> None:
    assert _cycles(graph) == expected


def test_the_layout_page_names_every_module() -> None:
    page = (PACKAGE.parents[1] / "docs" / "layout.md").read_text()
    layout = page.split("```")[1]
    missing = sorted(
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if path.stem not in SHARED_NAMES | {"__main__"}
        and not re.search(rf"\b{path.stem}\.(py\b|[A-Z])", layout)  # file.py or module.Class
    )
    assert not missing, f"docs/layout.md does not name: {missing}"
    for layer in LAYERS:
        for package in layer - {"(ground)"}:
            assert f"{package}/" in layout, f"docs/layout.md has no {package}/"


def test_the_architecture_page_lists_the_layers_in_order() -> None:
    page = (PACKAGE.parents[1] / "docs" / "architecture.md").read_text()
    table = page.split("## Layers", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| ") and "`" in line]
    documented = [set(re.findall(r"`(\w+)`", row.split("|")[2])) for row in rows]
    expected = [layer - {"(ground)"} for layer in LAYERS]
    ground = documented.pop()  # the ground layer lists root modules, not packages
    assert documented == expected[:-1], "docs/architecture.md's layer table differs from LAYERS"
    root_modules = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__", "__main__"}
    assert ground == root_modules, f"the ground row should list {sorted(root_modules)}"

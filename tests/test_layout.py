"""The package layout: one subpackage per pipeline stage, imports pointing down, no cycles.

Every intra-package import counts, including those inside functions: a lazy
import that points up the pipeline is still an upward dependency. The stage
order is the one docs/architecture.md describes.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "eqsat_mirage"
MAX_LINES = 500

# bottom to top: a module may import its own stage and the stages before it
STAGES = ("version", "ir", "runtime", "frontend", "semantics", "verifier", "mugraph",
          "partition", "cost", "egraph", "fusion", "codegen", "render", "family", "pipeline",
          "dynamo", "cli", "testing", "__init__")


def module_name(path: Path, root: Path) -> str:
    """Dotted name of ``path`` inside the package at ``root`` (a package is its __init__)."""
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the package modules it imports (anywhere in its body)."""
    files = {module_name(p, root): p for p in root.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        is_pkg = path.name == "__init__.py"
        here = name.split(".") if is_pkg else name.split(".")[:-1]
        out: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here[:len(here) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                for alias in node.names:  # `from pkg import module` imports the module
                    if f"{target}.{alias.name}" in files:
                        out.add(f"{target}.{alias.name}")
                    elif target in files:
                        out.add(target)
            elif isinstance(node, ast.Import):
                out.update(a.name for a in node.names if a.name in files)
        out.discard(name)
        graph[name] = out
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def stage_of(module: str) -> str:
    """The stage a module belongs to: its subpackage, or its own name at the top level."""
    parts = module.split(".")
    return "__init__" if len(parts) == 1 else parts[1]


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Imports that point to a later stage (or to a stage missing from STAGES)."""
    bad = []
    for mod, targets in graph.items():
        for t in targets:
            a, b = stage_of(mod), stage_of(t)
            if a not in STAGES or b not in STAGES or STAGES.index(b) > STAGES.index(a):
                bad.append(f"{mod} ({a}) imports {t} ({b})")
    return sorted(bad)


def long_modules(root: Path, limit: int = MAX_LINES) -> list[str]:
    """Modules longer than ``limit`` lines."""
    return sorted(f"{p.relative_to(root.parent)}: {n} lines" for p in root.rglob("*.py")
                  if (n := len(p.read_text().splitlines())) > limit)


def is_private(name: str) -> bool:
    """A ``_name`` (not a ``__dunder__``)."""
    return name.startswith("_") and not name.startswith("__")


def private_imports(path: Path, root: Path = PACKAGE) -> list[str]:
    """``file:line`` of every private name that ``path`` takes from a module of the package at
    ``root``: ``from .x import _y`` (relative or absolute) or ``x._y`` on a package module
    that ``path`` imported (``import pkg.x``, ``from pkg import x``)."""
    pkg = root.name
    files = {module_name(p, root) for p in root.rglob("*.py")}
    inside = path.is_relative_to(root)
    here = module_name(path, root).split(".") if inside else []
    if inside and path.name != "__init__.py":
        here = here[:-1]
    tree = ast.parse(path.read_text(), str(path))
    found, modules = [], {}  # local name -> the package module it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[:len(here) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target != pkg and not target.startswith(pkg + "."):
                continue
            for alias in node.names:
                if f"{target}.{alias.name}" in files:
                    modules[alias.asname or alias.name] = f"{target}.{alias.name}"
                if is_private(alias.name):
                    found.append(f"{path}:{node.lineno}: imports {alias.name} from {target}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == pkg or alias.name.startswith(pkg + "."):
                    local = alias.asname or alias.name.split(".")[0]
                    modules[local] = alias.name if alias.asname else pkg
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and is_private(node.attr):
            chain, base = [], node.value
            while isinstance(base, ast.Attribute):
                chain.append(base.attr)
                base = base.value
            if isinstance(base, ast.Name) and base.id in modules:
                owner = ".".join([modules[base.id], *reversed(chain)])
                if owner in files:
                    found.append(f"{path}:{node.lineno}: uses {owner}.{node.attr}")
    return found


def test_no_import_cycles():
    assert cycles(import_graph(PACKAGE)) == []


def test_imports_point_down_the_pipeline():
    assert upward_imports(import_graph(PACKAGE)) == []


def test_every_module_within_the_line_budget():
    assert long_modules(PACKAGE) == []


def test_every_stage_is_a_documented_subpackage():
    subpackages = sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py"))
    assert subpackages == sorted(s for s in STAGES if (PACKAGE / s).is_dir())
    for name in subpackages:
        doc = ast.get_docstring(ast.parse((PACKAGE / name / "__init__.py").read_text())) or ""
        for heading in ("Takes:", "Gives:", "May import:"):
            assert heading in doc, f"eqsat_mirage/{name}/__init__.py: no {heading!r} line"


def test_no_module_imports_another_modules_private_names():
    """Shared helpers are public (with a docstring) in the module where they belong."""
    sources = sorted(PACKAGE.rglob("*.py")) + sorted((PACKAGE.parent / "bench").rglob("*.py"))
    assert [hit for path in sources for hit in private_imports(path)] == []


@pytest.fixture
def bad_package(tmp_path):
    """A package with a lazy import cycle, an upward import and an over-long module."""
    root = tmp_path / "eqsat_mirage"
    for sub in ("ir", "cost"):
        (root / sub).mkdir(parents=True)
        (root / sub / "__init__.py").write_text('"""x"""\n')
    (root / "__init__.py").write_text("")
    (root / "ir" / "a.py").write_text("def f():\n    from ..cost import b\n")
    (root / "cost" / "b.py").write_text("from ..ir.a import f\n" + "x = 1\n" * MAX_LINES)
    (root / "cost" / "c.py").write_text(
        "import eqsat_mirage.ir.a\nfrom eqsat_mirage.ir import a as ir_a\nfrom . import b\n"
        "from .b import __doc__, f\nfrom ..ir.a import _g\n"
        "x = (b._h, ir_a._k, eqsat_mirage.ir.a._m, b.__name__, f._attr)\n")
    return root


def test_the_checks_catch_what_they_claim_to(bad_package):
    graph = import_graph(bad_package)
    assert cycles(graph) == [["eqsat_mirage.cost.b", "eqsat_mirage.ir.a"]]
    assert upward_imports(graph) == ["eqsat_mirage.ir.a (ir) imports eqsat_mirage.cost.b (cost)"]
    assert long_modules(bad_package) == [f"eqsat_mirage/cost/b.py: {MAX_LINES + 1} lines"]
    c = bad_package / "cost" / "c.py"
    assert private_imports(c, bad_package) == [
        f"{c}:5: imports _g from eqsat_mirage.ir.a",
        f"{c}:6: uses eqsat_mirage.cost.b._h", f"{c}:6: uses eqsat_mirage.ir.a._k",
        f"{c}:6: uses eqsat_mirage.ir.a._m"]


def test_every_subpackage_ships_in_the_wheel():
    import tomllib

    config = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())
    listed = set(config["tool"]["setuptools"]["packages"])
    found = {module_name(p, PACKAGE) for p in PACKAGE.rglob("__init__.py")}
    assert found <= listed, sorted(found - listed)

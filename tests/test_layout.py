"""The package layout: one subpackage per pipeline stage, imports pointing down, no cycles;
modules and functions within their line budgets; no module reaching into another's private
names or attributes.

Every intra-package import counts, including those inside functions: a lazy
import that points up the pipeline is still an upward dependency. The stage
order is the one docs/architecture.md describes.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "eqsat_mirage"
MAX_LINES = 800  # per module: one concept may need more than 500
MAX_FUNCTION_LINES = 100

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


def long_functions(root: Path, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """``file:function: N lines`` of every function longer than ``limit`` lines (a method
    as ``Class.method``, a nested function as ``outer.inner``, each counted on its own)."""
    found = []

    def visit(node: ast.AST, path: Path, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                n = child.end_lineno - child.lineno + 1
                if not isinstance(child, ast.ClassDef) and n > limit:
                    found.append(f"{path.relative_to(root.parent)}:{name}: {n} lines")
                visit(child, path, f"{name}.")
            else:
                visit(child, path, prefix)

    for path in sorted(root.rglob("*.py")):
        visit(ast.parse(path.read_text(), str(path)), path, "")
    return found


def defined_names(tree: ast.AST) -> set[str]:
    """The names a module defines: its functions, classes and methods, every name it
    assigns, ``self.x`` / ``cls.x``, its ``__slots__``, ``setattr(obj, "x", ...)`` (and
    ``object.__setattr__``) with a literal name, and the names its imports bind."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and \
                isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            names.add(node.attr)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Call) and len(node.args) >= 2 and \
                isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str) \
                and (isinstance(node.func, ast.Name) and node.func.id == "setattr"
                     or isinstance(node.func, ast.Attribute) and node.func.attr == "__setattr__"):
            names.add(node.args[1].value)
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__slots__"
                                                  for t in node.targets):
            names.update(c.value for c in ast.walk(node.value)
                         if isinstance(c, ast.Constant) and isinstance(c.value, str))
    return names


def library_names(tree: ast.AST, pkg: str) -> set[str]:
    """The local names a module binds to other packages (``import torch``, ``from torch
    import fx``): their private attributes are those libraries' business, not the package's."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update((a.asname or a.name).split(".")[0] for a in node.names
                         if a.name != pkg and not a.name.startswith(pkg + "."))
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module and \
                node.module != pkg and not node.module.startswith(pkg + "."):
            names.update(a.asname or a.name for a in node.names)
    return names


def private_attributes(root: Path) -> list[str]:
    """``file:line: obj._name`` of every attribute access to another module's private
    attribute: ``x._name`` where ``x`` is not ``self`` / ``cls``, ``_name`` is not defined in
    the same module (``defined_names``) but is in another module of the package at ``root``
    (a private name no module of it defines is a library's: torch's ``t._version``), and
    ``x`` is not bound to another package (``torch._ops``, ``sys._getframe``). What modules
    share is a public, documented attribute or method of the module that owns it."""
    trees = {p: ast.parse(p.read_text(), str(p)) for p in sorted(root.rglob("*.py"))}
    defined = {p: defined_names(tree) for p, tree in trees.items()}
    found = []
    for path, tree in trees.items():
        elsewhere = set().union(*(names for p, names in defined.items() if p != path))
        libraries = library_names(tree, root.name)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute) or not is_private(node.attr) or \
                    node.attr in defined[path] or node.attr not in elsewhere:
                continue
            base = node.value
            while isinstance(base, ast.Attribute):
                base = base.value
            if isinstance(base, ast.Name) and (base.id in ("self", "cls") and
                                               base is node.value or base.id in libraries):
                continue
            found.append(f"{path.relative_to(root.parent)}:{node.lineno}: {ast.unparse(node)}")
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


def test_every_function_within_the_line_budget():
    """A longer function is split into helpers named by what its parts do."""
    assert long_functions(PACKAGE) == []


def test_no_module_reaches_into_another_modules_private_attributes():
    """What modules share is public and documented where it belongs (``private_attributes``)."""
    assert private_attributes(PACKAGE) == []


@pytest.fixture
def bad_package(tmp_path):
    """A package with a lazy import cycle, an upward import, an over-long module and
    function, private imports and reaches into another module's private attributes."""
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
    (root / "ir" / "e.py").write_text(
        "class Thing:\n    def __init__(self):\n        self._secret = 1\n\n"
        "    def _hidden(self):\n        return self._secret\n\n\n_ops = 2\n")
    (root / "cost" / "d.py").write_text(
        "import torch\n\nfrom ..ir.e import Thing\n\n\n"
        "class Local:\n    def __init__(self):\n        self._own, self.thing = 1, Thing()\n\n"
        "    def peek(self):\n        return self._own, self.thing._secret\n\n\n"
        "def reach(t, other):\n    return t._secret, t._hidden(), other._own, torch._ops, t._no\n"
        "\n\ndef long():\n" + "    x = 1\n" * (MAX_FUNCTION_LINES - 1) + "    return x\n")
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
    assert long_functions(bad_package) == [
        f"eqsat_mirage/cost/d.py:long: {MAX_FUNCTION_LINES + 1} lines"]
    assert sorted(private_attributes(bad_package)) == [  # not torch's, nor d.py's own _own
        "eqsat_mirage/cost/d.py:11: self.thing._secret", "eqsat_mirage/cost/d.py:15: t._hidden",
        "eqsat_mirage/cost/d.py:15: t._secret"]


def test_every_subpackage_ships_in_the_wheel():
    import tomllib

    config = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())
    listed = set(config["tool"]["setuptools"]["packages"])
    found = {module_name(p, PACKAGE) for p in PACKAGE.rglob("__init__.py")}
    assert found <= listed, sorted(found - listed)


def test_test_modules_have_distinct_names():
    """tests/ has no packages, so pytest imports each test module by its file name: two
    modules of one name in different folders stop the whole suite at collection ("import
    file mismatch"), which a run of one folder never shows."""
    tests = Path(__file__).resolve().parent
    seen: dict[str, Path] = {}
    for path in sorted(tests.rglob("test_*.py")):
        assert path.name not in seen, (path, seen.get(path.name))
        seen[path.name] = path

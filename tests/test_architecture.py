"""docs/architecture.md is the living map of the package: it names every module. The import graph it describes
has no cycles, and only the entry point and the measuring package import ddplan modules inside functions."""

from __future__ import annotations

import ast
import re
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "ddplan"
# where an import inside a function is the design: the CLI imports each command's modules when that command runs
# (`ddplan --help` starts without pydantic's models, pandas or torch: tests/test_startup.py), and the measuring
# package imports what needs torch only when it measures
LAZY_ALLOWED = ("cli.py", "calibrate/")


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


def _imports(path: Path, name: str, modules: dict[str, Path]) -> list[tuple[str, bool]]:
    """(ddplan module imported, whether inside a function) for each import of a ddplan module in the file;
    `from ddplan import x` counts as importing ddplan.x where that is a module. Imports under `if
    TYPE_CHECKING:` are left out (they never run)."""
    found: list[tuple[str, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            targets: list[str] = []
            if isinstance(child, ast.Import):
                targets = [a.name for a in child.names]
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                targets = [f"{child.module}.{a.name}" if f"{child.module}.{a.name}" in modules else child.module
                           for a in child.names]
            found.extend((t, in_function) for t in targets if t in modules and t != name and t != "ddplan")
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(ast.parse(path.read_text(encoding="utf-8")), False)
    return found


def test_the_architecture_map_names_every_module():
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    modules = sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py"))
    assert modules and [m for m in modules if f"`{m}`" not in text] == []
    # and names no module that is gone
    named = set(re.findall(r"`((?:calibrate/)?[a-z_]+\.py)`", text))
    assert named - set(modules) == set()


def test_the_import_graph_has_no_cycles():
    """Every import of a ddplan module by another, at the top or inside a function, is an edge; a cycle (hf and
    registry, price -> runs -> table -> price once) makes the order modules load in matter and hides behind
    imports inside functions."""
    modules = _modules()
    graph = {name: {m for m, _ in _imports(path, name, modules)} for name, path in modules.items()}
    try:
        list(TopologicalSorter(graph).static_order())
    except CycleError as e:
        raise AssertionError(f"import cycle: {' -> '.join(e.args[1])}") from None


def test_only_the_entry_point_and_calibrate_import_ddplan_inside_functions():
    modules = _modules()
    hidden = sorted(f"{path.relative_to(PACKAGE)} imports {m}" for name, path in modules.items()
                    if not str(path.relative_to(PACKAGE)).startswith(LAZY_ALLOWED)
                    for m, inside in _imports(path, name, modules) if inside)
    assert hidden == []


def test_the_graph_check_sees_a_cycle_and_a_hidden_import(tmp_path):
    """The checks above on a made-up package: a -> b at the top, b -> a inside a function."""
    pkg = tmp_path / "ddplan"
    pkg.mkdir()
    (pkg / "a.py").write_text("from ddplan.b import f\n")
    (pkg / "b.py").write_text("def f():\n    from ddplan import a\n    return a\n")
    modules = {"ddplan.a": pkg / "a.py", "ddplan.b": pkg / "b.py"}
    assert _imports(pkg / "a.py", "ddplan.a", modules) == [("ddplan.b", False)]
    assert _imports(pkg / "b.py", "ddplan.b", modules) == [("ddplan.a", True)]
    graph = {n: {m for m, _ in _imports(p, n, modules)} for n, p in modules.items()}
    try:
        list(TopologicalSorter(graph).static_order())
    except CycleError:
        return
    raise AssertionError("the cycle a -> b -> a was not found")

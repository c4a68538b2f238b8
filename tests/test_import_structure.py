"""The package's import structure, read from the source with `ast`: no import cycle anywhere in
txstream/, and task/ (what runs in Spark's Python workers) reaches neither the driver, the CLI
and the tools, nor builds DataFrames."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "txstream"
TASK_MAY_NOT_IMPORT = ("txstream.driver", "txstream.cli", "txstream.tools")
# What creates a SparkSession or a DataFrame: the driver's business, never a task's.
DATAFRAME_BUILDERS = ("pyspark.sql.SparkSession", "pyspark.sql.session", "pyspark.sql.DataFrame",
                      "pyspark.sql.dataframe", "pyspark.sql.functions", "pyspark.sql.column")
DATAFRAME_CALLS = ("createDataFrame", "mapInArrow", "mapInPandas")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _nodes(tree: ast.AST, type_checking: bool = False):
    """Every node, module- and function-level, except inside `if TYPE_CHECKING:` blocks (unless
    `type_checking`: those too)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child) and not type_checking:
                stack.extend(child.orelse)
                continue
            stack.append(child)


def imports(name: str, path: Path, known: set[str], type_checking: bool = False) -> dict[str, int]:
    """The txstream modules `name` imports (each with a line it does so on); with
    `type_checking`, the imports only a type checker makes too."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: dict[str, int] = {}

    def add(target: str, line: int) -> None:
        while target and target not in known:   # `from a.b import c` may name a function of a.b
            target = target.rpartition(".")[0]
        if target and target != name:
            found.setdefault(target, line)

    for node in _nodes(tree, type_checking):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            for alias in node.names:
                add(f"{base}.{alias.name}", node.lineno)
    return found


def graph(type_checking: bool = False) -> dict[str, dict[str, int]]:
    found = modules()
    known = set(found)
    return {name: imports(name, path, known, type_checking) for name, path in found.items()}


def cycles(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_the_helpers_find_a_cycle_and_resolve_relative_imports(tmp_path) -> None:
    """The checks below can fail: a two-module circle is found, a chain is not."""
    assert cycles({"a": {"b": 1}, "b": {"a": 1}, "c": {"a": 1}}) == [["a", "b"]]
    assert cycles({"a": {"b": 1}, "b": {"c": 1}, "c": {}}) == []
    source = tmp_path / "m.py"
    source.write_text("from typing import TYPE_CHECKING\nfrom . import x\nif TYPE_CHECKING:\n    import txstream.y\n"
                      "def f():\n    from .z import g\n")
    assert imports("txstream.pkg.m", source, {"txstream.pkg.x", "txstream.y", "txstream.pkg.z"}) == {
        "txstream.pkg.x": 2, "txstream.pkg.z": 6}


def test_no_import_cycle_in_the_package() -> None:
    """TYPE_CHECKING imports count: a cycle a type checker walks is one a reader walks too."""
    edges = graph(type_checking=True)
    found = cycles(edges)
    described = []
    for component in found:
        members = set(component)
        links = [f"{a} -> {b} (line {edges[a][b]})" for a in component for b in sorted(edges[a]) if b in members]
        described.append("; ".join(links))
    assert not found, "import cycles:\n" + "\n".join(described)


def test_task_modules_stay_on_the_task_side() -> None:
    """task/ runs in Spark's Python workers: it imports nothing of the driver, the CLI or the
    tools, and builds no SparkSession or DataFrame."""
    problems = []
    for name, path in modules().items():
        if not name.startswith("txstream.task"):
            continue
        tree = ast.parse(path.read_text(), str(path))
        for node in _nodes(tree):
            targets = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                targets = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            for target in targets:
                if target.startswith(TASK_MAY_NOT_IMPORT) or target.startswith(DATAFRAME_BUILDERS):
                    problems.append(f"{name} line {node.lineno} imports {target}")
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in DATAFRAME_CALLS):
                problems.append(f"{name} line {node.lineno} calls .{node.func.attr}(): builds a DataFrame")
    assert not problems, "\n".join(problems)


OPERATORS_MAY_NOT_IMPORT = ("txstream.driver", "txstream.cli", "txstream.tools", "txstream.task")


def test_operators_are_shared_by_the_driver_and_the_workers() -> None:
    """operators/ is imported by the driver and by the Python workers: it reaches none of the
    driver, the CLI, the tools or the task shell, and imports pyspark.sql only inside the
    functions that build frames (a worker imports it without loading them)."""
    problems = []
    for name, path in modules().items():
        if not name.startswith("txstream.operators"):
            continue
        tree = ast.parse(path.read_text(), str(path))
        top_level = set(map(id, tree.body))
        for node in _nodes(tree):
            targets = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                targets = [node.module]
            for target in targets:
                if target.startswith(OPERATORS_MAY_NOT_IMPORT):
                    problems.append(f"{name} line {node.lineno} imports {target}")
                if target.startswith("pyspark.sql") and id(node) in top_level:
                    problems.append(f"{name} line {node.lineno} imports {target} at module level")
    assert not problems, "\n".join(problems)
    assert (PACKAGE / "operators" / "__init__.py").read_text() == ""


def _reaching(prefix: str, forbidden: tuple[str, ...], edges: dict[str, dict[str, int]]) -> list[str]:
    """The imports (direct, TYPE_CHECKING ones left out) from modules under `prefix` into
    `forbidden` packages, each with its line."""
    return [f"{name} line {line} imports {target}" for name, targets in sorted(edges.items())
            if name == prefix or name.startswith(prefix + ".")
            for target, line in sorted(targets.items()) if target.startswith(forbidden)]


def test_the_offline_commands_need_nothing_of_the_driver() -> None:
    """tools/ (verify, offsets, state show/reset) reads what the driver wrote through records.py:
    importing driver/ would start nothing, but would tie the commands to the run's code."""
    problems = _reaching("txstream.tools", ("txstream.driver",), graph())
    assert not problems, "\n".join(problems)


def test_the_records_sit_below_driver_task_and_tools() -> None:
    """records.py is what the driver, the tasks and the tools all read and write: it imports
    none of them (nor the CLI), so each can use it without reaching the others."""
    problems = _reaching("txstream.records", ("txstream.driver", "txstream.task", "txstream.tools", "txstream.cli"),
                         graph())
    assert not problems, "\n".join(problems)


def test_the_state_layer_reaches_nothing_above_it(tmp_path) -> None:
    """state/ (stores, keys, changelog, snapshots, restore) is what the operators and the task
    shell stand on: it imports none of them, nor the driver, the tools or the CLI, not even for a
    type checker (an annotation's import is still an arrow a reader follows)."""
    above = ("txstream.task", "txstream.operators", "txstream.driver", "txstream.tools", "txstream.cli")
    problems = _reaching("txstream.state", above, graph(type_checking=True))
    assert not problems, "\n".join(problems)
    # The check sees an import made for type checkers only.
    source = tmp_path / "restore.py"
    source.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from txstream.task.units import Marker\n")
    assert imports("txstream.state.restore", source, {"txstream.task.units"}, type_checking=True) == {
        "txstream.task.units": 3}

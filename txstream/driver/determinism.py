"""Determinism of a wide transform, checked on its analyzed plan before anything is read
(docs/wide-transforms.md §4).

A wide batch that is re-run after a crash must route every output row to the same unit and give
each unit the same rows, or a unit published before the crash and one published after could
hold the same row twice, or miss one. Spark re-computes a shuffle deterministically only when the
expressions are deterministic (SPARK-23207); these are not, and are refused unless the processor
opts in (`allow_nondeterministic`), in which case the units' markers still catch a replay that
differs (task/units.py).
"""
from __future__ import annotations

from txstream.errors import TransformError

# Expressions Spark calls deterministic within one execution that differ between executions,
# and aggregates whose result depends on the order rows arrive in (a shuffle's is not fixed).
BY_NAME = {
    "CurrentTimestamp": "current_timestamp() differs on a re-run: use self.batch_timestamp (the logged batch time)",
    "Now": "now() differs on a re-run: use self.batch_timestamp (the logged batch time)",
    "CurrentDate": "current_date() differs on a re-run: use self.batch_timestamp",
    "LocalTimestamp": "localtimestamp() differs on a re-run: use self.batch_timestamp",
    "CurrentBatchTimestamp": "the current batch timestamp differs on a re-run: use self.batch_timestamp",
    "CollectList": "collect_list's order follows the shuffle's, which is not fixed: sort it (array_sort)",
    "CollectSet": "collect_set's order follows the shuffle's, which is not fixed: sort it (array_sort)",
    "First": "first() takes whichever row the shuffle delivers first: use min/max or a deterministic key",
    "Last": "last() takes whichever row the shuffle delivers last: use min/max or a deterministic key",
    "Shuffle": "shuffle() is random",
}


def nondeterministic_parts(frame) -> list[str]:
    """What in the frame's analyzed plan would make a re-run differ, each with the reason."""
    found: list[str] = []
    seen: set[str] = set()

    def note(text: str) -> None:
        if text not in seen:
            seen.add(text)
            found.append(text)

    def walk_expression(expr) -> None:
        name = expr.getClass().getSimpleName()
        children = _seq(expr.children())
        if name in BY_NAME:
            note(f"{_pretty(expr)}: {BY_NAME[name]}")
        elif not expr.deterministic() and all(c.deterministic() for c in children):
            what = "a Python UDF declared non-deterministic (asNondeterministic)" if "PythonUDF" in name \
                else "Spark marks it non-deterministic"
            note(f"{_pretty(expr)}: {what}")
        for child in children:
            walk_expression(child)

    def walk_plan(node) -> None:
        name = node.getClass().getSimpleName()
        if name == "Deduplicate" and _seq(node.keys()).__len__() < _seq(node.output()).__len__():
            note("dropDuplicates(subset): keeps an arbitrary row of each key's duplicates; drop the other "
                 "columns first or aggregate them with min/max")
        for expr in _seq(node.expressions()):
            walk_expression(expr)
        for child in _seq(node.children()):
            walk_plan(child)

    walk_plan(frame._jdf.queryExecution().analyzed())
    return found


def check_deterministic(frame, allowed: bool) -> list[str]:
    """Refuse a non-deterministic wide transform (or return what is not, when allowed)."""
    parts = nondeterministic_parts(frame)
    if parts and not allowed:
        raise TransformError(
            "The transform is wide and not deterministic, so a batch re-run after a failure could "
            "publish a row twice or lose one: " + "; ".join(parts[:4])
            + ". Make it deterministic, or set allow_nondeterministic = True on the processor "
            "(--allow-nondeterministic) to accept that (docs/wide-transforms.md).")
    return parts


def _seq(scala_seq) -> list:
    iterator = scala_seq.iterator()
    items = []
    while iterator.hasNext():
        items.append(iterator.next())
    return items


def _pretty(expr) -> str:
    try:
        return str(expr.sql())[:80]
    except Exception:
        return str(expr.prettyName())

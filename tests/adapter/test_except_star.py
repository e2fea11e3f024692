"""No product code raises a new exception inside `except*`: the image's Python (Debian's 3.11.2)
wraps it in an ExceptionGroup, which a caller's `except SomeError` then misses (fixed in 3.11.4).

That is how the adapter's first failed discovery pass ended the process in the container while
the tests, on a newer 3.11, passed. A bare `raise` (re-raising the group) is fine; converting a
group into one exception is done in a plain `except ExceptionGroup` with `.split()`.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("adapter", "autoscaler", "cli", "metricscale", "monitoring")


def raises_inside_except_star(tree: ast.AST) -> list[int]:
    """Line numbers of `raise X` statements that run in the body of an `except*` handler."""
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.TryStar):
            continue
        for handler in node.handlers:
            pending: list[ast.AST] = list(handler.body)
            while pending:
                statement = pending.pop()
                if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
                              | ast.ClassDef):
                    continue  # runs later, outside the handler
                if isinstance(statement, ast.Raise) and statement.exc is not None:
                    lines.append(statement.lineno)
                pending.extend(ast.iter_child_nodes(statement))
    return sorted(lines)


def test_the_check_finds_a_raise_inside_except_star() -> None:
    source = ("try:\n    pass\nexcept* ValueError:\n    if True:\n        raise KeyError\n"
              "except* OSError:\n    raise\n")
    assert raises_inside_except_star(ast.parse(source)) == [5]


def test_no_product_module_raises_inside_except_star() -> None:
    found = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            found += [f"{path.relative_to(REPO)}:{line}"
                      for line in raises_inside_except_star(tree)]
    assert found == [], ("raise inside except* is wrapped in an ExceptionGroup on Python "
                         f"< 3.11.4 (the image's): {found}")

"""Code shape: no function in the package is longer than MAX_LINES lines, from its `def` to the
end of its body (methods and nested functions included; a nested function's lines count towards
its parent's too). Long functions hide steps that deserve a name of their own."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

SRC = Path(importlib.util.find_spec("rltok").submodule_search_locations[0])
MAX_LINES = 80


def long_functions(source: str, filename: str, max_lines: int = MAX_LINES) -> list[str]:
    """`file:line:name (N lines)` for every function or method of `source` over max_lines lines."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = node.end_lineno - node.lineno + 1
            if lines > max_lines:
                found.append(f"{filename}:{node.lineno}:{node.name} ({lines} lines)")
    return found


def test_the_check_finds_long_functions_methods_and_nested_ones():
    source = """\
def short():
    return 1


def long():
    a = 1
    b = 2
    return a + b


class C:
    async def method(self):
        a = 1
        return a

    def fine(self):
        return 2


def outer():
    def inner():
        a = 1
        return a
    return inner
"""
    assert sorted(long_functions(source, "m.py", max_lines=3)) == ["m.py:20:outer (5 lines)", "m.py:5:long (4 lines)"]
    assert sorted(long_functions(source, "m.py", max_lines=2)) == [
        "m.py:12:method (3 lines)", "m.py:20:outer (5 lines)", "m.py:21:inner (3 lines)", "m.py:5:long (4 lines)"]
    assert long_functions(source, "m.py", max_lines=5) == []


def test_no_function_in_the_package_is_over_80_lines():
    paths = sorted(SRC.rglob("*.py"))
    assert len(paths) > 20  # the package itself, not an empty folder
    offenders = [f for p in paths for f in long_functions(p.read_text(encoding="utf-8"),
                                                            str(p.relative_to(SRC.parent.parent)))]
    assert not offenders, (f"functions over {MAX_LINES} lines (split them into named steps):\n  "
                           + "\n  ".join(offenders))

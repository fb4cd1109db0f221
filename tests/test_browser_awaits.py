"""Browser tests await what they assert on (issue 41): a value read once from the page (`count()`,
`inner_text()`, `input_value()`, ...) and then asserted on, or branched on, can be read before the page has
redrawn; on a busy machine that fails a green change. Playwright's `expect` waits for the value instead.

This reads tests/test_browser*.py and tests/browser_support.py with `ast` (no browser) and fails on every
`assert`, `if`, `while`, conditional expression or comprehension filter whose test uses a value read once:
a call of a reading method, a name assigned from one (in the same function, also through `append` and
`for`), or a helper function that returns one (in the same file or imported from another checked file).
An assert's message is left alone: it is read only to explain a failure.

A page's `url` and `title()` count only on a name ending in "page" (`app.url` is a string); not covered: a
read value passed to a function that asserts on it.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
# Playwright's reads of a page's present state: each has an `expect` assertion (or `wait_for_function`) that
# waits for the value instead. `count` and `title` only without arguments (str.count(x) and list.count(x) take
# one; a Locator's count takes none).
READS = {"count", "inner_text", "inner_html", "text_content", "all_inner_texts", "all_text_contents",
         "is_visible", "is_hidden", "is_enabled", "is_disabled", "is_checked", "is_editable", "input_value",
         "get_attribute", "evaluate", "evaluate_all", "bounding_box"}
NO_ARGUMENT_ONLY = {"count"}
# A page's address and title are read once too (expect(page).to_have_url / to_have_title await them), but `url`
# and `title` are common names (app.url, str.title()): they count only on a name ending in "page".
PAGE_READS = {"url", "title"}
COLLECTING = {"append", "extend", "add", "insert", "update"}


def browser_test_files() -> list[Path]:
    """The browser tests: test_browser*.py, their support module, and any other test file marked `browser`."""
    marked = {path for path in TESTS.glob("test_*.py") if "@pytest.mark.browser" in path.read_text(encoding="utf-8")}
    return sorted({*TESTS.glob("test_browser*.py"), *marked, TESTS / "browser_support.py"})


@dataclass(frozen=True)
class ReadOnce:
    path: str
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.what} uses a value read once; await it with expect(...)"


def on_a_page(node: ast.Attribute) -> bool:
    return isinstance(node.value, ast.Name) and node.value.id.endswith("page")


def is_read(node: ast.AST) -> bool:
    if isinstance(node, ast.Attribute) and node.attr == "url" and on_a_page(node):
        return True
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
        return False
    if node.func.attr == "title":
        return on_a_page(node.func) and not (node.args or node.keywords)
    name = node.func.attr
    if name not in READS:
        return False
    return not (name in NO_ARGUMENT_ONLY and (node.args or node.keywords))


def called_name(node: ast.Call) -> str | None:
    return node.func.id if isinstance(node.func, ast.Name) else None


def uses_read(expr: ast.AST, tainted_names: set[str], tainted_functions: set[str]) -> bool:
    """Whether `expr` reads the page once: a reading call, a name holding such a value, or a call of a helper
    returning one."""
    for node in ast.walk(expr):
        if is_read(node):
            return True
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in tainted_names:
            return True
        if isinstance(node, ast.Call) and called_name(node) in tainted_functions:
            return True
    return False


def target_names(target: ast.AST) -> Iterator[str]:
    for node in ast.walk(target):
        if isinstance(node, ast.Name):
            yield node.id


def own_nodes(function: ast.AST) -> Iterator[ast.AST]:
    """The nodes of a function's body, not those of functions defined inside it (those are checked apart)."""
    stack = list(ast.iter_child_nodes(function))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            stack.extend(ast.iter_child_nodes(node))


def tainted_names_in(scope: ast.AST, tainted_functions: set[str]) -> set[str]:
    """The names a scope assigns from a value read once, to a fixed point (b = a.strip() after a = x.inner_text())."""
    names: set[str] = set()
    while True:
        before = len(names)
        for node in own_nodes(scope):
            if isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign | ast.NamedExpr) and node.value is not None:
                if uses_read(node.value, names, tainted_functions):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    for target in targets:
                        names.update(target_names(target))
            elif isinstance(node, ast.For | ast.AsyncFor | ast.comprehension):
                if uses_read(node.iter, names, tainted_functions):
                    names.update(target_names(node.target))
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and node.func.attr in COLLECTING and isinstance(node.func.value, ast.Name)
                  and any(uses_read(arg, names, tainted_functions) for arg in node.args)):
                names.add(node.func.value.id)
        if len(names) == before:
            return names


def scopes(tree: ast.Module) -> list[ast.AST]:
    return [tree, *(node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef))]


def returning_reads(tree: ast.Module, tainted_functions: set[str]) -> set[str]:
    """The functions of a module that return a value read once (directly or through a name or another such
    function), to a fixed point."""
    found = set(tainted_functions)
    while True:
        before = len(found)
        for scope in scopes(tree):
            if not isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            names = tainted_names_in(scope, found)
            if any(isinstance(node, ast.Return) and node.value is not None and uses_read(node.value, names, found)
                   for node in own_nodes(scope)):
                found.add(scope.name)
        if len(found) == before:
            return found


def imported_helpers(tree: ast.Module, tainted_by_module: dict[str, set[str]]) -> set[str]:
    """The names a module imports from another checked module (`from tests.x import y`) that return a read."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tests."):
            tainted = tainted_by_module.get(node.module.removeprefix("tests."), set())
            names.update(alias.asname or alias.name for alias in node.names if alias.name in tainted)
    return names


def conditions(scope: ast.AST) -> Iterator[tuple[ast.AST, ast.AST, str]]:
    """(node, tested expression, kind) for every assertion and branch in a scope's own body."""
    for node in own_nodes(scope):
        if isinstance(node, ast.Assert):
            yield node, node.test, "assert"
        elif isinstance(node, ast.If):
            yield node, node.test, "if"
        elif isinstance(node, ast.While):
            yield node, node.test, "while"
        elif isinstance(node, ast.IfExp):
            yield node, node.test, "conditional expression"
        elif isinstance(node, ast.comprehension):
            for test in node.ifs:
                yield test, test, "comprehension filter"


def reads_once(sources: dict[str, str]) -> list[ReadOnce]:
    """Every assertion or branch on a value read once, in {module name: source}, by file and line."""
    trees = {name: ast.parse(source, filename=name) for name, source in sources.items()}
    tainted: dict[str, set[str]] = {name: set() for name in trees}
    while True:  # helpers imported from other checked modules, to a fixed point
        before = sum(len(functions) for functions in tainted.values())
        for name, tree in trees.items():
            tainted[name] = returning_reads(tree, tainted[name] | imported_helpers(tree, tainted))
        if sum(len(functions) for functions in tainted.values()) == before:
            break
    found = []
    for name, tree in trees.items():
        for scope in scopes(tree):
            names = tainted_names_in(scope, tainted[name])
            for node, test, kind in conditions(scope):
                if uses_read(test, names, tainted[name]):
                    found.append(ReadOnce(f"tests/{name}.py", node.lineno, f"{kind} `{ast.unparse(test)[:80]}`"))
    return sorted(set(found), key=lambda r: (r.path, r.line))


# ---- the checker on samples of the old code -------------------------------------------------------------------


# The old code as a data file, not a string here: a scan of the browser tests for values read once then finds only
# real tests, never this sample of what the checker must catch.
OLD = (Path(__file__).parent / "data" / "browser_reads_once_sample.txt").read_text()

IMPORTER = '''
from tests.sample_old import sidebar_value


def test_imports(page):
    assert sidebar_value(page, "Task") == "arithmetic"
'''

AWAITED = '''
import re
from playwright.sync_api import expect


def sidebar_box(page, label):
    return page.locator("[data-testid='stSidebar']").get_by_role("combobox", name=label)


def test_new(page, note, gate_failed, text, app):
    expect(page.get_by_text("Re-read the question before answering.").first).to_be_visible()
    expect(sidebar_box(page, "Task")).to_have_value("support")
    first = page.locator("x").inner_text()  # read, but only as the value to move away from
    expect(page.locator("x")).not_to_have_text(first)
    if gate_failed:  # from the database, not the page
        expect(note).to_be_visible()
    assert text.count("a") == 1, page.evaluate("() => document.title")  # str.count; a message only
    assert [line for line in text.splitlines() if line.title()]
    assert app.url.startswith("http")
    expect(page).to_have_url(re.compile("task="))
'''


def test_the_checker_names_each_read_once_assertion_of_the_old_code_by_file_and_line():
    found = reads_once({"sample_old": OLD, "sample_importer": IMPORTER})
    lines = {(r.path, r.line) for r in found}
    old = OLD.splitlines()
    expected = {("tests/sample_old.py", number) for number, line in enumerate(old, 1)
                if line.strip().startswith(("assert", "if")) and "texts = " not in line}
    expected.add(("tests/sample_old.py", next(n for n, line in enumerate(old, 1) if "texts = " in line)))
    expected.add(("tests/sample_importer.py", IMPORTER.splitlines().index(
        '    assert sidebar_value(page, "Task") == "arithmetic"') + 1))
    assert lines == expected, "\n".join(map(str, found))
    assert str(found[0]).startswith("tests/sample_importer.py:6: assert `sidebar_value(page, 'Task')")


def test_the_checker_lets_awaited_values_and_reads_that_are_not_asserted_on_pass():
    assert reads_once({"sample_new": AWAITED}) == []


@functools.cache
def reads_in_browser_tests() -> tuple[ReadOnce, ...]:
    return tuple(reads_once({file.stem: file.read_text() for file in browser_test_files()}))


@pytest.mark.parametrize("path", browser_test_files(), ids=lambda path: path.name)
def test_browser_tests_await_every_value_they_assert_on(path):
    found = [r for r in reads_in_browser_tests() if r.path == f"tests/{path.name}"]
    assert found == [], "\n" + "\n".join(map(str, found))

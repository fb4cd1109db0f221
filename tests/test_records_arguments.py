"""The rule core/records/__init__.py states for the first argument of its functions (issue 30): a function
that changes what is stored takes the engine and owns its transaction; one that takes a Session never
commits, because it reads, or is one step of the transaction its caller owns."""

from __future__ import annotations

import ast
from pathlib import Path

RECORDS = Path(__file__).resolve().parent.parent / "core" / "records"


def public_functions() -> list[tuple[str, ast.FunctionDef]]:
    found = []
    for path in sorted(RECORDS.rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_") and node.args.args:
                found.append((f"{path.relative_to(RECORDS).with_suffix('')}.{node.name}", node))
    return found


def commits(node: ast.FunctionDef) -> bool:
    source = ast.unparse(node)
    return ".commit(" in source or "session_scope(" in source


def test_a_records_function_takes_the_engine_or_a_session_first():
    database_first = {name: node.args.args[0].arg for name, node in public_functions()
                      if node.args.args[0].arg in ("engine", "session")}
    annotated = {name: ast.unparse(node.args.args[0].annotation) for name, node in public_functions()
                 if name in database_first and node.args.args[0].annotation is not None}
    assert {name: kind for name, kind in annotated.items()
            if kind != {"engine": "Engine", "session": "Session"}[database_first[name]]} == {}
    assert len(database_first) > 100


def test_a_function_given_a_session_never_commits():
    assert [name for name, node in public_functions() if node.args.args[0].arg == "session" and commits(node)] == []


def test_the_check_sees_a_commit():
    node = ast.parse("def f(session):\n    session.commit()\n").body[0]
    assert commits(node)

"""Fail on any import circle among the project's modules, counting imports inside functions too (import-linter's
contracts see only what a module imports, and a lazy import inside a function is how a circle hides).

An edge A -> B is any `import B` or `from B import name` anywhere in A (a name that is itself a module counts as
that module); a package's own `__init__` is not counted as imported by its children, as Python's loading of the
parent is not a dependency of the child's code. Prints each circle's modules, or the count of modules read.

    python scripts/import_cycles.py [core api pages ui storage]
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(folders: list[str]) -> dict[str, Path]:
    return {module_name(path): path for folder in folders for path in sorted((ROOT / folder).rglob("*.py"))}


def imported(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The project's modules `name` imports anywhere in its file."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    return {target for target in found if target in known and target != name}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
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
                    found.append(sorted(component))
    return found


def main(argv: list[str] | None = None) -> int:
    folders = (argv if argv is not None else sys.argv[1:]) or ["core", "api", "pages", "ui", "storage"]
    known = modules(folders)
    graph = {name: imported(name, path, known) for name, path in known.items()}
    found = circles(graph)
    for number, circle in enumerate(found, start=1):
        print(f"import circle {number} ({len(circle)} modules): {', '.join(circle)}")
    if found:
        return 1
    print(f"no import circle among {len(known)} modules of {', '.join(folders)} (imports inside functions counted)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

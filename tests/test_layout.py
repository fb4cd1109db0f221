"""The manual's layout tree (docs/contributing.md, "Layout") and the repository stay in step: every module is
listed, every listed path exists. The README stays a landing page."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAPPED = ("core", "storage", "api", "pages", "ui")  # every module of these is named in the tree


def tree_paths() -> set[str]:
    """The paths of the layout tree (the ```text block under "## Layout" in docs/contributing.md), folders ending
    in /."""
    manual = (ROOT / "docs" / "contributing.md").read_text(encoding="utf-8")
    block = re.search(r"^## Layout\n.*?^```text\n(.*?)^```", manual, re.S | re.M).group(1)
    paths, parents = set(), []
    for line in block.splitlines():
        if not line.strip():
            continue
        depth = (len(line) - len(line.lstrip(" "))) // 2
        name = line.split()[0]
        parents = parents[:depth]
        path = "".join(parents) + name
        paths.add(path)
        if name.endswith("/"):
            parents.append(name)
    return paths


def test_every_path_in_the_tree_exists():
    missing = sorted(path for path in tree_paths() if not (ROOT / path.rstrip("/")).exists())
    assert not missing, f"docs/contributing.md's layout names paths that do not exist: {missing}"


def test_every_module_and_top_level_entry_is_in_the_tree():
    listed = tree_paths()
    modules = {str(path.relative_to(ROOT)) for top in MAPPED for path in (ROOT / top).rglob("*.py")
               if path.name != "__init__.py" and "migrations" not in path.parts and "__pycache__" not in path.parts}
    folders = {str(path.relative_to(ROOT)) + "/" for top in MAPPED for path in (ROOT / top).rglob("*")
               if path.is_dir() and "__pycache__" not in path.parts and "versions" not in path.parts}
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    tops = {name.split("/")[0] + ("/" if "/" in name else "") for name in tracked
            if not name.startswith(".") and name.split("/")[0] not in {"data", "requirements-model.txt"}}
    unlisted = sorted((modules | folders | tops) - listed)
    assert not unlisted, f"add these to the layout tree in docs/contributing.md: {unlisted}"


def test_the_readme_is_a_landing_page_whose_links_resolve():
    """About 150 lines in front of the manual (issue 45): a README that grows back into a manual fails here."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) < 200
    targets = re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", readme)
    assert targets, "the README links into the manual"
    missing = sorted(target for target in targets if not (ROOT / target).exists())
    assert not missing, f"the README links to files that do not exist: {missing}"

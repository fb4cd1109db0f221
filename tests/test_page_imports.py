"""The app and its pages start without the model libraries (issue 37, item 6): a page queues work and reads
figures, a worker calls the model. litellm alone took 3 of the 4 seconds `ui.common` needed to import, through
core.models.gateway, which pages reach for types and for its text helpers; the gateway now imports litellm at
its first call (core.models.gateway.providers). Checked on the import graph of a fresh process."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.test_cli_imports import ROOT, python

MODEL_LIBRARIES = ("litellm", "xllamacpp", "scipy", "sympy", "math_verify", "openai")


def top_level_imports(path: Path) -> set[str]:
    """The modules a script imports at its top (what Streamlit runs before the page draws anything)."""
    modules = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules.add(node.module)
        elif isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
    return modules


def test_the_app_and_every_page_import_no_model_library():
    scripts = [ROOT / "streamlit_app.py", *sorted((ROOT / "pages").glob("*.py"))]
    modules = sorted(set().union(*(top_level_imports(path) for path in scripts)))
    assert "ui.common" in modules and "core.records.review.labeling" in modules
    probe = python("import importlib, sys\n" + "".join(f"importlib.import_module({m!r})\n" for m in modules)
                   + f"print([name for name in {MODEL_LIBRARIES!r} if name in sys.modules])")
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.strip() == "[]"


def test_the_gateway_imports_litellm_at_its_first_call_set_up():
    """providers() is where litellm comes in: set up once (the `local/` provider registered), the same module."""
    probe = python("import sys\nimport core.models.gateway as g\nbefore = 'litellm' in sys.modules\n"
                   "litellm = g.providers()\n"
                   "print(before, litellm is g.providers(), litellm.drop_params, "
                   "any(p['provider'] == 'local' for p in litellm.custom_provider_map))")
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.strip() == "False True True True"

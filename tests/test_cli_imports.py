"""The command line answers `--help` and a usage mistake before anything heavy loads (issue 35): its parser
imports no litellm, scipy, sympy, math-verify, Streamlit or llama.cpp, which a command imports when it runs, and
no database code either (SQLAlchemy, SQLModel, the table definitions, Alembic), which a command imports when it
opens the database. A database already at the newest revision opens without Alembic (issue 37): the worker and
the API load it only to migrate. Checked on the import graph of a fresh process, not on the clock."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("litellm", "scipy", "sympy", "math_verify", "streamlit", "xllamacpp")
DATABASE = ("sqlalchemy", "sqlmodel", "storage.tables", "alembic")

# Runs `python -m core ARGS` as __main__ does, then prints on its last stderr line which heavy modules it loaded.
AS_MAIN = f"""
import json, runpy, sys
sys.argv = ["python -m core", *sys.argv[1:]]
try:
    runpy.run_module("core", run_name="__main__", alter_sys=True)
except SystemExit as stop:
    code = stop.code
sys.stderr.write("\\n" + json.dumps({{"code": code, "heavy": [n for n in {HEAVY!r} if n in sys.modules],
                                      "database": [n for n in {DATABASE!r} if n in sys.modules]}}) + "\\n")
"""


def python(code: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`python -c CODE ARGS` in the environment a person starts it from (plus `env`): without the price-map
    variable this test process got when conftest imported core.models."""
    env = {**{name: value for name, value in os.environ.items() if name != "LITELLM_LOCAL_MODEL_COST_MAP"},
           **(env or {})}
    return subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)


def test_building_the_parser_imports_no_heavy_library_and_no_database_code():
    probe = python(f"import sys, core.cli; core.cli.build_parser(); "
                   f"print([n for n in {HEAVY + DATABASE!r} if n in sys.modules])")
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.strip() == "[]"


# Every handler the parser names ("module:function"), and which of their modules are loaded once it is built.
HANDLERS = """
import argparse, json, sys
import core.cli

def handlers(parser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                if "handler" in sub._defaults:
                    yield sub._defaults["handler"]
                yield from handlers(sub)

named = sorted(set(handlers(core.cli.build_parser())))
print(json.dumps({"handlers": named,
                  "loaded": sorted({h.partition(":")[0] for h in named} & set(sys.modules))}))
"""


def test_building_the_parser_imports_no_handler_module():
    """The commands are declared with their handlers' dotted paths (core.cli.commands): a handler's module is
    imported when its command runs, never to build the parser."""
    probe = python(HANDLERS)
    assert probe.returncode == 0, probe.stderr
    found = json.loads(probe.stdout)
    assert len(found["handlers"]) > 40 and found["loaded"] == []


def test_every_declared_handler_is_a_function_of_its_module():
    """A misspelt dotted path would fail only when its command runs: each one is resolved here."""
    from core.cli.commands import load_handler

    probe = python(HANDLERS)
    assert probe.returncode == 0, probe.stderr
    for path in json.loads(probe.stdout)["handlers"]:
        assert callable(load_handler(path)), path


@pytest.mark.parametrize("argv, code, stream, expected", [
    (["--help"], 0, "stdout", "usage: python -m core"),
    (["train", "--epochs", "x"], 2, "stderr", "error: python -m core train: argument --epochs: invalid int value: 'x'"),
])
def test_help_and_a_usage_mistake_answer_before_anything_heavy_loads(argv, code, stream, expected):
    probe = python(AS_MAIN, *argv)
    *output, verdict = probe.stderr.rstrip("\n").split("\n")
    assert json.loads(verdict) == {"code": code, "heavy": [], "database": []}, probe.stderr
    assert expected in (probe.stdout if stream == "stdout" else "\n".join(output))


def test_a_worker_on_a_database_at_the_newest_revision_starts_without_alembic(database_url):
    """`worker --once` on an empty queue opens the database, finds nothing and exits: Alembic (about 0.2 s of
    imports) loads only when a database needs migrating."""
    probe = python(AS_MAIN, "--db", database_url, "worker", "--once")
    *_, verdict = probe.stderr.rstrip("\n").split("\n")
    assert json.loads(verdict) == {"code": 0, "heavy": [], "database": ["sqlalchemy", "sqlmodel", "storage.tables"]}, \
        probe.stderr


API_START = f"""
import sys
from core.settings import engine
from api.app import create_app
create_app(engine)
engine()
print([n for n in ("alembic", "numpy", *{HEAVY!r}) if n in sys.modules])
"""


def test_the_api_on_a_database_at_the_newest_revision_starts_without_alembic_or_numpy(database_url):
    """What `python -m api` does before it serves: build the app and open the database; without Alembic, and
    without numpy, which only a paired comparison uses (core.records.evaluation.comparison, reached through promotion)."""
    probe = python(API_START, env={"DATABASE_URL": database_url})
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.strip() == "[]"


# Records LITELLM_LOCAL_MODEL_COST_MAP each time litellm itself is looked up, so an import that comes first
# from outside core.models (which sets it) would show up as None.
COST_MAP_AT_IMPORT = """
import os, sys
seen = []
class Watch:
    def find_spec(self, name, path=None, target=None):
        if name == "litellm":
            seen.append(os.environ.get("LITELLM_LOCAL_MODEL_COST_MAP"))
sys.meta_path.insert(0, Watch())
from core.records.models.connections import check_connection
check_connection("my-openai", "litellm", None, "openai", None, None)
print(seen)
"""


def test_litellm_loads_its_bundled_price_map_when_a_record_module_imports_it_first():
    """core.records.models.connections is the one module outside core.models that uses litellm: imported first, it
    must still leave litellm to read the price map it ships with instead of fetching one."""
    probe = python(COST_MAP_AT_IMPORT)
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.strip() == "['True']"


# What a run on an OpenAI-compatible server asks before and during its calls: the model checked, its price read.
OWN_PATH_MODEL = """
import sys
from core.models.model_choice import check_model
from core.models.prices import price_per_token
check_model("openai/served-here", api_base="http://127.0.0.1:9/v1")
print(price_per_token("openai/served-here"), price_per_token("openai/gpt-4o-mini") is not None,
      "litellm" in sys.modules)
"""


def test_a_model_on_an_openai_compatible_server_is_checked_and_priced_without_importing_litellm():
    """Checking such a model's name and pricing its calls read litellm's provider names and its bundled price
    file without importing it: the import took 2-5 s of a command-line run's first call (bench/README.md,
    the paper-scale run), and those calls go through core/models/openai_http.py."""
    probe = python(OWN_PATH_MODEL)
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.strip() == "None True False"
